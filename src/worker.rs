//! The background worker that prunes every database where dedup is installed.
//!
//! A launcher (registered at server start through `shared_preload_libraries = 'dedup'`,
//! started once the server accepts writes, so never on a standby and right after a
//! promotion) wakes every `dedup.prune_interval`, lists the databases that accept
//! connections, forgets the counters of dropped databases, and for each database starts a
//! short-lived worker connected to it, one at a time. That worker pins its settings, checks
//! for the extension without SQL (and leaves quietly without it), takes the prune lock
//! (and leaves if a prune already runs there), and sweeps the claim table in batches, each
//! its own transaction, stopping between batches on SIGTERM or when a role that may is
//! dropping, renaming or copying the database. Without a free background worker slot the
//! launcher tries the same database again after a growing wait, and begins its next cycle
//! with the databases it did not reach.
use crate::{guc, prune, stats};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, DynamicBackgroundWorker,
    SignalWakeFlags,
};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

const LAUNCHER: &str = "dedup launcher";
const PRUNER: &str = "dedup prune";

/// Register the launcher (from `_PG_init`, while `shared_preload_libraries` loads).
pub fn register_launcher() {
    BackgroundWorkerBuilder::new(LAUNCHER)
        .set_type(LAUNCHER)
        .set_library("dedup")
        .set_function("dedup_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // Restarted 10 s after it exits with an error or crashes.
        .set_restart_time(Some(Duration::from_secs(10)))
        .load();
}

fn shutdown_requested() -> bool {
    // SAFETY: a volatile read of the global `volatile sig_atomic_t ShutdownRequestPending`,
    // which the SIGTERM handler pgrx installs (attach_signal_handlers) sets; its address is
    // taken without a reference. No call, no ERROR; on the worker's only thread.
    unsafe { std::ptr::read_volatile(std::ptr::addr_of!(pg_sys::ShutdownRequestPending)) != 0 }
}

fn set_application_name(name: &str) {
    let name = std::ffi::CString::new(name).expect("no NUL in a worker name");
    // SAFETY: called from the launcher's and the worker's #[pg_guard] main functions, after
    // connecting, on their only thread. SetConfigOption reads the name for its lookup and
    // copies the value (guc_strdup, then application_name's check hook); an ERROR (out of
    // memory) unwinds to that #[pg_guard], which ends the process. pgstat_report_appname
    // copies at most NAMEDATALEN - 1 bytes of the NUL-terminated name into this process's
    // shared PgBackendStatus entry and raises no ERROR. `name` outlives both calls.
    unsafe {
        pg_sys::SetConfigOption(
            c"application_name".as_ptr(),
            name.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
        pg_sys::pgstat_report_appname(name.as_ptr());
    }
}

/// Reload the configuration file after a SIGHUP; whether it did.
fn reload_config_if_asked() -> bool {
    let asked = BackgroundWorker::sighup_received();
    if asked {
        // SAFETY: the main loop of the launcher, or between a worker's batches, outside any
        // transaction, as PostgreSQL's own processes reload: ProcessConfigFile works in a
        // memory context of its own and
        // reports bad settings below ERROR (DEBUG2 in a child; the postmaster LOGs them);
        // other ERRORs (out of memory) unwind to the #[pg_guard] main of the process, which
        // ends it (the postmaster restarts the launcher).
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    asked
}

fn interval() -> Option<Duration> {
    match guc::PRUNE_INTERVAL.get() {
        0 => None,
        s => Some(Duration::from_secs(s as u64)),
    }
}

/// Databases the launcher visits: those that accept connections, not templates, not
/// invalid (a DROP DATABASE interrupted half-way).
fn databases() -> Vec<(pg_sys::Oid, String)> {
    let mut found = Vec::new();
    // SAFETY: called only through prune::in_transaction: inside a transaction, under its
    // PgTry, which catches the ERRORs of table_open (lock wait), the scan (I/O) and out of
    // memory, then aborts the transaction (releasing the lock, the relcache reference, the
    // scan's buffer pin and snapshot). `rel` is pg_database, open with AccessShareLock
    // until table_close. table_beginscan_catalog registers the catalog snapshot for the
    // scan (unregistered by table_endscan). Each tuple heap_getnext returns points into
    // a buffer the scan keeps pinned until the next heap_getnext: its fixed-size part
    // (FormData_pg_database, at t_hoff, as GETSTRUCT computes it) is read, and the name
    // (a NUL-terminated NameData) copied into a String, before the next call.
    unsafe {
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as _);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let header = (*tuple).t_data;
            let form = header
                .cast::<u8>()
                .add((*header).t_hoff as usize)
                .cast::<pg_sys::FormData_pg_database>();
            if !(*form).datallowconn || (*form).datistemplate || (*form).datconnlimit == -2 {
                continue;
            }
            let name = std::ffi::CStr::from_ptr((*form).datname.data.as_ptr())
                .to_string_lossy()
                .into_owned();
            found.push(((*form).oid, name));
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
    }
    found
}

/// The launcher's main loop.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn dedup_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher only reads pg_database, a shared catalog.
    BackgroundWorker::connect_worker_to_spi(None, None);
    set_application_name(LAUNCHER);
    log!(
        "dedup launcher started: prune interval {} s",
        guc::PRUNE_INTERVAL.get()
    );

    // Failures to list the databases in a row; slot shortages are in `starts`.
    let mut listing_failures = 0u32;
    let mut starts = Starts::default();
    loop {
        let _ = reload_config_if_asked();
        let started = Instant::now();
        let mut wait = match interval() {
            // Turned off: look again at the next reload, or in a minute.
            None => Duration::from_secs(60),
            Some(interval) => {
                forget_dropped_databases();
                match prune::in_transaction(databases) {
                    Ok(dbs) => {
                        listing_failures = 0;
                        if !starts.visit(dbs, started + interval, interval) {
                            break;
                        }
                    }
                    Err(message) => {
                        listing_failures += 1;
                        warning!("dedup launcher: listing databases failed: {message}");
                    }
                }
                interval
            }
        };
        // A reload during the cycle (the waits for its workers reset the latch SIGHUP set):
        // a shorter interval counts from the cycle's start, not after the old one.
        let _ = reload_config_if_asked();
        if let Some(now) = interval() {
            wait = wait.min(now);
        }
        // Back off after failures to list them: two intervals, four, ... at most 64.
        if listing_failures > 0 {
            wait *= 1 << listing_failures.min(6);
        }
        wait = wait.saturating_sub(started.elapsed());
        if !BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(10)))) {
            break;
        }
    }
    log!("dedup launcher stopped");
}

