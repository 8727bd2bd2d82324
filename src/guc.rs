//! Settings (GUCs). Every name starts with `dedup.`, and the prefix is reserved, so a
//! misspelt `SET dedup.warn_outside_transation` is an error instead of a silent no-op.
use crate::error;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::CString;

/// `dedup.warn_outside_transaction`: warn when `try_claim` runs outside a transaction block.
pub static WARN_OUTSIDE_TRANSACTION: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `dedup.retention`, seconds: how long a claim is kept, unless its scope has its own.
pub static RETENTION: GucSetting<i32> = GucSetting::<i32>::new(7 * 24 * 3600);

/// `dedup.prune_interval`, seconds: how often the background worker prunes; 0 turns it off.
pub static PRUNE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(600);

/// `dedup.prune_batch_size`: claims deleted per batch (one transaction in the worker).
pub static PRUNE_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(5000);

/// `dedup.prune_batch_delay`, milliseconds: the worker's pause after a batch that deleted
/// claims, so a long prune leaves the claims that run beside it most of the machine.
pub static PRUNE_BATCH_DELAY: GucSetting<i32> = GucSetting::<i32>::new(20);

/// `dedup.lease_duration`, seconds: how long `dedup.lease` holds a job unless told otherwise.
pub static LEASE_DURATION: GucSetting<i32> = GucSetting::<i32>::new(30);

/// `dedup.stats_max`: entries of the shared counter table (database, scope, consumer).
pub static STATS_MAX: GucSetting<i32> = GucSetting::<i32>::new(5000);

/// `dedup.track_stats`: count claims, duplicates and busy calls.
pub static TRACK_STATS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `dedup.consumer`: the consumer the counters are kept for; empty: application_name.
pub static CONSUMER: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));

/// `dedup.prune_role`: the role the worker prunes as; empty means the bootstrap superuser.
pub static PRUNE_ROLE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));

/// A retention shorter than a minute defeats deduplication: a redelivered copy arrives after
/// its claim is gone. Setting one gets a WARNING.
pub const SHORTEST_SENSIBLE_RETENTION_SECS: i32 = 60;

/// The shortest retention that does not defeat deduplication, as far as dedup can know:
/// a minute, or the configured lease duration if longer (a job can be redelivered once its
/// lease expires). Returns the seconds and what they are.
pub fn shortest_sensible_retention() -> (i32, &'static str) {
    let lease = LEASE_DURATION.get();
    if lease > SHORTEST_SENSIBLE_RETENTION_SECS {
        (lease, "dedup.lease_duration")
    } else {
        (SHORTEST_SENSIBLE_RETENTION_SECS, "a minute")
    }
}

pub fn init() {
    GucRegistry::define_bool_guc(
        c"dedup.warn_outside_transaction",
        c"Warn when dedup.try_claim is called outside a transaction block.",
        c"Outside BEGIN ... COMMIT the claim commits by itself, before the effect runs: a crash \
          between the two loses the job (at-most-once). Turn this off only where the claim and \
          the effect are one statement.",
        &WARN_OUTSIDE_TRANSACTION,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: the check hook is a #[pg_guard] function with the signature PostgreSQL expects.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"dedup.retention",
            c"How long claims are kept before pruning deletes them, unless their scope has its own retention.",
            c"Must be longer than the latest a duplicate can arrive: producer retries, redelivery \
              after the visibility or claim timeout, replays from stream history or a dead-letter \
              queue. Per-scope values: dedup.set_retention().",
            &RETENTION,
            1,
            i32::MAX,
            GucContext::Suset,
            GucFlags::UNIT_S,
            Some(check_retention),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"dedup.prune_interval",
        c"How often the background worker prunes every database with dedup installed (0: never).",
        c"Each pass reads the claim table of every database once. Needs \
          shared_preload_libraries = 'dedup'.",
        &PRUNE_INTERVAL,
        0,
        7 * 24 * 3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"dedup.prune_batch_size",
        c"Claims deleted per batch by pruning.",
        c"The background worker commits each batch; a claim waiting for a row being pruned \
          waits at most one batch.",
        &PRUNE_BATCH_SIZE,
        100,
        1_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"dedup.prune_batch_delay",
        c"The background worker's pause after each batch that deleted claims.",
        c"As autovacuum_vacuum_cost_delay does for VACUUM: a long prune then takes longer \
          but leaves concurrent claims most of the CPU and WAL bandwidth. 0: no pause.",
        &PRUNE_BATCH_DELAY,
        0,
        10_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"dedup.lease_duration",
        c"How long dedup.lease holds a job when no duration is passed.",
        c"Longer than the external effect takes, or the holder extends it (dedup.extend_lease); \
          a retention shorter than this gets a WARNING.",
        &LEASE_DURATION,
        1,
        7 * 24 * 3600,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    // A postmaster setting can only be defined while the server starts: only when preloaded.
    if unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        define_stats_max();
    }
    GucRegistry::define_bool_guc(
        c"dedup.track_stats",
        c"Count claims, duplicates and busy calls in dedup.stats.",
        c"Needs shared_preload_libraries = 'dedup'.",
        &TRACK_STATS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"dedup.consumer",
        c"The consumer name dedup.stats counts this session's claims under (empty: application_name).",
        c"Set it where application_name is shared by many consumers, e.g. behind a pooler.",
        &CONSUMER,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"dedup.prune_role",
        c"Role the background worker prunes as (empty: the bootstrap superuser).",
        c"The role needs to be able to delete from dedup.processed in every database.",
        &PRUNE_ROLE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    reserve_prefix();
}

fn define_stats_max() {
    GucRegistry::define_int_guc(
        c"dedup.stats_max",
        c"Database, scope and consumer combinations dedup.stats keeps counters for.",
        c"The least recently used one is evicted when the table is full (dedup.stats_info \
          counts evictions). Needs shared_preload_libraries = 'dedup'.",
        &STATS_MAX,
        100,
        1_000_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

/// The worker's role, if one is set.
pub fn prune_role() -> Option<String> {
    PRUNE_ROLE
        .get()
        .and_then(|r| r.into_string().ok())
        .filter(|r| !r.is_empty())
}

/// Warn when a retention under a minute is set by a user (SET, ALTER DATABASE/ROLE ... SET,
/// ALTER SYSTEM) or read from the configuration file by the postmaster; not again in every
/// backend that applies the same value.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_retention(
    newval: *mut i32,
    _extra: *mut *mut std::ffi::c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    let interactive = source >= pg_sys::GucSource::PGC_S_INTERACTIVE;
    let config_file = source == pg_sys::GucSource::PGC_S_FILE && !pg_sys::IsUnderPostmaster;
    let (shortest, what) = shortest_sensible_retention();
    if *newval < shortest && (interactive || config_file) {
        error::warn_short_retention("dedup.retention", i64::from(*newval), shortest, what);
    }
    true
}

#[cfg(any(feature = "pg13", feature = "pg14"))]
fn reserve_prefix() {
    // MarkGUCPrefixReserved arrived in PostgreSQL 15.
    unsafe { pg_sys::EmitWarningsOnPlaceholders(c"dedup".as_ptr()) }
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
fn reserve_prefix() {
    unsafe { pg_sys::MarkGUCPrefixReserved(c"dedup".as_ptr()) }
}
