//! The background worker that prunes every database where dedup is installed.
//!
//! A launcher (registered at server start through `shared_preload_libraries = 'dedup'`,
//! started once the server accepts writes, so never on a standby and right after a
//! promotion) wakes every `dedup.prune_interval`, lists the databases that accept
//! connections, and for each starts a short-lived worker connected to it, one at a time.
//! That worker checks for the extension (and leaves quietly without it), takes the prune
//! advisory lock (and leaves if a prune already runs there), and sweeps the claim table in
//! batches, each its own transaction, stopping between batches on SIGTERM.
use crate::{guc, prune};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
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
    unsafe { std::ptr::read_volatile(std::ptr::addr_of!(pg_sys::ShutdownRequestPending)) != 0 }
}

fn set_application_name(name: &str) {
    let name = std::ffi::CString::new(name).expect("no NUL in a worker name");
    unsafe {
        pg_sys::SetConfigOption(
            c"application_name".as_ptr(),
            name.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
        );
        pg_sys::pgstat_report_appname(name.as_ptr());
    }
}

fn reload_config_if_asked() {
    if BackgroundWorker::sighup_received() {
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
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

    let mut failures = 0u32;
    loop {
        reload_config_if_asked();
        let started = Instant::now();
        let mut wait = match interval() {
            // Turned off: look again at the next reload, or in a minute.
            None => Duration::from_secs(60),
            Some(interval) => {
                match prune::in_transaction(databases) {
                    Ok(dbs) => {
                        failures = 0;
                        for (oid, name) in dbs {
                            if shutdown_requested() {
                                return;
                            }
                            if let Err(problem) = prune_database(oid, &name) {
                                failures += 1;
                                warning!("dedup launcher: {problem}");
                                break;
                            }
                        }
                    }
                    Err(message) => {
                        failures += 1;
                        warning!("dedup launcher: listing databases failed: {message}");
                    }
                }
                interval
            }
        };
        // Back off after failures: two intervals, four, ... at most 64.
        if failures > 0 {
            wait *= 1 << failures.min(6);
        }
        wait = wait.saturating_sub(started.elapsed());
        if !BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(10)))) {
            break;
        }
    }
    log!("dedup launcher stopped");
}

/// Start the worker for one database and wait until it has finished.
fn prune_database(oid: pg_sys::Oid, name: &str) -> Result<(), String> {
    let handle = BackgroundWorkerBuilder::new(PRUNER)
        .set_type(PRUNER)
        .set_library("dedup")
        .set_function("dedup_prune_worker_main")
        .set_argument(Some(pg_sys::Datum::from(oid)))
        .set_extra(name)
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
        .map_err(|_| {
            format!(
                "could not start a worker to prune database \"{name}\": no free background worker slot \
                 (you might need to increase max_worker_processes)"
            )
        })?;
    handle
        .wait_for_shutdown()
        .map_err(|status| format!("waiting for the worker of database \"{name}\": {status:?}"))
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
    set_application_name(PRUNER);

    let interval = interval().unwrap_or(Duration::from_secs(600));
    let ready = prune::in_transaction(|| {
        let version = Spi::get_one::<String>(
            "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'dedup'",
        )
        .ok()
        .flatten();
        match version.as_deref() {
            None => return Ready::NotInstalled,
            // Retention arrived in 0.2.0: the tables it needs are not there yet.
            Some("0.1.0") => return Ready::TooOld,
            Some(_) => {}
        }
        if prune::backing_off(interval) {
            return Ready::BackingOff;
        }
        // Session-level: held across the pass's transactions, released when we exit.
        let locked = Spi::get_one_with_args::<bool>(
            "SELECT pg_catalog.pg_try_advisory_lock($1, $2)",
            &[
                DatumWithOid::from(prune::LOCK_KEY.0),
                DatumWithOid::from(prune::LOCK_KEY.1),
            ],
        )
        .ok()
        .flatten()
            == Some(true);
        if locked {
            Ready::Go
        } else {
            Ready::Busy
        }
    });
    match ready {
        Ok(Ready::Go) => {}
        Ok(Ready::NotInstalled) => return,
        Ok(Ready::TooOld) => {
            log!(
                "dedup: not pruning database \"{dbname}\": its extension is version 0.1.0, \
                 from before retention; run ALTER EXTENSION dedup UPDATE there"
            );
            return;
        }
        Ok(Ready::BackingOff) => {
            debug1!(
                "dedup: not pruning database \"{dbname}\" yet: backing off after failed passes"
            );
            return;
        }
        Ok(Ready::Busy) => {
            debug1!("dedup: database \"{dbname}\" is being pruned by another session");
            return;
        }
        Err(message) => {
            warning!("dedup: could not prepare to prune database \"{dbname}\": {message}");
            return;
        }
    }

    let stop = || {
        reload_config_if_asked();
        shutdown_requested()
    };
    // The latch may be set for other reasons (a reload, a signal): wait out the rest of the
    // pause, unless SIGTERM (its handler sets the latch) asks to stop; `stop` then sees it.
    let pause = || {
        let until =
            Instant::now() + Duration::from_millis(guc::PRUNE_BATCH_DELAY.get().max(0) as u64);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || shutdown_requested() {
                break;
            }
            BackgroundWorker::wait_latch(Some(left.max(Duration::from_millis(1))));
        }
    };
    let transactions = prune::Transactions::PerBatch {
        stop: &stop,
        pause: &pause,
    };
    match prune::run_pass(None, None, &transactions) {
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
    TooOld,
    BackingOff,
    Busy,
}