/// Drop the counters of databases that no longer exist: the counter table evicts nothing,
/// so these would otherwise hold their entries until dedup.stats_reset().
fn forget_dropped_databases() {
    let mut counted = stats::counted_databases();
    counted.extend(crate::expired::databases());
    counted.extend(crate::generations::epoch::databases());
    counted.extend(crate::generations::summary::databases());
    counted.sort_unstable_by_key(|db| u32::from(*db));
    counted.dedup();
    if counted.is_empty() {
        return;
    }
    let gone = prune::in_transaction(|| {
        counted
            .iter()
            .copied()
            // SAFETY: inside a transaction (in_transaction, whose PgTry catches the
            // syscache lookup's ERRORs); get_database_name returns NULL for a database
            // that does not exist, else a palloc'd name we only test for NULL.
            .filter(|db| unsafe { pg_sys::get_database_name(*db).is_null() })
            .collect::<Vec<_>>()
    });
    match gone {
        Ok(gone) => {
            let n = stats::forget_databases(&gone);
            let lists = crate::expired::forget_databases(&gone);
            crate::generations::summary::forget_databases(&gone);
            for db in &gone {
                crate::generations::epoch::forget_database(*db);
            }
            if lists > 0 {
                debug1!("dedup launcher: forgot the pruned claims of dropped databases in {lists} summaries");
            }
            if n > 0 {
                debug1!("dedup launcher: forgot {n} counter entries of dropped databases");
            }
        }
        Err(message) => {
            warning!("dedup launcher: checking for dropped databases failed: {message}")
        }
    }
}

/// The first wait before the launcher tries again to start a worker when no background
/// worker slot was free, and the longest (at most the interval): the wait doubles with each
/// try that fails.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_LONGEST: Duration = Duration::from_secs(10);

/// What the launcher keeps across its cycles about starting workers. Parallel queries and
/// other extensions' workers take background worker slots too; when none was free the
/// launcher used to give up the whole cycle, every database after that one included, warn,
/// and try again two intervals later, its back-off starting over with every cycle. What is
/// kept here lets the next try go on instead
/// (worker::full_worker_slots_hold_up_pruning_only_while_full).
struct Starts {
    /// Since when and how many tries no slot has been free; None while workers start.
    failing: Option<(Instant, u64)>,
    /// The wait before the next try: doubled by each try that fails, in whichever cycle,
    /// and back to RETRY_FIRST only when a worker starts.
    retry: Duration,
    /// The databases a cycle did not reach for want of a slot: the next one begins with them.
    not_reached: Vec<pg_sys::Oid>,
}

