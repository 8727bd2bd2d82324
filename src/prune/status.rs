//! The passes' record in `dedup._prune_status`: each finished pass (the worker's and
//! `dedup.prune()`'s), and for the worker where a pass cut short stopped, its failures in a
//! row and the back-off after them.
use super::horizons::has_horizons;
use super::pass::Pass;
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::Duration;

/// Record a finished pass in `dedup._prune_status`: one row for the pass (key '' for all
/// scopes, or the scope it was limited to) and one per scope it deleted from.
pub fn record_pass(scope: Option<&str>, pass: &Pass, by: &str) {
    let mut keys = vec![scope.unwrap_or("").to_string()];
    let mut counts = vec![pass.deleted];
    if scope.is_none() {
        for (s, n) in &pass.per_scope {
            keys.push(s.clone());
            counts.push(*n);
        }
    }
    let args = [
        DatumWithOid::from(keys),
        DatumWithOid::from(counts),
        DatumWithOid::from(pass.elapsed.as_secs_f64()),
        DatumWithOid::from(by),
    ];
    // A whole pass: the next one starts from the beginning (0.6.0 keeps where a worker's
    // pass cut short stopped; older versions have no such columns).
    let resume = if has_horizons() {
        ", resume_target = NULL, resume_block = NULL"
    } else {
        ""
    };
    Spi::run_with_args(
        &format!(
            "INSERT INTO dedup._prune_status AS s (scope, last_pass_at, rows_deleted, duration, pruned_by) \
             SELECT k.scope, pg_catalog.now(), k.n, pg_catalog.make_interval(secs => $3), $4 \
               FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
                               pg_catalog.unnest($2::pg_catalog.int8[])) AS k(scope, n) \
             ON CONFLICT (scope) DO UPDATE SET last_pass_at = excluded.last_pass_at, \
                 rows_deleted = excluded.rows_deleted, duration = excluded.duration, \
                 pruned_by = excluded.pruned_by, consecutive_failures = 0{resume}"
        ),
        &args,
    )
    .unwrap_or_else(|e| pgrx::error!("dedup: recording the prune failed: {e}"));
}

/// Where the worker's last pass over all scopes was cut short (its share of time was up),
/// if it was: the next one goes on from there (0.6.0 on).
pub fn load_resume() -> Option<(String, u32)> {
    if !has_horizons() {
        return None;
    }
    let row = Spi::get_two::<String, i64>(
        "SELECT s.resume_target, s.resume_block FROM dedup._prune_status AS s \
          WHERE s.scope OPERATOR(pg_catalog.=) ''",
    );
    match row {
        Ok((Some(target), Some(block))) => Some((target, u32::try_from(block).unwrap_or(0))),
        _ => None,
    }
}

/// Keep where a pass cut short stopped, for the next one, and record in each scope's row
/// what it deleted there. The row of all scopes is not a pass's: its last_pass_at stays
/// that of the last whole pass. But the visit succeeded: it ends a run of failed passes, as
/// a whole pass does, so that failures between the visits of a long pass do not keep the
/// back-off at its longest (worker::a_visit_cut_short_ends_a_run_of_failures).
pub fn save_resume(at: &(String, u32), pass: &Pass) {
    if !has_horizons() {
        return;
    }
    Spi::run_with_args(
        "INSERT INTO dedup._prune_status AS s (scope, pruned_by, resume_target, resume_block) \
         VALUES ('', 'worker', $1, $2) \
         ON CONFLICT (scope) DO UPDATE SET resume_target = excluded.resume_target, \
             resume_block = excluded.resume_block, consecutive_failures = 0",
        &[
            DatumWithOid::from(at.0.as_str()),
            DatumWithOid::from(i64::from(at.1)),
        ],
    )
    .unwrap_or_else(|e| pgrx::error!("dedup: recording where the prune stopped failed: {e}"));
    let (scopes, counts): (Vec<String>, Vec<i64>) =
        pass.per_scope.iter().map(|(s, n)| (s.clone(), *n)).unzip();
    if scopes.is_empty() {
        return;
    }
    Spi::run_with_args(
        "INSERT INTO dedup._prune_status AS s (scope, last_pass_at, rows_deleted, duration, pruned_by) \
         SELECT k.scope, pg_catalog.now(), k.n, pg_catalog.make_interval(secs => $3), 'worker' \
           FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
                           pg_catalog.unnest($2::pg_catalog.int8[])) AS k(scope, n) \
         ON CONFLICT (scope) DO UPDATE SET last_pass_at = excluded.last_pass_at, \
             rows_deleted = excluded.rows_deleted, duration = excluded.duration, \
             pruned_by = excluded.pruned_by",
        &[
            DatumWithOid::from(scopes),
            DatumWithOid::from(counts),
            DatumWithOid::from(pass.elapsed.as_secs_f64()),
        ],
    )
    .unwrap_or_else(|e| pgrx::error!("dedup: recording the prune failed: {e}"));
}

/// Record a failed worker pass; returns how many passes in a row have failed.
pub fn record_failure(message: &str) -> i32 {
    Spi::get_one_with_args::<i32>(
        "INSERT INTO dedup._prune_status AS s (scope, pruned_by, consecutive_failures, last_error, last_error_at) \
         VALUES ('', 'worker', 1, $1, pg_catalog.now()) \
         ON CONFLICT (scope) DO UPDATE SET \
             consecutive_failures = s.consecutive_failures OPERATOR(pg_catalog.+) 1, \
             last_error = excluded.last_error, last_error_at = excluded.last_error_at \
         RETURNING s.consecutive_failures",
        &[DatumWithOid::from(message)],
    )
    .ok()
    .flatten()
    .unwrap_or(1)
}

/// Is the worker backing off after failed passes? Waits double with every failure in a
/// row: one interval, two, four, ... at most 64 intervals.
pub fn backing_off(interval: Duration) -> bool {
    let row = Spi::get_two::<i32, TimestampWithTimeZone>(
        "SELECT s.consecutive_failures, s.last_error_at FROM dedup._prune_status AS s \
          WHERE s.scope OPERATOR(pg_catalog.=) ''",
    );
    let Ok((Some(failures), Some(at))) = row else {
        return false;
    };
    if failures <= 0 {
        return false;
    }
    let wait = interval.as_micros() as i64 * (1i64 << (failures - 1).min(6));
    // SAFETY: GetCurrentTransactionStartTimestamp only returns the backend-global
    // xactStartTimestamp (no ERROR); called inside in_transaction, on the main thread.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    now < pg_sys::TimestampTz::from(at) + wait
}
