//! dedup: exactly-once effects over at-least-once delivery.
//!
//! This file only wires modules together: each concern lives in the file named after it.
use pgrx::prelude::*;

mod batch;
mod citus;
mod claim;
mod compat;
mod error;
mod guc;
mod lease;
mod prune;
mod stats;
mod worker;

::pgrx::pg_module_magic!(name, version);

// The managed table and its privileges; runs before any function is created.
extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
// 0.2.0: per-scope retention and the record of prune passes.
extension_sql_file!(
    "../sql/retention.sql",
    name = "retention",
    requires = ["bootstrap"]
);

// 0.5.0: hardening (issue 11): leases done from their completion, prune_status.overdue,
// YD001 for every caller. Runs after every earlier version's objects exist.
extension_sql_file!(
    "../sql/hardening.sql",
    name = "hardening",
    requires = ["stats"]
);

// 0.6.0: Citus (issue 13): dedup.distribute(), dedup.cluster_stats(), claim_result through
// dedup._claim_result.
extension_sql_file!(
    "../sql/citus.sql",
    name = "citus",
    requires = [
        "hardening",
        "leases",
        lease::claim_result_row,
        citus::distributed
    ]
);

// 0.6.0: operating retention (issue 15): the duplicate ages and waits in dedup.stats,
// dedup.table_health(), dedup.forget() and its audit table.
extension_sql_file!(
    "../sql/operations.sql",
    name = "operations",
    requires = ["citus", "stats", prune::caller, stats::count_event_at]
);

// 0.6.0: offsets per partition (issue 14): dedup.offsets, dedup.advance, dedup.position.
extension_sql_file!(
    "../sql/offsets.sql",
    name = "offsets",
    requires = [
        "operations",
        batch::check_offset,
        batch::try_claim_many_fingerprint
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