impl Default for Starts {
    fn default() -> Self {
        Starts {
            failing: None,
            retry: RETRY_FIRST,
            not_reached: Vec::new(),
        }
    }
}

impl Starts {
    /// Prune each database in turn, one worker at a time, beginning with those the last
    /// cycle did not reach. Without a free slot, try the same database again after
    /// `self.retry`, until that would pass `deadline` (when the next cycle is due); the
    /// databases left are then the next cycle's first. A slot is a server-wide resource, so
    /// the next database would find none either. Every try is followed by a wait on the
    /// latch of at least RETRY_FIRST, or by the end of the cycle. False when the launcher
    /// must stop (SIGTERM, or the postmaster died).
    fn visit(
        &mut self,
        mut dbs: Vec<(pg_sys::Oid, String)>,
        deadline: Instant,
        interval: Duration,
    ) -> bool {
        let first = std::mem::take(&mut self.not_reached);
        // A stable sort: those not reached, in their order, then the others in catalog order.
        dbs.sort_by_key(|(oid, _)| first.iter().position(|f| f == oid).unwrap_or(usize::MAX));
        let longest = RETRY_LONGEST.min(interval);
        // A database whose visit used its whole share (it was cut short, most likely) is
        // visited again after the others, round after round until the next cycle is due:
        // the share keeps one database from holding up the others, not from being pruned.
        let mut round = dbs;
        loop {
            let mut again = Vec::new();
            for (i, (oid, name)) in round.iter().enumerate() {
                let handle = loop {
                    if shutdown_requested() {
                        return false;
                    }
                    if let Some(handle) = start_worker(*oid, name) {
                        break handle;
                    }
                    self.failed(name, longest);
                    let wait = self.retry.min(longest);
                    self.retry = (wait * 2).min(longest);
                    let at = Instant::now() + wait;
                    if at >= deadline {
                        self.not_reached = round[i..].iter().map(|(oid, _)| *oid).collect();
                        return true;
                    }
                    if !sleep_until(at) {
                        return false;
                    }
                    // The file's settings (dedup.prune_role, say) for the next try.
                    let _ = reload_config_if_asked();
                };
                self.started();
                let began = Instant::now();
                if let Err(status) = handle.wait_for_shutdown() {
                    warning!(
                        "dedup launcher: waiting for the worker of database \"{name}\": {status:?}"
                    );
                    return false;
                }
                if began.elapsed() >= share(interval) {
                    again.push((*oid, name.clone()));
                }
            }
            if again.is_empty() || Instant::now() >= deadline || shutdown_requested() {
                return !shutdown_requested();
            }
            round = again;
        }
    }

    /// A try found no free slot: one WARNING when that begins, none for the tries after it.
    fn failed(&mut self, name: &str, longest: Duration) {
        if let Some((_, tries)) = &mut self.failing {
            *tries += 1;
            return;
        }
        self.failing = Some((Instant::now(), 1));
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "dedup launcher: could not start a worker to prune database \"{name}\": \
                 no background worker slot is free"
            ),
            "dedup",
        )
        .set_detail(format!(
            "No database is pruned until one is. The launcher tries again after waits that \
             double from {} ms up to {} s, without another warning, and logs when a worker \
             starts again.",
            RETRY_FIRST.as_millis(),
            longest.as_secs()
        ))
        .set_hint(
            "You might need to increase max_worker_processes: dedup needs a slot for its \
             launcher and one while it prunes a database, beside parallel query workers \
             (max_parallel_workers) and the workers of other extensions.",
        )
        .report(PgLogLevel::WARNING);
    }

    /// A worker started: the end of a shortage, if there was one, and the first wait again.
    fn started(&mut self) {
        if let Some((since, tries)) = self.failing.take() {
            log!(
                "dedup launcher: a background worker slot is free again; no worker could start \
                 for {:.1} s ({tries} tries)",
                since.elapsed().as_secs_f64()
            );
        }
        self.retry = RETRY_FIRST;
    }
}

