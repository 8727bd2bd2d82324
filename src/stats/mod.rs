//! The guide's diagnostic hook: how many claims each consumer won, and how many copies it
//! skipped, per database and scope.
//!
//! The counters live in shared memory (with `shared_preload_libraries = 'dedup'`): a hash
//! table of at most `dedup.stats_max` entries, keyed by database, scope and consumer. A
//! backend looks an entry up once, under a shared lock, and keeps its address; after that a
//! claim updates the entry's counters with atomic additions, without any lock. The table's
//! lock is taken exclusively only to add an entry, to reset, or to forget a dropped
//! database's entries. When the table is full, a new combination is counted in the
//! overflow entry (made at server start, shown as the scope `(overflow)`): nothing is
//! evicted, so a role inventing scope or consumer names can neither push other consumers'
//! counters out nor make a lookup scan the table, and the lookup that finds the table full
//! takes the overflow entry under the shared lock, so inventing names cannot make every
//! backend queue for the exclusive one either. Every entry carries a generation number
//! that changes when a reset removes it, so a backend never counts into an entry removed
//! under it (except in the instant between its check and its addition: a miscount of one,
//! during a reset); the overflow entry's also changes when a dropped database's entries
//! make room, so a combination counted there gets an entry of its own when it can.
//!
//! The table is written to `pg_stat/dedup.stat` when the server shuts down cleanly (fsynced,
//! then renamed into place, with a checksum) and read back at start, as pg_stat_statements
//! does; a file that is torn, altered or of another layout is refused whole.
use crate::error;
use crate::guc;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::sync::atomic::{AtomicU64, Ordering};

mod file;
mod shmem;
pub(crate) mod sql;
pub(crate) use file::checksum;
use file::*;
use shmem::*;
pub use shmem::{available, counted_databases, forget_databases, request_shared_memory};

const MAX_SCOPE: usize = error::MAX_SCOPE_BYTES;
/// application_name and dedup.consumer are names: at most NAMEDATALEN - 1 bytes.
const MAX_CONSUMER: usize = 63;
/// The scope the overflow entry is shown under (a claim's scope is never empty, so the
/// entry's key, with an empty scope, is no real combination's).
pub const OVERFLOW_SCOPE: &str = "(overflow)";

/// What a claim or lease call found, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The call took the job: `try_claim` returned true, `lease` acquired it.
    Claim,
    /// `n` jobs taken by one `try_claim` (n = 1) or `try_claim_many` call (counted once
    /// per call, as n claims), and what their look-up in the summaries of pruned claims
    /// found (src/expired/).
    Claims {
        n: u64,
        looked: crate::expired::Looked,
    },
    /// The job was done already: `try_claim` returned false at once, `lease` said done.
    /// `claimed_at`: when the claim it hit was made (microseconds since 2000; 0 unknown).
    Duplicate { claimed_at: i64 },
    /// A concurrent holder had it: `try_claim` waited for another transaction's claim and
    /// then returned false (`waited`: microseconds from the call's start to its answer; 0
    /// when not measured); `lease` said busy.
    Busy { claimed_at: i64, waited: i64 },
    /// Another payload fingerprint (YD001).
    FingerprintMismatch,
    /// A `try_claim_many` call (its jobs count as claims, duplicates and busy, each).
    Batch,
    /// A `dedup.advance` call that raised its partition's mark (`raised`), or found the
    /// position at or below it (a redelivery: counted as a duplicate).
    Advance { raised: bool },
}

/// Upper bounds of the duplicate-age buckets, in seconds; the last bucket has none. Half a
/// day and 3.5 days are half of common retentions (1 day, and the default 7 days), so a
/// copy arriving past half of them shows in a bucket of its own; `late_duplicates` counts
/// that exactly, against each scope's own retention.
pub const AGE_BOUNDS: [u64; 9] = [1, 60, 600, 3600, 21_600, 43_200, 86_400, 302_400, 604_800];
const AGE_BUCKETS: usize = AGE_BOUNDS.len() + 1;

/// Backend-local: the entry this backend counted into last, and its generation.
struct Cached {
    key: Key,
    entry: *mut Entry,
    generation: u64,
}
static mut LAST: Option<Cached> = None;

