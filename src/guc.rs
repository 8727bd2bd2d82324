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

/// `dedup.prune_lock_timeout`, milliseconds: the worker's `lock_timeout`, so no lock held
/// in one database keeps its pass, or the passes of the other databases, waiting long.
pub static PRUNE_LOCK_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// `dedup.lease_duration`, seconds: how long `dedup.lease` holds a job unless told otherwise.
pub static LEASE_DURATION: GucSetting<i32> = GucSetting::<i32>::new(30);

/// `dedup.stats_max`: entries of the shared counter table (database, scope, consumer).
pub static STATS_MAX: GucSetting<i32> = GucSetting::<i32>::new(5000);

/// `dedup.expired_memory`, kB: the shared memory of the summaries of pruned claims (0: none).
pub static EXPIRED_MEMORY: GucSetting<i32> = GucSetting::<i32>::new(8 * 1024);

/// `dedup.generation_memory`, kB: the shared memory of the summaries of sealed generations
/// (0: none).
pub static GENERATION_MEMORY: GucSetting<i32> = GucSetting::<i32>::new(32 * 1024);

/// `dedup.summaries_as_claimed`: fill each new generation's summary as its claims go in,
/// instead of reading the generation for it at its seal.
pub static SUMMARIES_AS_CLAIMED: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `dedup.expired_lookback`, seconds: how long a pruned claim is remembered at least; -1:
/// the longest retention in force in the database pruned last.
pub static EXPIRED_LOOKBACK: GucSetting<i32> = GucSetting::<i32>::new(-1);

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