/// A database's share of the worker per visit: one interval, between 1 s and a minute, so
/// that one large or slow database does not hold up the others
/// (worker::a_slow_database_does_not_hold_up_the_others).
fn share(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Wait on the latch until `at`; false on SIGTERM or when the postmaster died.
pub(crate) fn sleep_until(at: Instant) -> bool {
    loop {
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        if !BackgroundWorker::wait_latch(Some(left.max(Duration::from_millis(1))))
            || shutdown_requested()
        {
            return false;
        }
    }
}

/// Register the worker for one database; None when no background worker slot is free.
fn start_worker(oid: pg_sys::Oid, name: &str) -> Option<DynamicBackgroundWorker> {
    BackgroundWorkerBuilder::new(PRUNER)
        .set_type(PRUNER)
        .set_library("dedup")
        .set_function("dedup_prune_worker_main")
        .set_argument(Some(pg_sys::Datum::from(oid)))
        .set_extra(name)
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        // SAFETY: a plain read of the global `int MyProcPid`, set at process start.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
        .ok()
}

/// Pin the settings the worker's SQL depends on, above anything a database or role setting
/// (`ALTER DATABASE/ROLE ... SET`, applied while connecting) gave this session: the worker
/// runs as a superuser in databases that anyone with CREATEDB may own, so no name it uses
/// may resolve to an object such an owner created, whose code would then run as a superuser
/// (security::worker_runs_no_code_a_database_owner_wrote). PGC_S_OVERRIDE outranks every
/// source but an explicit override; nothing here sets one.
///
/// First every setting a database or role setting gave (but dedup's own, which an
/// administrator sets per database) goes back to its built-in value: a database owner's
/// `TimeZone` changed what '1 day' means, and `enable_tidscan = off` made every batch's
/// DELETE a sequential scan (worker::a_database_owners_settings_do_not_change_a_pass);
/// planner switches, memory and formatting settings alike, `transaction_timeout` too (`transaction_isolation`,
/// `transaction_read_only` and `transaction_deferrable` excepted: every transaction starts
/// from the `default_transaction_*` pinned here). The ones the worker's SQL relies on are pinned
/// first, so that the statement reading the others runs under them.
///
/// Long because it is a list: each setting pinned with the reason it must be, in the order
/// the pinning needs.
fn pin_settings() -> Result<(), String> {
    let lock_timeout = format!("{}ms", guc::PRUNE_LOCK_TIMEOUT.get());
    for (name, value) in [
        ("search_path", "pg_catalog, pg_temp"),
        ("default_transaction_isolation", "read committed"),
        ("default_transaction_read_only", "off"),
        ("statement_timeout", "0"),
        ("lock_timeout", lock_timeout.as_str()),
        // Timestamps in UTC, printed and parsed one way (the cutoffs are computed in UTC
        // anyway, for dedup.prune() in a session of any TimeZone).
        ("TimeZone", "UTC"),
        ("DateStyle", "ISO, MDY"),
        ("IntervalStyle", "postgres"),
        // `ALTER DATABASE ... SET role` is an ordinary setting pg_settings does not show:
        // the worker runs as the role it connected as, nobody else.
        ("role", "none"),
    ] {
        set_over_everything(name, value);
    }
    // From 17 on, a transaction_timeout would end the worker in the very transaction that
    // reads the others.
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    set_over_everything("transaction_timeout", "0");
    // And it is that role (a database's session_authorization would have changed it).
    // SAFETY: plain reads of the backend's user ids, set while connecting.
    let (user, session, authenticated) = unsafe {
        (
            pg_sys::GetUserId(),
            pg_sys::GetSessionUserId(),
            pg_sys::GetAuthenticatedUserId(),
        )
    };
    if user != authenticated || session != authenticated {
        return Err("a database or role setting changed the role it runs as \
                    (role or session_authorization)"
            .to_string());
    }
    // Then the others (those pinned above now come from the override, not the database).
    // Read and set in one transaction: a setting's check may look the catalog up.
    prune::in_transaction(|| {
        let settings = Spi::connect(|c| {
            let rows = c.select(
                "SELECT s.name, s.boot_val FROM pg_catalog.pg_settings AS s \
                  WHERE s.source OPERATOR(pg_catalog.=) ANY \
                        (ARRAY['database', 'user', 'database user']::pg_catalog.text[]) \
                    AND s.boot_val IS NOT NULL \
                    AND NOT pg_catalog.starts_with(s.name, 'dedup.') \
                    AND s.name OPERATOR(pg_catalog.<>) ALL (ARRAY['transaction_isolation', \
                        'transaction_read_only', 'transaction_deferrable']::pg_catalog.text[])",
                None,
                &[],
            )?;
            let mut settings = Vec::new();
            for row in rows {
                let name: String = row.get(1)?.unwrap_or_default();
                let boot: String = row.get(2)?.unwrap_or_default();
                settings.push((name, boot));
            }
            Ok::<_, pgrx::spi::Error>(settings)
        })
        .map_err(|e| format!("could not read its settings: {e}"))?;
        for (name, boot) in settings {
            let c_name = std::ffi::CString::new(name.as_str()).expect("no NUL in a setting's name");
            let c_boot = std::ffi::CString::new(boot.as_str()).expect("no NUL in a setting");
            // SAFETY: in a transaction (in_transaction), on the main thread; the strings are
            // copied by the call. At WARNING level a value the setting refuses is reported
            // and 0 returned, not raised; what a check hook raises is caught by
            // in_transaction's PgTry.
            let done = unsafe {
                pg_sys::set_config_option(
                    c_name.as_ptr(),
                    c_boot.as_ptr(),
                    pg_sys::GucContext::PGC_SUSET,
                    pg_sys::GucSource::PGC_S_OVERRIDE,
                    pg_sys::GucAction::GUC_ACTION_SET,
                    true,
                    pg_sys::WARNING as i32,
                    false,
                )
            };
            if done <= 0 {
                return Err(format!(
                    "could not set {name} back to {boot:?}, as a database or role setting gave it"
                ));
            }
        }
        Ok(())
    })
    .and_then(|r| r)?;
    Ok(())
}

/// Set `name` to `value` above every source but an explicit override (none is ever made).
fn set_over_everything(name: &str, value: &str) {
    let name = std::ffi::CString::new(name).expect("no NUL in a setting's name");
    let value = std::ffi::CString::new(value).expect("no NUL in a setting");
    // SAFETY: SetConfigOption looks the name up and copies the value (guc_strdup), so
    // neither string need outlive the call; a value it rejects raises an ERROR, which
    // ends the worker through the #[pg_guard] of its main function (the values are
    // ours and valid).
    unsafe {
        pg_sys::SetConfigOption(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}

/// Is this database being dropped, renamed or copied by a role that may? DROP DATABASE,
/// ALTER DATABASE ... RENAME and ... SET TABLESPACE hold an AccessExclusiveLock on the
/// database object, CREATE DATABASE ... TEMPLATE a ShareLock, while they wait (5 s at most)
/// for its other sessions to leave; a new session's RowExclusiveLock on it conflicts with
/// both. The worker tries that lock between batches, without waiting, so that it can leave
/// before such a command gives up waiting for it (worker::drop_database_during_a_pass).
/// Each of those commands takes the lock before it checks that its role owns the database,
/// so any role's DROP DATABASE, failing with 42501, holds it for a moment; in a loop, that
/// made the worker leave every pass there early. So when the lock is taken the worker leaves only if a session holding it could go on
/// ([`a_holder_may_go_on`]); a role that may not has its command fail whatever the worker
/// does (worker::a_failing_drop_database_does_not_stop_pruning).
pub(crate) fn database_is_being_dropped() -> bool {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: 0, // a shared object: no database
        locktag_field2: pg_sys::DatabaseRelationId.into(),
        // SAFETY: set once the worker is connected.
        locktag_field3: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field4: 0,
        locktag_type: pg_sys::LockTagType::LOCKTAG_OBJECT as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    let mode = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
    // SAFETY: a session lock (no resource owner or transaction needed), tried without
    // waiting and released at once; LockAcquire raises an error only when the shared lock
    // table is full, which ends the worker through its main function's #[pg_guard].
    unsafe {
        if pg_sys::LockAcquire(&tag, mode, true, true)
            != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
        {
            pg_sys::LockRelease(&tag, mode, true);
            return false;
        }
    }
    // Held or waited for: by whom? Should that look-up fail, leave, as before it was made:
    // a DROP DATABASE must never fail because of the worker.
    prune::in_transaction(|| a_holder_may_go_on(&tag)).unwrap_or(true)
}

/// Could a session that holds a lock on this database (`tag`) conflicting with a new
/// session's go on with its command? It could if it logged in as a superuser or as a member
/// of the database's owner: DROP, RENAME and SET TABLESPACE need the owner's privileges,
/// and the role a session runs such a command as is its login role or one SET ROLE reached,
/// which only a member may (SET SESSION AUTHORIZATION only a superuser; none of them runs
/// in a function). Any holder could if the database is a template (any role with CREATEDB
/// may copy it). A waiter that holds nothing does not count: a command that could go on
/// holds the lock for the whole of its wait for the other sessions, and the worker looks
/// again at its next check (at most 100 ms later in a pause, or after the next batch).
/// Inside a transaction (catalog look-ups).
fn a_holder_may_go_on(tag: &pg_sys::LOCKTAG) -> bool {
    // SAFETY: inside in_transaction, whose PgTry catches the ERRORs of the syscache look-up
    // (I/O, out of memory). SearchSysCache1 returns the database's row, pinned until
    // ReleaseSysCache, or NULL; the row's fixed part (FormData_pg_database, where
    // heap_tuple_get_struct points) is read before the release.
    let (owner, template) = unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::DATABASEOID as _,
            pg_sys::Datum::from(pg_sys::MyDatabaseId),
        );
        if tuple.is_null() {
            return true; // gone already
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
        let found = ((*form).datdba, (*form).datistemplate);
        pg_sys::ReleaseSysCache(tuple);
        found
    };
    // The modes that conflict with RowExclusiveLock, as bits of a holdMask (LOCKBIT_ON).
    let conflicting: pg_sys::LOCKMASK = (1 << pg_sys::ShareLock)
        | (1 << pg_sys::ShareRowExclusiveLock)
        | (1 << pg_sys::ExclusiveLock)
        | (1 << pg_sys::AccessExclusiveLock);
    let mut holders = Vec::new();
    // SAFETY: in the transaction. GetLockStatusData copies the lock table under the lock
    // manager's LWLocks (taken in shared mode and released before it returns) into memory
    // palloc'd in CurrentMemoryContext, the transaction's, freed when it ends; an ERROR
    // (out of memory) is caught by in_transaction's PgTry. `locks` holds `nelements`
    // entries, read before the transaction ends.
    unsafe {
        let data = pg_sys::GetLockStatusData();
        for i in 0..(*data).nelements.max(0) as usize {
            let lock = &*(*data).locks.add(i);
            let t = &lock.locktag;
            if t.locktag_type == tag.locktag_type
                && t.locktag_lockmethodid == tag.locktag_lockmethodid
                && t.locktag_field1 == tag.locktag_field1
                && t.locktag_field2 == tag.locktag_field2
                && t.locktag_field3 == tag.locktag_field3
                && t.locktag_field4 == tag.locktag_field4
                && (lock.holdMask & conflicting) != 0
            {
                holders.push(lock.pid);
            }
        }
    }
    holders.into_iter().any(|pid| {
        // SAFETY: BackendPidGetProc takes ProcArrayLock and returns the PGPROC of the live
        // backend with that pid, or NULL (pid 0 is a prepared transaction's; or it has
        // exited, releasing its locks). PGPROCs stay in shared memory for the server's
        // life, so the pointer stays valid; roleId (set once at login) is read without the
        // lock, as an aligned Oid. Should the backend exit and a new one take its PGPROC in
        // between, that one's role is read: the worker then leaves or stays until its next
        // check, as it would have for that backend.
        let role = unsafe {
            let proc = pg_sys::BackendPidGetProc(pid);
            if proc.is_null() {
                return false;
            }
            std::ptr::read_volatile(std::ptr::addr_of!((*proc).roleId))
        };
        // A process that logged in as no role is none of a client's: let it go on.
        // SAFETY: in the transaction; is_member_of_role (true for a superuser and for the
        // owner itself) reads pg_authid and pg_auth_members through the syscache, whose
        // ERRORs in_transaction's PgTry catches.
        template || role == pg_sys::InvalidOid || unsafe { pg_sys::is_member_of_role(role, owner) }
    })
}

/// How long ago (seconds) the last pass over every scope of this database ended, if one is
/// recorded (inside a transaction).
fn since_last_pass() -> Option<f64> {
    Spi::get_one::<f64>(
        "SELECT pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) s.last_pass_at) \
           FROM dedup._prune_status AS s WHERE s.scope OPERATOR(pg_catalog.=) ''",
    )
    .ok()
    .flatten()
}

/// A WARNING when a database the worker cannot prune now has gone unpruned for longer than
/// one interval beyond the pass that was due (`dedup.prune_status` shows it as overdue).
fn warn_if_overdue(dbname: &str, since: Option<f64>, interval: Duration, why: &str) {
    if let Some(age) = since.filter(|age| *age > 2.0 * interval.as_secs_f64()) {
        warning!(
            "dedup: database \"{dbname}\" has not been pruned for {age:.0} s \
             (dedup.prune_interval is {} s): {why}",
            interval.as_secs()
        );
    }
}

/// The worker for one database: prune it once, then exit.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn dedup_prune_worker_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let dbname = BackgroundWorker::get_extra().to_string();
    let _ = arg; // the database's OID; connecting by name gives the role's name too
    let role = guc::prune_role();
    BackgroundWorker::connect_worker_to_spi(Some(&dbname), role.as_deref());
    // Before the first statement of ours: nothing of this database's settings decides what
    // runs (the statements that read them name everything with its schema).
    if let Err(why) = pin_settings() {
        warning!("dedup: not pruning database \"{dbname}\": {why}");
        return;
    }
    set_application_name(PRUNER);

    let interval = interval().unwrap_or(Duration::from_secs(600));
    if !ready_to_prune(&dbname, interval) {
        return;
    }
    // Generations first (a database that uses them: publish, seal, retire, drop), each
    // step in a transaction of its own; then today's pass, which still prunes
    // dedup.processed until its generation is truncated.
    crate::generations::rotate::worker_pass(&dbname);
    let (result, leaving) = prune_for_a_share(&dbname, interval);
    if leaving {
        log!("dedup: left database \"{dbname}\" in the middle of a pass: it is being dropped, renamed or copied, or its settings could not be pinned again after a reload");
        return;
    }
    report(&dbname, result);
}

/// Whether this worker may prune its database now: the extension is installed there, in a
/// schema only superusers control, at a version with retention, its passes are not backing
/// off, and no other session holds the prune lock (then taken, for the worker's life). Says
/// why not in the log.
///
/// Long because each reason not to prune has its own log line and level.
fn ready_to_prune(dbname: &str, interval: Duration) -> bool {
    let ready = prune::in_transaction(|| {
        // A catalog lookup without SQL: in a database without the extension, nothing more.
        // SAFETY: inside a transaction; get_extension_oid(missing_ok) raises no error for
        // a missing extension, and in_transaction's PgTry catches any other.
        if unsafe { pg_sys::get_extension_oid(c"dedup".as_ptr(), true) } == pg_sys::InvalidOid {
            return Ready::NotInstalled;
        }
        // The version, and whether the extension's schema is one only superusers can change:
        // named dedup (so every dedup.x below is in it), owned by a superuser, and granting
        // CREATE to no other role (security::worker_skips_a_schema_a_plain_role_controls).
        // Otherwise its owner could rename it and put a look-alike, whose code this
        // superuser session would run, in its place.
        let (version, safe) = Spi::get_two::<String, bool>(
            "SELECT e.extversion, \
                    n.nspname OPERATOR(pg_catalog.=) 'dedup'::pg_catalog.name AND o.rolsuper \
                    AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(n.nspacl) AS x \
                                      LEFT JOIN pg_catalog.pg_roles AS g \
                                        ON g.oid OPERATOR(pg_catalog.=) x.grantee \
                                     WHERE x.privilege_type OPERATOR(pg_catalog.=) 'CREATE' \
                                       AND NOT COALESCE(g.rolsuper, false)) \
               FROM pg_catalog.pg_extension AS e \
               JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace \
               JOIN pg_catalog.pg_roles AS o ON o.oid OPERATOR(pg_catalog.=) n.nspowner \
              WHERE e.extname OPERATOR(pg_catalog.=) 'dedup'::pg_catalog.name",
        )
        .unwrap_or((None, None));
        match (version.as_deref(), safe) {
            (None, _) => return Ready::NotInstalled,
            (_, Some(false) | None) => return Ready::Unsafe,
            // Retention arrived in 0.2.0: the tables it needs are not there yet.
            (Some("0.1.0"), _) => return Ready::TooOld,
            (Some(_), _) => {}
        }
        let since = since_last_pass();
        if prune::backing_off(interval) {
            return Ready::BackingOff(since);
        }
        // Held across the pass's transactions, released when the worker exits.
        if prune::try_lock_for_session() {
            Ready::Go
        } else {
            Ready::Busy(since)
        }
    });
    match ready {
        Ok(Ready::Go) => true,
        Ok(Ready::NotInstalled) => false,
        Ok(Ready::Unsafe) => {
            warning!(
                "dedup: not pruning database \"{dbname}\": the schema of its extension dedup is \
                 not named dedup, is not owned by a superuser, or grants CREATE to a role that is \
                 not one; a superuser must check it (docs/operations.md, Security model)"
            );
            false
        }
        Ok(Ready::TooOld) => {
            log!(
                "dedup: not pruning database \"{dbname}\": its extension is version 0.1.0, \
                 from before retention; run ALTER EXTENSION dedup UPDATE there"
            );
            false
        }
        Ok(Ready::BackingOff(since)) => {
            debug1!(
                "dedup: not pruning database \"{dbname}\" yet: backing off after failed passes"
            );
            warn_if_overdue(
                dbname,
                since,
                interval,
                "its last passes failed (see dedup.prune_status.last_error)",
            );
            false
        }
        Ok(Ready::Busy(since)) => {
            debug1!("dedup: database \"{dbname}\" is being pruned by another session");
            warn_if_overdue(
                dbname,
                since,
                interval,
                "a dedup.prune() of another session holds the prune lock",
            );
            false
        }
        Err(message) => {
            warning!("dedup: could not prepare to prune database \"{dbname}\": {message}");
            false
        }
    }
}

/// One visit's pass over the database, in batches of their own transactions, stopped when
/// its share of the worker is up (or SIGTERM, a reload whose settings cannot be pinned
/// again, a DROP DATABASE that may go on); and whether the worker is leaving the database.
fn prune_for_a_share(dbname: &str, interval: Duration) -> (Result<prune::Pass, String>, bool) {
    // This database's share of the worker: a pass longer than that stops and the next visit
    // goes on from where it stopped, so that one large or slow database (a database owner
    // made each batch read the whole table) does not hold up the others
    // (worker::a_slow_database_does_not_hold_up_the_others). A minute, or one interval if
    // that is shorter.
    let share = share(interval);
    let visit = Instant::now();
    let resume = match prune::in_transaction(prune::load_resume) {
        Ok(resume) => resume,
        Err(message) => {
            warning!("dedup: could not read where the last pass of database \"{dbname}\" stopped: {message}");
            None
        }
    };
    let leaving = std::cell::Cell::new(false);
    let first = std::cell::Cell::new(true);
    let stop = || {
        // The file's settings, then ours again above them.
        if reload_config_if_asked() && pin_settings().is_err() {
            leaving.set(true);
        }
        if database_is_being_dropped() {
            leaving.set(true);
        }
        // The share is checked from the second batch on: every visit makes progress.
        let out_of_time = !first.replace(false) && visit.elapsed() >= share;
        shutdown_requested() || leaving.get() || out_of_time
    };
    // The latch may be set for other reasons (a reload, a signal): wait out the rest of the
    // pause in slices of at most 100 ms, unless SIGTERM (its handler sets the latch) or a
    // DROP DATABASE that may go on asks to stop; `stop` then sees it.
    let pause = || {
        let until =
            Instant::now() + Duration::from_millis(guc::PRUNE_BATCH_DELAY.get().max(0) as u64);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || shutdown_requested() || database_is_being_dropped() {
                break;
            }
            BackgroundWorker::wait_latch(Some(
                left.clamp(Duration::from_millis(1), Duration::from_millis(100)),
            ));
        }
    };
    let transactions = prune::Transactions::PerBatch {
        stop: &stop,
        pause: &pause,
    };
    let result = prune::run_pass(None, None, &transactions, resume.as_ref());
    (result, leaving.get())
}

