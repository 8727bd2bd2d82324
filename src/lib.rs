//! dedup: exactly-once effects over at-least-once delivery.
//!
//! This file only wires modules together: each concern lives in the file named after it.
use pgrx::prelude::*;

mod batch;
mod citus;
mod claim;
mod compat;
mod error;
mod expired;
mod generations;
mod guc;
mod lease;
mod prune;
mod stats;
mod worker;

::pgrx::pg_module_magic!(name, version);

// The SQL files of sql/, one per concern, each object's current definition once, in the
// order CREATE EXTENSION runs them (each requires the one before it, and the functions of
// src/ its statements name). upgrade::a_fresh_install_creates_each_object_once holds this.

// The schema's check and the claim table; runs before any function is created.
extension_sql_file!("../sql/claims.sql", name = "claims", bootstrap);
// Per-scope retention, prune passes and horizons, table_health, forget. It needs no
// function of src/, so its tables come before them: the portable edition's helpers, made
// before the first function of src/ it replaces, include SQL that reads
// dedup.scope_retention (the plain install of scripts/portable-test.sh fails otherwise).
extension_sql_file!(
    "../sql/retention.sql",
    name = "retention",
    requires = ["claims"]
);
// Leases, stored results, payload fingerprints.
extension_sql_file!(
    "../sql/leases.sql",
    name = "leases",
    requires = [
        "retention",
        claim::try_claim_fingerprint,
        lease::check_claim,
        lease::lease_tables,
        lease::write_lease,
        lease::set_result,
        lease::claim_result_row,
        prune::settings::retention
    ]
);
// The view dedup.stats over the library's counters.
extension_sql_file!(
    "../sql/stats.sql",
    name = "stats",
    requires = [
        "leases",
        stats::sql::stats_counters,
        stats::sql::stats_info,
        stats::sql::stats_reset,
        expired::expired_summaries,
        stats::sql::count_event,
        stats::sql::count_event_at
    ]
);
// dedup.distribute() and dedup.cluster_stats().
extension_sql_file!(
    "../sql/citus.sql",
    name = "citus",
    requires = ["stats", citus::distributed]
);
// Offsets per partition, and try_claim_many with fingerprints.
extension_sql_file!(
    "../sql/offsets.sql",
    name = "offsets",
    requires = [
        "citus",
        batch::check_offset,
        batch::try_claim_many_fingerprint
    ]
);

// Generations (issue 26, slice 1): the catalog dedup.generations, dedup.claims(), and the
// privileges and comments of the library's use_generations and rotate_generations.
extension_sql_file!(
    "../sql/generations.sql",
    name = "generations",
    requires = [
        "offsets",
        generations::rotate::use_generations,
        generations::rotate::rotate_generations,
        generations::rotate::rotate_step,
        generations::summary::generation_summaries,
        generations::epoch::_generations_changed,
        lease::claim_tables_sql
    ]
);

/// Called once per backend when the library is loaded (at the first call of one of
/// our functions, or at server start with `shared_preload_libraries`).
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // pg_upgrade loads libraries to check them; nothing of ours must run then.
    // SAFETY: a plain read of the backend-global `bool IsBinaryUpgrade` (globals.c), set at
    // process start from the command line and never changed after; no call, no ERROR. This
    // runs on the backend's (or postmaster's) only thread, inside this #[pg_guard] function.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        return;
    }
    guc::init();
    // SAFETY: a plain read of the global `bool process_shared_preload_libraries_in_progress`
    // (miscinit.c), true only while the postmaster loads shared_preload_libraries; no call,
    // no ERROR, on the process's only thread.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        worker::register_launcher();
        stats::request_shared_memory();
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