/// The consumer's name as the session has it: `dedup.consumer`, else `application_name`.
/// Borrowed from the settings' own storage: counting allocates nothing.
///
/// # Safety
///
/// The returned &str borrows guc.c's current value of `dedup.consumer` or
/// `application_name` (guc_strdup'd memory, freed when the setting is next assigned): use
/// it only before anything can assign a setting (a SET, a config reload, the end of a
/// transaction that set one), as count() does, and on the backend's main thread.
unsafe fn consumer_name<'a>() -> &'a str {
    // SAFETY: CONSUMER.as_ptr() is the address of the `char *` guc.c assigns (registered
    // with DefineCustomStringVariable); it and application_name are NULL or NUL-terminated
    // strings owned by guc.c (see the contract above). No call is made: no ERROR.
    let own = *guc::CONSUMER.as_ptr();
    let p = if !own.is_null() && *own != 0 {
        own
    } else {
        pg_sys::application_name
    };
    if p.is_null() {
        ""
    } else {
        std::ffi::CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

/// Record `now` in `field` unless a later time is there already (a plain load and store:
/// two claims at the same moment may leave the earlier of two nearly equal times).
fn advance(field: &AtomicU64, now: u64) {
    if field.load(Ordering::Relaxed) < now {
        field.store(now, Ordering::Relaxed);
    }
}

/// Count one claim or lease call.
pub fn count(scope: &str, event: Event) {
    if !available() || !guc::TRACK_STATS.get() {
        return;
    }
    // SAFETY: on the backend's main thread, inside a #[pg_extern] (try_claim's,
    // dedup._count), with SHARED and HASH set (available()): the contracts of entry_for and
    // add. GetCurrentTransactionStartTimestamp only returns a global (no ERROR).
    unsafe {
        let Some(entry) = entry_for(scope) else {
            return;
        };
        let now = pg_sys::GetCurrentTransactionStartTimestamp() as u64;
        if entry == (*SHARED).overflow {
            (*SHARED).overflowed.fetch_add(1, Ordering::Relaxed);
        }
        add(entry, scope, event, now);
    }
}

/// Count the index probes of sealed generations one call made for `scope` (what
/// `generations::take_probes` gave right after its claims): nothing to do for none, the
/// common case.
pub(crate) fn count_probes(scope: &str, probes: crate::generations::Probes) {
    if probes.unsummarised == 0 && probes.false_positives == 0 {
        return;
    }
    if !available() || !guc::TRACK_STATS.get() {
        return;
    }
    // SAFETY: as in count(): on the backend's main thread, inside a #[pg_extern], with
    // SHARED and HASH set; every counter here has one value.
    unsafe {
        let Some(entry) = entry_for(scope) else {
            return;
        };
        let c = |counter: Counter| counter.of(entry, 0);
        c(UNSUMMARISED_PROBES).fetch_add(probes.unsummarised, Ordering::Relaxed);
        c(SUMMARY_FALSE_POSITIVES).fetch_add(probes.false_positives, Ordering::Relaxed);
    }
}

/// The entry this backend counts `scope` into: the cached one while its key and generation
/// still match, else found or added (None: the table has no room and no overflow entry).
///
/// # Safety
///
/// On the backend's main thread, with SHARED and HASH set (available()). MyDatabaseId is a
/// global read. consumer_name's &str is used (and copied into a Key) before any setting can
/// change. LAST is backend-local: the &mut to it is the only one while it lives (nothing
/// here calls count() again). A cached entry pointer stays in mapped shared memory for the
/// postmaster's life, even if a reset removed the entry: its generation is read atomically
/// and compared before it is used, and find_or_add otherwise returns a live entry.
#[inline]
unsafe fn entry_for(scope: &str) -> Option<*mut Entry> {
    let dbid = pg_sys::MyDatabaseId;
    let consumer = consumer_name();
    let last = &mut *std::ptr::addr_of_mut!(LAST);
    match last {
        Some(c)
            if c.key.same(dbid, scope, consumer)
                && (*c.entry).generation.load(Ordering::Acquire) == c.generation =>
        {
            Some(c.entry)
        }
        _ => {
            let key = Key::new(dbid, scope, consumer);
            let (entry, generation) = find_or_add(&key)?;
            *last = Some(Cached {
                key,
                entry,
                generation,
            });
            Some(entry)
        }
    }
}

/// Add `event` to the counters of `entry`, at `now` (the transaction's start).
///
/// # Safety
///
/// `entry` points to an entry of the shared table (entry_for's).
#[inline]
unsafe fn add(entry: *mut Entry, scope: &str, event: Event, now: u64) {
    // SAFETY: the contract above is Counter::of's; every counter here has one value.
    let c = |counter: Counter| counter.of(entry, 0);
    match event {
        Event::Claim => {
            c(CLAIMS).fetch_add(1, Ordering::Relaxed);
            advance(c(LAST_CLAIM_AT), now);
        }
        Event::Claims { n, looked } => {
            c(CLAIMS).fetch_add(n, Ordering::Relaxed);
            advance(c(LAST_CLAIM_AT), now);
            if looked.expected_ppb > 0 {
                c(EXPIRED_EXPECTED).fetch_add(looked.expected_ppb, Ordering::Relaxed);
            }
            if looked.expired > 0 {
                c(EXPIRED).fetch_add(looked.expired, Ordering::Relaxed);
                advance(c(LAST_EXPIRED_AT), now);
                c(EXPIRED_AFTER_MAX).fetch_max(looked.after_max.max(0) as u64, Ordering::Relaxed);
            }
        }
        Event::Duplicate { claimed_at } | Event::Busy { claimed_at, .. } => {
            let counter = if matches!(event, Event::Duplicate { .. }) {
                DUPLICATES
            } else {
                BUSY
            };
            c(counter).fetch_add(1, Ordering::Relaxed);
            advance(c(LAST_DUPLICATE_AT), now);
            if claimed_at > 0 {
                add_age(entry, scope, claimed_at, now);
            }
            if let Event::Busy { waited, .. } = event {
                if waited > 0 {
                    let waited = waited as u64;
                    c(WAITS).fetch_add(1, Ordering::Relaxed);
                    c(WAIT_SUM).fetch_add(waited, Ordering::Relaxed);
                    c(WAIT_MAX).fetch_max(waited, Ordering::Relaxed);
                }
            }
        }
        Event::FingerprintMismatch => {
            c(MISMATCHES).fetch_add(1, Ordering::Relaxed);
            advance(c(LAST_USED_AT), now);
        }
        Event::Batch => {
            c(BATCHES).fetch_add(1, Ordering::Relaxed);
        }
        Event::Advance { raised: true } => {
            c(ADVANCES).fetch_add(1, Ordering::Relaxed);
            advance(c(LAST_CLAIM_AT), now);
        }
        Event::Advance { raised: false } => {
            c(DUPLICATES).fetch_add(1, Ordering::Relaxed);
            advance(c(LAST_DUPLICATE_AT), now);
        }
    }
}

/// The age of the claim a copy hit, when the copy's transaction began (a claim made after
/// that, by a concurrent transaction, is age 0): its sum, the largest, its bucket, and
/// whether it was past half its scope's retention.
///
/// # Safety
///
/// As [`add`].
#[inline]
unsafe fn add_age(entry: *mut Entry, scope: &str, claimed_at: i64, now: u64) {
    let age = (now as i64 - claimed_at).max(0) as u64;
    AGE_SUM
        .of(entry, 0)
        .fetch_add(age / 1000, Ordering::Relaxed);
    AGE_MAX.of(entry, 0).fetch_max(age, Ordering::Relaxed);
    let bucket = AGE_BOUNDS
        .iter()
        .position(|b| age <= b * 1_000_000)
        .unwrap_or(AGE_BOUNDS.len());
    AGES.of(entry, bucket).fetch_add(1, Ordering::Relaxed);
    if age > late_after(scope) {
        LATE_DUPLICATES.of(entry, 0).fetch_add(1, Ordering::Relaxed);
    }
}

/// The clock (microseconds since 2000) when claims are counted, else 0: a claim reads it
/// before it looks for a conflict, to know how long a busy claim waited.
pub fn clock_if_counting() -> i64 {
    if !available() || !guc::TRACK_STATS.get() {
        return 0;
    }
    // SAFETY: GetCurrentTimestamp reads the clock (gettimeofday) and does arithmetic: no
    // allocation, no ERROR, so it is called without pgrx's guard (a claim of a batch reads
    // it once per job).
    unsafe { unguarded::GetCurrentTimestamp() }
}

mod unguarded {
    use pgrx::pg_sys;
    extern "C" {
        /// The clock, microseconds since 2000.
        // SAFETY: matches the prototype pgrx binds for PostgreSQL 13 to 18; gettimeofday
        // and arithmetic only, no ereport.
        pub fn GetCurrentTimestamp() -> pg_sys::TimestampTz;
    }
}

/// Half the retention of each scope this backend counted a duplicate in, microseconds:
/// copies of claims older than that are `late_duplicates`. Read from the scope's row of
/// dedup.scope_retention when a duplicate or a busy copy is counted, at most every 10
/// seconds per backend and scope.
static mut LATE_AFTER: Option<std::collections::HashMap<String, (u64, std::time::Instant)>> = None;

/// # Safety
///
/// On the backend's main thread, in a transaction, under pgrx's guard (from count()).
unsafe fn late_after(scope: &str) -> u64 {
    // SAFETY: LATE_AFTER is backend-local; the &mut is the only one while it lives (the
    // lookup below counts nothing).
    let cache = (*std::ptr::addr_of_mut!(LATE_AFTER)).get_or_insert_with(Default::default);
    if let Some((v, at)) = cache.get(scope) {
        if at.elapsed() < std::time::Duration::from_secs(10) {
            return *v;
        }
    }
    let seconds = scope_retention(scope).unwrap_or_else(|| f64::from(guc::RETENTION.get()));
    let v = (seconds * 1_000_000.0 / 2.0).max(0.0) as u64;
    if cache.len() >= 1000 {
        cache.clear();
    }
    cache.insert(scope.to_string(), (v, std::time::Instant::now()));
    v
}

/// The scope's own retention in seconds, if it has one. A statement that cannot fail for
/// want of an object or a privilege: without dedup.scope_retention (a catalog older than
/// 0.2.0, claims going on before ALTER EXTENSION UPDATE) or SELECT on it (the caller's
/// role, for try_claim), None, and the caller uses dedup.retention.
///
/// # Safety
///
/// In a transaction, under pgrx's guard.
unsafe fn scope_retention(scope: &str) -> Option<f64> {
    // SAFETY: syscache lookups (InvalidOid for a missing name) and an ACL check of an
    // existing relation; errors (catalog reads) go through the caller's guard.
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    if nsp == pg_sys::InvalidOid {
        return None;
    }
    let relid = pg_sys::get_relname_relid(c"scope_retention".as_ptr(), nsp);
    if relid == pg_sys::InvalidOid
        || pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as _)
            != pg_sys::AclResult::ACLCHECK_OK
    {
        return None;
    }
    Spi::connect(|c| {
        c.select(
            "SELECT pg_catalog.date_part('epoch', r.retention) FROM dedup.scope_retention AS r \
              WHERE r.scope OPERATOR(pg_catalog.=) $1",
            Some(1),
            &[pgrx::datum::DatumWithOid::from(scope)],
        )?
        .first()
        .get_one::<f64>()
        .or_else(|e| match e {
            pgrx::spi::SpiError::InvalidPosition => Ok(None),
            e => Err(e),
        })
    })
    .ok()
    .flatten()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    /// Fill a stretch of the stack with `byte`, where the next call's frame will be.
    #[inline(never)]
    fn dirty_stack(byte: u8) -> u8 {
        let mut a = [byte; 8192];
        std::hint::black_box(&mut a);
        a[100]
    }

    /// The bytes the shared hash table hashes and compares for a key (HASH_BLOBS).
    #[inline(never)]
    fn key_bytes(scope: &str, consumer: &str) -> Vec<u8> {
        let k = Key::new(pg_sys::Oid::from(1u32), scope, consumer);
        // SAFETY: reads size_of::<Key>() bytes of a live Key, as hash_search does.
        unsafe {
            std::slice::from_raw_parts((&k as *const Key).cast::<u8>(), std::mem::size_of::<Key>())
        }
        .to_vec()
    }

    /// Two keys for the same database, scope and consumer are the same bytes, whatever was
    /// on the stack before (no uninitialised padding is hashed).
    #[pg_test]
    fn equal_keys_are_equal_bytes() {
        dirty_stack(0xAA);
        let a = key_bytes("scope", "consumer");
        dirty_stack(0x55);
        let b = key_bytes("scope", "consumer");
        assert_eq!(a, b);
    }

    /// The table of counters and `dedup.stats_counters` agree: its columns after the key's
    /// are the table's counters that have a column, in the table's order, each of the type
    /// its `Shown` says. A counter added to the table and not to the function (or the
    /// reverse) fails here.
    #[pg_test]
    fn the_counters_are_the_functions_columns() {
        let columns: Vec<(String, String)> = Spi::connect(|c| {
            c.select(
                "SELECT a.name::text, pg_catalog.format_type(a.type, NULL) \
                   FROM pg_catalog.pg_proc AS p, \
                        unnest(p.proargnames, p.proallargtypes, p.proargmodes) \
                            WITH ORDINALITY AS a(name, type, mode, n) \
                  WHERE p.oid = 'dedup.stats_counters()'::pg_catalog.regprocedure \
                    AND a.mode = 't' ORDER BY a.n",
                None,
                &[],
            )?
            .map(|row| {
                Ok((
                    row.get::<String>(1)?.unwrap(),
                    row.get::<String>(2)?.unwrap(),
                ))
            })
            .collect::<Result<Vec<_>, pgrx::spi::SpiError>>()
        })
        .unwrap();
        let key = ["datname", "scope", "consumer"];
        assert_eq!(
            columns
                .iter()
                .take(3)
                .map(|c| c.0.as_str())
                .collect::<Vec<_>>(),
            key
        );
        let shown: Vec<(String, String)> = COUNTERS
            .iter()
            .filter(|c| !c.column.is_empty())
            .map(|c| {
                let t = match c.shown {
                    Shown::Count => "bigint",
                    Shown::Time => "timestamp with time zone",
                    Shown::Millis | Shown::Micros => "interval",
                    Shown::Billionths => "double precision",
                    Shown::Buckets => "bigint[]",
                };
                (c.column.to_string(), t.to_string())
            })
            .collect();
        assert_eq!(columns[3..].to_vec(), shown);
    }

    /// The table lays its counters end to end: each starts where the one before it ends,
    /// and an entry holds them all (the counter file's layout).
    #[pg_test]
    fn the_counters_are_laid_end_to_end() {
        let mut at = 0;
        for c in COUNTERS {
            assert_eq!(c.at, at, "{}", c.column);
            assert!(c.len >= 1);
            at += c.len;
        }
        assert_eq!(at, VALUES);
        assert_eq!(AGES.len, AGE_BOUNDS.len() + 1);
    }

    /// A version 3 counter file of one entry with `values` counters, checksummed.
    fn file_of(values: usize) -> Vec<u8> {
        let key = key_bytes("scope", "consumer");
        let mut out = Vec::new();
        for v in [FILE_MAGIC, FILE_VERSION, key.len() as u32, values as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0u64, 0, 1] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&key);
        for n in 0..values as u64 {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&checksum(&out).to_le_bytes());
        out
    }

    /// A version 3 file holds every counter of the table, or the first ones of it (written
    /// before a counter was added at the end, at least the 25 of 0.6.0): read. One with
    /// more counters than the table (from a later dedup) or fewer than 0.6.0's: refused.
    #[pg_test]
    fn a_counter_file_of_fewer_counters_is_read_and_of_more_refused() {
        assert_eq!(check_file(&file_of(VALUES)), Ok((1, VALUES)));
        assert_eq!(check_file(&file_of(VALUES_V3)), Ok((1, VALUES_V3)));
        for values in [VALUES + 1, VALUES_V3 - 1] {
            assert_eq!(
                check_file(&file_of(values)),
                Err("entries of another layout".to_string()),
                "{values} counters"
            );
        }
    }
}