/// The log line of a pass, and its record in dedup._prune_status: a whole pass, one cut
/// short (where the next visit goes on from), or a failure (which backs off).
fn report(dbname: &str, result: Result<prune::Pass, String>) {
    match result {
        Ok(pass) if pass.stopped_at.is_some() => {
            // Cut short (its share was up, or SIGTERM): not a pass; the next visit goes on.
            let at = pass.stopped_at.clone().expect("checked");
            if let Err(message) = prune::in_transaction(|| prune::save_resume(&at, &pass)) {
                warning!("dedup: could not record where the prune of database \"{dbname}\" stopped: {message}");
            }
            log!(
                "dedup: pruned {} claims in database \"{dbname}\" in {:.3} s, its share of the worker; \
                 the pass goes on from block {} of {} at the next visit",
                pass.deleted,
                pass.elapsed.as_secs_f64(),
                at.1,
                at.0
            );
        }
        Ok(pass) => {
            let recorded = prune::in_transaction(|| prune::record_pass(None, &pass, "worker"));
            if pass.deleted > 0 {
                let scopes: Vec<String> = pass
                    .per_scope
                    .iter()
                    .map(|(s, n)| format!("{s}: {n}"))
                    .collect();
                log!(
                    "dedup: pruned {} claims in database \"{dbname}\" in {:.3} s ({})",
                    pass.deleted,
                    pass.elapsed.as_secs_f64(),
                    scopes.join(", ")
                );
            }
            if let Err(message) = recorded {
                warning!("dedup: could not record the prune of database \"{dbname}\": {message}");
            }
        }
        Err(message) => {
            let failures = prune::in_transaction(|| prune::record_failure(&message)).unwrap_or(1);
            warning!(
                "dedup: pruning database \"{dbname}\" failed: {message}; backing off for {} prune interval(s)",
                1 << (failures - 1).clamp(0, 6)
            );
        }
    }
}

enum Ready {
    Go,
    NotInstalled,
    /// The extension's schema is not one only superusers control.
    Unsafe,
    TooOld,
    /// Backing off after failures; how long ago the last pass ended.
    BackingOff(Option<f64>),
    /// Another session prunes; how long ago the last pass ended.
    Busy(Option<f64>),
}