/// Long because it is a table: one registration per setting, each with its bounds, units
/// and check.
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
    // (define_int_guc_with_hooks is unsafe only for that: a hook must not let a panic or a
    // longjmp cross its C frame.) DefineCustomIntVariable copies the name (guc_strdup) and
    // keeps pointers to the 'static descriptions and to RETENTION's 'static storage; its
    // ERRORs (out of memory, a name already defined) reach the #[pg_guard] of _PG_init,
    // our caller.
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
            // Superusers set it; check_retention keeps it to the server and database levels.
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
        c"dedup.prune_lock_timeout",
        c"The longest the background worker waits for a lock while it prunes a database.",
        c"The worker's lock_timeout. A pass that waits longer fails, is retried after a \
          back-off, and the other databases are pruned meanwhile. Rows locked by open \
          transactions are skipped, never waited for.",
        &PRUNE_LOCK_TIMEOUT,
        100,
        3_600_000,
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
    GucRegistry::define_bool_guc(
        c"dedup.summaries_as_claimed",
        c"Fill each new generation's summary as its claims go in, instead of reading the generation for it at its seal.",
        c"The filter is opened when the generation is published, sized for twice the claims of \
          the generation before, and folded down at the seal; one never opened (no room), lost \
          (a restart) or too full is replaced by reading the generation, as with off. \
          Applies to generations published after it changes. Needs \
          shared_preload_libraries = 'dedup'.",
        &SUMMARIES_AS_CLAIMED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // A postmaster setting can only be defined while the server starts: only when preloaded.
    // SAFETY: a plain read of the global `bool process_shared_preload_libraries_in_progress`
    // (miscinit.c); no call, no ERROR, on the process's only thread (from _PG_init).
    if unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        define_stats_max();
        define_expired_memory();
        define_generation_memory();
    }
    GucRegistry::define_int_guc(
        c"dedup.expired_lookback",
        c"How long the summaries remember a pruned claim, at least (-1: the longest retention in force; 0: not at all).",
        c"A claim that returns true for a job whose claim was pruned within this time is counted \
          in dedup.stats as an expired duplicate. A key is remembered at most a seventh more. \
          -1: the longest retention (dedup.retention or a scope's own) of the database pruned \
          last. Needs shared_preload_libraries = 'dedup'.",
        &EXPIRED_LOOKBACK,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
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
        c"A superuser, or a role with LOGIN holding, in every database with dedup, SELECT, UPDATE \
          and DELETE on dedup.processed, SELECT, INSERT and UPDATE on dedup._prune_status, and SELECT and DELETE on dedup.forgotten \
          (and the grants of docs/retention.md: the horizons' and, with generations, EXECUTE on dedup._rotate(text)).",
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
        c"One entry is the overflow row: when the table is full, new combinations are counted \
          there (scope '(overflow)'), and nothing is evicted. Needs \
          shared_preload_libraries = 'dedup'.",
        &STATS_MAX,
        100,
        1_000_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

fn define_generation_memory() {
    GucRegistry::define_int_guc(
        c"dedup.generation_memory",
        c"Shared memory for the summaries of sealed generations, which spare a new claim the index probe of each sealed generation (0: off).",
        c"A Bloom filter of 16 bits per claim (a false-positive rate of about 0.1%) for each \
          sealed generation of a database that uses generations, or an even share of the memory \
          down to 6 bits (about 9%). Size it at 2 bytes per claim of the largest sealed generation \
          times the summaries, at least four. A generation \
          that does not fit is probed in its index. Needs shared_preload_libraries = 'dedup'.",
        &GENERATION_MEMORY,
        0,
        1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
}

fn define_expired_memory() {
    GucRegistry::define_int_guc(
        c"dedup.expired_memory",
        c"Shared memory for the summaries of pruned claims, which count copies that ran again after their claim expired (0: off).",
        c"Eight Bloom filters; each takes about 16 bits per pruned claim before it stops taking \
          more (at a false-positive rate of 0.1% each). Size it at 2.3 bytes per claim pruned in \
          dedup.expired_lookback. Needs shared_preload_libraries = 'dedup'.",
        &EXPIRED_MEMORY,
        0,
        1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
}

/// The worker's role, if one is set.
pub fn prune_role() -> Option<String> {
    PRUNE_ROLE
        .get()
        .and_then(|r| r.into_string().ok())
        .filter(|r| !r.is_empty())
}

/// Keep `dedup.retention` to the levels every session and the worker see alike: the server
/// (postgresql.conf, ALTER SYSTEM, the command line) and a database (ALTER DATABASE ...
/// SET). A role's setting (ALTER ROLE ... SET), a client's startup option and a session's
/// SET or set_config() are refused: the worker, connected as another role, would prune by
/// another retention than the one that session reports
/// (retention::retention_is_the_same_in_every_session). ALTER ROLE cannot be told from
/// ALTER DATABASE when the value is checked (PGC_S_TEST), so a role's setting is refused
/// when a session of that role applies it: a WARNING, and the server or database value
/// stays.
///
/// Also warns when a retention under a minute is set (ALTER DATABASE ... SET, ALTER
/// SYSTEM) or read from the configuration file by the postmaster; not again in every
/// backend that applies the same value.
///
/// # Safety
///
/// Called only by guc.c, as the check hook of `dedup.retention`: `newval` points to the
/// candidate value guc.c owns for the duration of the call; `_extra` is unused. The
/// #[pg_guard] wrapper turns a Rust panic, or an ERROR caught at a pg_sys call inside
/// (pstrdup out of memory), into a PostgreSQL ERROR raised from this frame, never an unwind
/// into guc.c.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_retention(
    newval: *mut i32,
    _extra: *mut *mut std::ffi::c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    use pg_sys::GucSource::*;
    if matches!(
        source,
        PGC_S_USER | PGC_S_DATABASE_USER | PGC_S_CLIENT | PGC_S_SESSION
    ) {
        // SAFETY: GUC_check_errcode only stores the code. The strings are palloc'd in the
        // current memory context: guc.c reads GUC_check_errdetail_string and
        // GUC_check_errhint_string only in the ereport it makes right after this hook
        // returns false (and resets them before the next hook call), and
        // CurrentMemoryContext outlives that ereport. (guc.c's own GUC_check_errdetail()
        // allocates in ErrorContext; any context alive until then does.) pstrdup copies our
        // 'static C strings; its only ERROR, out of memory, is turned into a PostgreSQL
        // ERROR by this function's #[pg_guard].
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE as i32);
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(
            c"dedup.retention is set for the server (postgresql.conf, ALTER SYSTEM) or for a database (ALTER DATABASE ... SET), not for a role or a session: the background worker prunes by the value of the server and the database."
                .as_ptr(),
        );
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(
            c"For a longer or shorter retention of some jobs, give their scope its own: SELECT dedup.set_retention(scope, interval)."
                .as_ptr(),
        );
        return false;
    }
    let interactive = source >= pg_sys::GucSource::PGC_S_INTERACTIVE;
    // SAFETY (this line and the `*newval` reads below): IsUnderPostmaster is a plain global
    // read; `newval` is guc.c's valid, aligned int for the duration of this call.
    let config_file = source == pg_sys::GucSource::PGC_S_FILE && !pg_sys::IsUnderPostmaster;
    let (shortest, what) = shortest_sensible_retention();
    if *newval < shortest && (interactive || config_file) {
        error::warn_short_retention("dedup.retention", i64::from(*newval), shortest, what);
    }
    true
}

fn reserve_prefix() {
    // SAFETY: MarkGUCPrefixReserved (guc.c) removes placeholders named dedup.* with a
    // WARNING each and appends a pstrdup of the 'static, NUL-terminated name to
    // reserved_class_prefix in TopMemoryContext, so nothing keeps our pointer. Its only ERROR
    // is out of memory, turned into a PostgreSQL ERROR by the #[pg_guard] of _PG_init (our
    // caller through init()).
    unsafe { pg_sys::MarkGUCPrefixReserved(c"dedup".as_ptr()) }
}
