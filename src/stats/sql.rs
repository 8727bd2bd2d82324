//! The SQL functions of the counters: `dedup.stats_counters()` (the view `dedup.stats` reads
//! it), `stats_info()`, `stats_reset()`, and `dedup._count`, through which the lease and
//! offset functions count.
use super::*;

pub(crate) fn warn_not_preloaded(func: &str) {
    pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("{func}: dedup's counters need shared_preload_libraries = 'dedup'"),
        "dedup",
    )
    .set_detail("Claims work without it, but nothing is counted.")
    .set_hint("Add dedup to shared_preload_libraries in postgresql.conf and restart the server.")
    .report(PgLogLevel::WARNING);
}

/// `dedup.stats_counters()`: the counters of every database, scope and consumer.
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
pub(super) fn stats_counters() -> TableIterator<
    'static,
    (
        name!(datname, Option<String>),
        name!(scope, String),
        name!(consumer, String),
        name!(claims, i64),
        name!(duplicates, i64),
        name!(busy, i64),
        name!(fingerprint_mismatches, i64),
        name!(last_claim_at, Option<TimestampWithTimeZone>),
        name!(last_duplicate_at, Option<TimestampWithTimeZone>),
        name!(late_duplicates, i64),
        name!(duplicate_age_sum, Interval),
        name!(duplicate_age_max, Interval),
        name!(duplicate_ages, Vec<i64>),
        name!(waits, i64),
        name!(wait_time, Interval),
        name!(wait_max, Interval),
        name!(batches, i64),
        name!(advances, i64),
        name!(expired_duplicates, i64),
        name!(last_expired_duplicate_at, Option<TimestampWithTimeZone>),
        name!(expired_duplicate_after_max, Interval),
        name!(expired_duplicates_expected, f64),
        name!(unsummarised_probes, i64),
        name!(summary_false_positives, i64),
    ),
> {
    if !available() {
        warn_not_preloaded("dedup.stats");
        return TableIterator::new(Vec::new());
    }
    let rows: Vec<_> = rows()
        .into_iter()
        .map(|r| {
            // SAFETY: inside this #[pg_extern], in a transaction: get_database_name looks
            // the OID up in the syscache (catalog ERRORs go through pgrx's guard) and
            // returns NULL for a dropped database, else a NUL-terminated name palloc'd in
            // CurrentMemoryContext, valid for this call and copied out at once.
            let datname = unsafe {
                let n = pg_sys::get_database_name(r.dbid);
                (!n.is_null()).then(|| std::ffi::CStr::from_ptr(n).to_string_lossy().into_owned())
            };
            let count = |c: Counter| shown_count(&r, c);
            let interval = |c: Counter| shown_interval(&r, c);
            (
                datname,
                r.scope.clone(),
                r.consumer.clone(),
                count(CLAIMS),
                count(DUPLICATES),
                count(BUSY),
                count(MISMATCHES),
                shown_time(&r, LAST_CLAIM_AT),
                shown_time(&r, LAST_DUPLICATE_AT),
                count(LATE_DUPLICATES),
                interval(AGE_SUM),
                interval(AGE_MAX),
                shown_buckets(&r, AGES),
                count(WAITS),
                interval(WAIT_SUM),
                interval(WAIT_MAX),
                count(BATCHES),
                count(ADVANCES),
                count(EXPIRED),
                shown_time(&r, LAST_EXPIRED_AT),
                interval(EXPIRED_AFTER_MAX),
                r.get(EXPIRED_EXPECTED)[0] as f64 / 1e9,
                count(UNSUMMARISED_PROBES),
                count(SUMMARY_FALSE_POSITIVES),
            )
        })
        .collect();
    TableIterator::new(rows)
}

fn shown_count(r: &Row, c: Counter) -> i64 {
    debug_assert_eq!(c.shown, Shown::Count);
    r.get(c)[0] as i64
}

fn shown_time(r: &Row, c: Counter) -> Option<TimestampWithTimeZone> {
    debug_assert_eq!(c.shown, Shown::Time);
    ts(r.get(c)[0]).and_then(|t| TimestampWithTimeZone::try_from(t).ok())
}

fn shown_interval(r: &Row, c: Counter) -> Interval {
    let v = i64::try_from(r.get(c)[0]).unwrap_or(i64::MAX);
    match c.shown {
        Shown::Millis => micros(v.saturating_mul(1000)),
        _ => {
            debug_assert_eq!(c.shown, Shown::Micros);
            micros(v)
        }
    }
}

fn shown_buckets(r: &Row, c: Counter) -> Vec<i64> {
    debug_assert_eq!(c.shown, Shown::Buckets);
    r.get(c).iter().map(|v| *v as i64).collect()
}

/// An interval of `us` microseconds.
pub(super) fn micros(us: i64) -> Interval {
    Interval::new(0, 0, us).unwrap_or_else(|_| Interval::new(0, 0, 0).expect("zero"))
}

/// `dedup.stats_info()`: the size of the counter table and when it was last reset.
#[pg_extern(volatile, parallel_restricted)]
pub(super) fn stats_info() -> TableIterator<
    'static,
    (
        name!(counting, bool),
        name!(entries, i64),
        name!(max_entries, i64),
        name!(overflowed, i64),
        name!(reset_at, Option<TimestampWithTimeZone>),
    ),
> {
    if !available() {
        warn_not_preloaded("dedup.stats_info");
        return TableIterator::once((false, 0, max_entries(), 0, None));
    }
    let (entries, overflowed, reset_at) = info();
    TableIterator::once((
        guc::TRACK_STATS.get(),
        entries,
        max_entries(),
        overflowed,
        TimestampWithTimeZone::try_from(reset_at).ok(),
    ))
}

/// `dedup.stats_reset()`: forget every counter.
#[pg_extern(volatile, parallel_unsafe)]
pub(super) fn stats_reset() {
    if !available() {
        warn_not_preloaded("dedup.stats_reset");
        return;
    }
    reset();
}

/// `dedup._count(scope, event)`: count a lease call (the lease functions are PL/pgSQL).
#[pg_extern(name = "_count", volatile, parallel_unsafe)]
pub(super) fn count_event(scope: &str, event: &str) {
    count_event_at(Some(scope), Some(event), None);
}

/// `dedup._count(scope, event, claimed_at)`: the same, with the time of the claim a `done`
/// or `busy` lease call found (for the duplicate ages; 0.6.0).
#[pg_extern(name = "_count", volatile, parallel_unsafe)]
pub(crate) fn count_event_at(
    scope: Option<&str>,
    event: Option<&str>,
    claimed_at: Option<TimestampWithTimeZone>,
) {
    let scope = scope.unwrap_or_else(|| error::null_argument("dedup._count", "scope"));
    let event = event.unwrap_or_else(|| error::null_argument("dedup._count", "event"));
    let claimed_at = claimed_at.map_or(0, pg_sys::TimestampTz::from);
    let event = match event {
        "acquired" => Event::Claim,
        "done" => Event::Duplicate { claimed_at },
        // A busy lease does not wait: no wait is counted.
        "busy" => Event::Busy {
            claimed_at,
            waited: 0,
        },
        "fingerprint_mismatch" => Event::FingerprintMismatch,
        "advance" => Event::Advance { raised: true },
        "stale" => Event::Advance { raised: false },
        other => error::unknown_event(other),
    };
    count(scope, event);
}
