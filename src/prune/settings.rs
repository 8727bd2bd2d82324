//! The retention settings: `dedup.set_retention` and `dedup.retention`.
use crate::{claim, error, guc};
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// The parts of an interval `$1` (months, days, the rest in seconds) and its length in
/// seconds (months of 30 days, years of 365.25), as a FROM item `l`: set_retention refuses a
/// retention that is not positive in every month with it
/// (retention::a_retention_positive_only_in_some_months_is_refused).
const LENGTHS: &str = "(SELECT p.epoch, p.months, p.days, \
        pg_catalog.date_part('epoch', $1::pg_catalog.interval OPERATOR(pg_catalog.-) \
            pg_catalog.make_interval(months => p.months::pg_catalog.int4, \
                                     days => p.days::pg_catalog.int4)) AS secs \
   FROM (SELECT pg_catalog.date_part('epoch', $1::pg_catalog.interval) AS epoch, \
                (pg_catalog.date_part('year', $1::pg_catalog.interval) OPERATOR(pg_catalog.*) 12) \
                OPERATOR(pg_catalog.+) pg_catalog.date_part('month', $1::pg_catalog.interval) AS months, \
                pg_catalog.date_part('day', $1::pg_catalog.interval) AS days) AS p) AS l";
/// The shortest an interval of `l` (LENGTHS) can be, in seconds: its months of 28 days
/// each, or of 31 days when there are fewer than none. (Operators written OPERATOR() all
/// bind alike, left to right: hence the parentheses.)
const SHORTEST: &str = "((l.months OPERATOR(pg_catalog.*) CASE WHEN l.months OPERATOR(pg_catalog.>=) 0 \
        THEN 2419200 ELSE 2678400 END) OPERATOR(pg_catalog.+) (l.days OPERATOR(pg_catalog.*) 86400)) \
        OPERATOR(pg_catalog.+) l.secs";

/// `dedup.set_retention(scope, retention)`: give `scope` its own retention; NULL removes it.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn set_retention(scope: Option<&str>, retention: Option<Interval>) {
    const F: &str = "dedup.set_retention";
    let scope = scope.unwrap_or_else(|| error::null_argument(F, "scope"));
    claim::check_scope(F, scope);
    let Some(retention) = retention else {
        Spi::run_with_args(
            "DELETE FROM dedup.scope_retention WHERE scope OPERATOR(pg_catalog.=) $1",
            &[DatumWithOid::from(scope)],
        )
        .unwrap_or_else(|e| pgrx::error!("{F}: deleting from dedup.scope_retention failed: {e}"));
        return;
    };
    // Its length in seconds (a month counted as 30 days), and its shortest whatever a
    // month's length: '1 month -29 days' is 1 day by the first, -1 day after February.
    let lengths = Spi::get_two_with_args::<f64, f64>(
        &format!("SELECT l.epoch, {SHORTEST} FROM {LENGTHS}"),
        &[DatumWithOid::from(retention)],
    );
    let (seconds, shortest_month) = match lengths {
        Ok((Some(s), Some(m))) => (s, m),
        _ => (0.0, 0.0),
    };
    if seconds <= 0.0 {
        error::not_positive(F, "retention", &format!("{seconds} s"));
    }
    if shortest_month <= 0.0 {
        let text = Spi::get_one_with_args::<String>(
            "SELECT $1::pg_catalog.interval::pg_catalog.text",
            &[DatumWithOid::from(retention)],
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        error::retention_not_positive_every_month(F, &text, shortest_month);
    }
    let (shortest, what) = guc::shortest_sensible_retention();
    if seconds < f64::from(shortest) {
        error::warn_short_retention(
            &format!("retention of scope '{scope}'"),
            seconds as i64,
            shortest,
            what,
        );
    }
    // The caller: the role in effect outside this SECURITY DEFINER function (the session
    // user, or the role of SET ROLE), not the function's owner.
    let by = unsafe {
        // SAFETY: GetOuterUserId reads a global; GetUserNameFromId(noerr = false) raises an
        // error for a dropped role, through this #[pg_extern]'s guard; the name is palloc'd
        // in the current memory context and copied out at once.
        std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetOuterUserId(), false))
            .to_string_lossy()
            .into_owned()
    };
    Spi::run_with_args(
        "INSERT INTO dedup.scope_retention (scope, retention, set_by) VALUES ($1, $2, $3) \
         ON CONFLICT (scope) DO UPDATE SET retention = excluded.retention, \
             set_at = excluded.set_at, set_by = excluded.set_by",
        &[
            DatumWithOid::from(scope),
            DatumWithOid::from(retention),
            DatumWithOid::from(by.as_str()),
        ],
    )
    .unwrap_or_else(|e| pgrx::error!("{F}: writing dedup.scope_retention failed: {e}"));
}

/// `dedup.retention(scope)`: the retention in force for `scope`.
#[pg_extern(stable, parallel_safe)]
pub(crate) fn retention(scope: default!(Option<&str>, "'default'")) -> Interval {
    const F: &str = "dedup.retention";
    let scope = scope.unwrap_or_else(|| error::null_argument(F, "scope"));
    Spi::get_one_with_args::<Interval>(
        "SELECT COALESCE( \
             (SELECT r.retention FROM dedup.scope_retention AS r WHERE r.scope OPERATOR(pg_catalog.=) $1), \
             pg_catalog.justify_hours(pg_catalog.make_interval(secs => $2::pg_catalog.float8)))",
        &[DatumWithOid::from(scope), DatumWithOid::from(f64::from(guc::RETENTION.get()))],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| pgrx::error!("dedup: reading dedup.scope_retention failed"))
}
