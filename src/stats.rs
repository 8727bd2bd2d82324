//! The guide's diagnostic hook: how many claims each consumer won, and how many copies it
//! skipped, per database and scope.
//!
//! The counters live in shared memory (with `shared_preload_libraries = 'dedup'`): a hash
//! table of at most `dedup.stats_max` entries, keyed by database, scope and consumer. A
//! backend looks an entry up once, under a shared lock, and keeps its address; after that a
//! claim updates the entry's counters with atomic additions, without any lock. The table's
//! lock is taken exclusively only to add an entry (evicting the least recently used one when
//! full) or to reset. Every entry carries a generation number that changes when its slot is
//! reused, so a backend never counts into an entry that was evicted under it (except in the
//! instant between its check and its addition: a miscount of one, under eviction churn).
//!
//! The table is written to `pg_stat/dedup.stat` when the server shuts down cleanly and read
//! back at start, as pg_stat_statements does.
use crate::error;
use crate::guc;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::sync::atomic::{AtomicU64, Ordering};

const MAX_SCOPE: usize = error::MAX_SCOPE_BYTES;
/// application_name and dedup.consumer are names: at most NAMEDATALEN - 1 bytes.
const MAX_CONSUMER: usize = 63;
const STAT_FILE: &str = "pg_stat/dedup.stat";
const STAT_FILE_TMP: &str = "pg_stat/dedup.stat.tmp";
const FILE_MAGIC: u32 = 0x4445_4455; // "DEDU"
const FILE_VERSION: u32 = 1;

/// What a claim or lease call found, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The call took the job: `try_claim` returned true, `lease` acquired it.
    Claim,
    /// The job was done already: `try_claim` returned false at once, `lease` said done.
    Duplicate,
    /// A concurrent holder had it: `try_claim` waited for another transaction's claim and
    /// then returned false; `lease` said busy.
    Busy,
    /// Another payload fingerprint (YD001).
    FingerprintMismatch,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Key {
    dbid: pg_sys::Oid,
    scope_len: u16,
    consumer_len: u16,
    scope: [u8; MAX_SCOPE],
    consumer: [u8; MAX_CONSUMER],
}

impl Key {
    fn new(dbid: pg_sys::Oid, scope: &str, consumer: &str) -> Key {
        let mut k = Key {
            dbid,
            scope_len: 0,
            consumer_len: 0,
            scope: [0; MAX_SCOPE],
            consumer: [0; MAX_CONSUMER],
        };
        let s = &scope.as_bytes()[..scope.len().min(MAX_SCOPE)];
        let c = truncate_utf8(consumer, MAX_CONSUMER).as_bytes();
        k.scope[..s.len()].copy_from_slice(s);
        k.consumer[..c.len()].copy_from_slice(c);
        k.scope_len = s.len() as u16;
        k.consumer_len = c.len() as u16;
        k
    }
    fn scope(&self) -> &str {
        std::str::from_utf8(&self.scope[..self.scope_len as usize]).unwrap_or("")
    }
    fn consumer(&self) -> &str {
        std::str::from_utf8(&self.consumer[..self.consumer_len as usize]).unwrap_or("")
    }
    fn same(&self, dbid: pg_sys::Oid, scope: &str, consumer: &str) -> bool {
        self.dbid == dbid
            && self.scope() == scope
            && self.consumer() == truncate_utf8(consumer, MAX_CONSUMER)
    }
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One entry of the shared hash table (the key must come first).
#[repr(C)]
struct Entry {
    key: Key,
    generation: AtomicU64,
    claims: AtomicU64,
    duplicates: AtomicU64,
    busy: AtomicU64,
    mismatches: AtomicU64,
    /// Timestamps (microseconds since 2000-01-01, as timestamptz); 0 = never.
    last_claim_at: AtomicU64,
    last_duplicate_at: AtomicU64,
    /// The last fingerprint mismatch: with the two above, what eviction goes by.
    last_used_at: AtomicU64,
}

/// The shared state besides the hash table.
#[repr(C)]
struct Shared {
    lock: *mut pg_sys::LWLock,
    next_generation: AtomicU64,
    evictions: AtomicU64,
    reset_at: AtomicU64,
}

static mut SHARED: *mut Shared = std::ptr::null_mut();
static mut HASH: *mut pg_sys::HTAB = std::ptr::null_mut();
static mut PREV_SHMEM_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// Is counting possible here (the library was preloaded and the shared memory exists)?
pub fn available() -> bool {
    unsafe { !std::ptr::addr_of!(SHARED).read().is_null() }
}

fn max_entries() -> i64 {
    i64::from(guc::STATS_MAX.get())
}

unsafe fn shmem_size() -> usize {
    let hash = pg_sys::hash_estimate_size(max_entries(), std::mem::size_of::<Entry>());
    pg_sys::add_size(hash, std::mem::size_of::<Shared>())
}

/// Ask for the shared memory (from `_PG_init`, while preloading).
pub fn request_shared_memory() {
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        {
            pg_sys::RequestAddinShmemSpace(shmem_size());
            pg_sys::RequestNamedLWLockTranche(c"dedup".as_ptr(), 1);
        }
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            PREV_SHMEM_REQUEST = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(shmem_request);
        }
        PREV_SHMEM_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    if let Some(prev) = PREV_SHMEM_REQUEST {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(shmem_size());
    pg_sys::RequestNamedLWLockTranche(c"dedup".as_ptr(), 1);
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    if let Some(prev) = PREV_SHMEM_STARTUP {
        prev();
    }
    // AddinShmemInitLock (lwlocknames.h): index 21 of the main LWLock array.
    let addin_lock = std::ptr::addr_of_mut!((*pg_sys::MainLWLockArray.add(21)).lock);
    pg_sys::LWLockAcquire(addin_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let shared = pg_sys::ShmemInitStruct(
        c"dedup stats".as_ptr(),
        std::mem::size_of::<Shared>(),
        &mut found,
    )
    .cast::<Shared>();
    if !found {
        shared.write(Shared {
            lock: std::ptr::addr_of_mut!((*pg_sys::GetNamedLWLockTranche(c"dedup".as_ptr())).lock),
            next_generation: AtomicU64::new(1),
            evictions: AtomicU64::new(0),
            reset_at: AtomicU64::new(pg_sys::GetCurrentTimestamp() as u64),
        });
    }
    let mut info = pg_sys::HASHCTL {
        keysize: std::mem::size_of::<Key>(),
        entrysize: std::mem::size_of::<Entry>(),
        ..Default::default()
    };
    let hash = pg_sys::ShmemInitHash(
        c"dedup stats hash".as_ptr(),
        max_entries(),
        max_entries(),
        &mut info,
        (pg_sys::HASH_ELEM | pg_sys::HASH_BLOBS) as i32,
    );
    pg_sys::LWLockRelease(addin_lock);
    SHARED = shared;
    HASH = hash;
    if !pg_sys::IsUnderPostmaster {
        // The postmaster writes the counters out at a clean shutdown.
        pg_sys::on_shmem_exit(Some(write_file_at_exit), pg_sys::Datum::from(0));
    }
    if !found {
        read_file();
    }
}

/// Backend-local: the entry this backend counted into last, and its generation.
struct Cached {
    key: Key,
    entry: *mut Entry,
    generation: u64,
}
static mut LAST: Option<Cached> = None;

/// The consumer's name as the session has it: `dedup.consumer`, else `application_name`.
/// Borrowed from the settings' own storage: counting allocates nothing.
unsafe fn consumer_name<'a>() -> &'a str {
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
    unsafe {
        let dbid = pg_sys::MyDatabaseId;
        let consumer = consumer_name();
        let last = &mut *std::ptr::addr_of_mut!(LAST);
        let entry = match last {
            Some(c)
                if c.key.same(dbid, scope, consumer)
                    && (*c.entry).generation.load(Ordering::Acquire) == c.generation =>
            {
                c.entry
            }
            _ => {
                let key = Key::new(dbid, scope, consumer);
                let Some((entry, generation)) = find_or_add(&key) else {
                    return;
                };
                *last = Some(Cached {
                    key,
                    entry,
                    generation,
                });
                entry
            }
        };
        let now = pg_sys::GetCurrentTransactionStartTimestamp() as u64;
        let e = &*entry;
        match event {
            Event::Claim => {
                e.claims.fetch_add(1, Ordering::Relaxed);
                advance(&e.last_claim_at, now);
            }
            Event::Duplicate | Event::Busy => {
                if event == Event::Duplicate {
                    e.duplicates.fetch_add(1, Ordering::Relaxed);
                } else {
                    e.busy.fetch_add(1, Ordering::Relaxed);
                }
                advance(&e.last_duplicate_at, now);
            }
            Event::FingerprintMismatch => {
                e.mismatches.fetch_add(1, Ordering::Relaxed);
                advance(&e.last_used_at, now);
            }
        }
    }
}

/// The entry for `key` and its generation, added if missing (evicting the least recently
/// used entry when the table is full).
unsafe fn find_or_add(key: &Key) -> Option<(*mut Entry, u64)> {
    let shared = &*SHARED;
    pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_SHARED);
    let mut found = false;
    let e = pg_sys::hash_search(
        HASH,
        (key as *const Key).cast(),
        pg_sys::HASHACTION::HASH_FIND,
        &mut found,
    )
    .cast::<Entry>();
    if !e.is_null() {
        let generation = (*e).generation.load(Ordering::Acquire);
        pg_sys::LWLockRelease(shared.lock);
        return Some((e, generation));
    }
    pg_sys::LWLockRelease(shared.lock);

    pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let mut e = pg_sys::hash_search(
        HASH,
        (key as *const Key).cast(),
        pg_sys::HASHACTION::HASH_FIND,
        &mut found,
    )
    .cast::<Entry>();
    if e.is_null() {
        if pg_sys::hash_get_num_entries(HASH) >= max_entries() {
            evict_least_recently_used();
        }
        e = pg_sys::hash_search(
            HASH,
            (key as *const Key).cast(),
            pg_sys::HASHACTION::HASH_ENTER_NULL,
            &mut found,
        )
        .cast::<Entry>();
        if !e.is_null() {
            init_entry(e, shared.next_generation.fetch_add(1, Ordering::Relaxed));
        }
    }
    let result = (!e.is_null()).then(|| (e, (*e).generation.load(Ordering::Acquire)));
    pg_sys::LWLockRelease(shared.lock);
    result
}

unsafe fn init_entry(e: *mut Entry, generation: u64) {
    // The key was copied in by hash_search; the rest is ours.
    std::ptr::addr_of_mut!((*e).generation).write(AtomicU64::new(generation));
    for f in [
        std::ptr::addr_of_mut!((*e).claims),
        std::ptr::addr_of_mut!((*e).duplicates),
        std::ptr::addr_of_mut!((*e).busy),
        std::ptr::addr_of_mut!((*e).mismatches),
        std::ptr::addr_of_mut!((*e).last_claim_at),
        std::ptr::addr_of_mut!((*e).last_duplicate_at),
        std::ptr::addr_of_mut!((*e).last_used_at),
    ] {
        f.write(AtomicU64::new(0));
    }
}

/// Every entry (call with the lock held).
unsafe fn entries() -> Vec<*mut Entry> {
    let mut status = pg_sys::HASH_SEQ_STATUS::default();
    pg_sys::hash_seq_init(&mut status, HASH);
    let mut all = Vec::new();
    loop {
        let e = pg_sys::hash_seq_search(&mut status).cast::<Entry>();
        if e.is_null() {
            break;
        }
        all.push(e);
    }
    all
}

/// Remove an entry (call with the lock held exclusively): its generation changes first, so
/// backends that cached it look it up again.
unsafe fn remove(e: *mut Entry) {
    (*e).generation.store(0, Ordering::Release);
    let key = (*e).key;
    let mut found = false;
    pg_sys::hash_search(
        HASH,
        (&key as *const Key).cast(),
        pg_sys::HASHACTION::HASH_REMOVE,
        &mut found,
    );
}

unsafe fn evict_least_recently_used() {
    // Least recently used: by the latest of its three times.
    let last_used = |e: &Entry| {
        [&e.last_claim_at, &e.last_duplicate_at, &e.last_used_at]
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    };
    let victim = entries().into_iter().min_by_key(|e| last_used(&**e));
    if let Some(e) = victim {
        remove(e);
        (*SHARED).evictions.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of one entry, for the view.
pub struct Row {
    pub dbid: pg_sys::Oid,
    pub scope: String,
    pub consumer: String,
    pub claims: i64,
    pub duplicates: i64,
    pub busy: i64,
    pub mismatches: i64,
    pub last_claim_at: Option<i64>,
    pub last_duplicate_at: Option<i64>,
}

fn ts(v: u64) -> Option<i64> {
    (v != 0).then_some(v as i64)
}

/// Every entry, copied out under the shared lock.
pub fn rows() -> Vec<Row> {
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_SHARED);
        let rows = entries()
            .into_iter()
            .map(|e| {
                let e = &*e;
                Row {
                    dbid: e.key.dbid,
                    scope: e.key.scope().to_string(),
                    consumer: e.key.consumer().to_string(),
                    claims: e.claims.load(Ordering::Relaxed) as i64,
                    duplicates: e.duplicates.load(Ordering::Relaxed) as i64,
                    busy: e.busy.load(Ordering::Relaxed) as i64,
                    mismatches: e.mismatches.load(Ordering::Relaxed) as i64,
                    last_claim_at: ts(e.last_claim_at.load(Ordering::Relaxed)),
                    last_duplicate_at: ts(e.last_duplicate_at.load(Ordering::Relaxed)),
                }
            })
            .collect();
        pg_sys::LWLockRelease(shared.lock);
        rows
    }
}

/// (entries, evictions, reset_at)
pub fn info() -> (i64, i64, i64) {
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_SHARED);
        let n = pg_sys::hash_get_num_entries(HASH);
        pg_sys::LWLockRelease(shared.lock);
        (
            n,
            shared.evictions.load(Ordering::Relaxed) as i64,
            shared.reset_at.load(Ordering::Relaxed) as i64,
        )
    }
}

/// Forget every counter.
pub fn reset() {
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        for e in entries() {
            remove(e);
        }
        shared.evictions.store(0, Ordering::Relaxed);
        shared
            .reset_at
            .store(pg_sys::GetCurrentTimestamp() as u64, Ordering::Relaxed);
        pg_sys::LWLockRelease(shared.lock);
    }
}

// --- the file -------------------------------------------------------------------------

const VALUES: usize = 6;

#[pg_guard]
unsafe extern "C-unwind" fn write_file_at_exit(code: i32, _arg: pg_sys::Datum) {
    // Not after a crash: the counters may be half-written.
    if code != 0 || SHARED.is_null() {
        return;
    }
    let mut out = Vec::new();
    out.extend_from_slice(&FILE_MAGIC.to_le_bytes());
    out.extend_from_slice(&FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&((*SHARED).evictions.load(Ordering::Relaxed)).to_le_bytes());
    out.extend_from_slice(&((*SHARED).reset_at.load(Ordering::Relaxed)).to_le_bytes());
    let all = entries();
    out.extend_from_slice(&(all.len() as u64).to_le_bytes());
    for e in all {
        let e = &*e;
        let key = std::slice::from_raw_parts(
            (&e.key as *const Key).cast::<u8>(),
            std::mem::size_of::<Key>(),
        );
        out.extend_from_slice(key);
        for v in [
            &e.claims,
            &e.duplicates,
            &e.busy,
            &e.mismatches,
            &e.last_claim_at,
            &e.last_duplicate_at,
        ] {
            out.extend_from_slice(&v.load(Ordering::Relaxed).to_le_bytes());
        }
    }
    let written =
        std::fs::write(STAT_FILE_TMP, &out).and_then(|_| std::fs::rename(STAT_FILE_TMP, STAT_FILE));
    if let Err(e) = written {
        log!("dedup: could not write {STAT_FILE}: {e}");
    }
}

/// Load the counters saved at the last clean shutdown, then remove the file (it would be
/// stale after a crash).
unsafe fn read_file() {
    let Ok(data) = std::fs::read(STAT_FILE) else {
        return;
    };
    let _ = std::fs::remove_file(STAT_FILE);
    let key_size = std::mem::size_of::<Key>();
    let mut at = 0;
    let mut take = |n: usize| -> Option<&[u8]> {
        let slice = data.get(at..at + n)?;
        at += n;
        Some(slice)
    };
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    let (Some(magic), Some(version)) = (take(4), take(4)) else {
        return;
    };
    if u32_at(magic) != FILE_MAGIC || u32_at(version) != FILE_VERSION {
        log!("dedup: ignoring {STAT_FILE}: not a file of this version");
        return;
    }
    let (Some(evictions), Some(reset_at), Some(count)) = (take(8), take(8), take(8)) else {
        return;
    };
    (*SHARED)
        .evictions
        .store(u64_at(evictions), Ordering::Relaxed);
    (*SHARED)
        .reset_at
        .store(u64_at(reset_at), Ordering::Relaxed);
    for _ in 0..u64_at(count) {
        let (Some(key), Some(values)) = (take(key_size), take(8 * VALUES)) else {
            return;
        };
        if pg_sys::hash_get_num_entries(HASH) >= max_entries() {
            return;
        }
        let mut k = std::mem::MaybeUninit::<Key>::uninit();
        std::ptr::copy_nonoverlapping(key.as_ptr(), k.as_mut_ptr().cast::<u8>(), key_size);
        let k = k.assume_init();
        if k.scope_len as usize > MAX_SCOPE || k.consumer_len as usize > MAX_CONSUMER {
            return;
        }
        let mut found = false;
        let e = pg_sys::hash_search(
            HASH,
            (&k as *const Key).cast(),
            pg_sys::HASHACTION::HASH_ENTER_NULL,
            &mut found,
        )
        .cast::<Entry>();
        if e.is_null() {
            return;
        }
        init_entry(e, (*SHARED).next_generation.fetch_add(1, Ordering::Relaxed));
        let v: Vec<u64> = values.chunks(8).map(u64_at).collect();
        let e = &*e;
        e.claims.store(v[0], Ordering::Relaxed);
        e.duplicates.store(v[1], Ordering::Relaxed);
        e.busy.store(v[2], Ordering::Relaxed);
        e.mismatches.store(v[3], Ordering::Relaxed);
        e.last_claim_at.store(v[4], Ordering::Relaxed);
        e.last_duplicate_at.store(v[5], Ordering::Relaxed);
        e.last_used_at.store(0, Ordering::Relaxed);
    }
}

// --- SQL ------------------------------------------------------------------------------

fn warn_not_preloaded(func: &str) {
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
fn stats_counters() -> TableIterator<
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
    ),
> {
    if !available() {
        warn_not_preloaded("dedup.stats");
        return TableIterator::new(Vec::new());
    }
    let to_ts = |t: Option<i64>| t.and_then(|t| TimestampWithTimeZone::try_from(t).ok());
    let rows: Vec<_> = rows()
        .into_iter()
        .map(|r| {
            let datname = unsafe {
                let n = pg_sys::get_database_name(r.dbid);
                (!n.is_null()).then(|| std::ffi::CStr::from_ptr(n).to_string_lossy().into_owned())
            };
            (
                datname,
                r.scope,
                r.consumer,
                r.claims,
                r.duplicates,
                r.busy,
                r.mismatches,
                to_ts(r.last_claim_at),
                to_ts(r.last_duplicate_at),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// `dedup.stats_info()`: the size of the counter table and when it was last reset.
#[pg_extern(volatile, parallel_restricted)]
fn stats_info() -> TableIterator<
    'static,
    (
        name!(counting, bool),
        name!(entries, i64),
        name!(max_entries, i64),
        name!(evictions, i64),
        name!(reset_at, Option<TimestampWithTimeZone>),
    ),
> {
    if !available() {
        warn_not_preloaded("dedup.stats_info");
        return TableIterator::once((false, 0, max_entries(), 0, None));
    }
    let (entries, evictions, reset_at) = info();
    TableIterator::once((
        guc::TRACK_STATS.get(),
        entries,
        max_entries(),
        evictions,
        TimestampWithTimeZone::try_from(reset_at).ok(),
    ))
}

/// `dedup.stats_reset()`: forget every counter.
#[pg_extern(volatile, parallel_unsafe)]
fn stats_reset() {
    if !available() {
        warn_not_preloaded("dedup.stats_reset");
        return;
    }
    reset();
}

/// `dedup._count(scope, event)`: count a lease call (the lease functions are PL/pgSQL).
#[pg_extern(name = "_count", volatile, parallel_unsafe)]
fn count_event(scope: &str, event: &str) {
    let event = match event {
        "acquired" => Event::Claim,
        "done" => Event::Duplicate,
        "busy" => Event::Busy,
        "fingerprint_mismatch" => Event::FingerprintMismatch,
        other => pgrx::error!("dedup._count: unknown event {other:?}"),
    };
    count(scope, event);
}

// 0.4.0: the view dedup.stats, and dedup.lease counting its outcomes.
extension_sql_file!(
    "../sql/stats.sql",
    name = "stats",
    requires = [
        "leases",
        stats_counters,
        stats_info,
        stats_reset,
        count_event
    ]
);

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

    /// Issue 11, finding 8: two keys for the same database, scope and consumer are the same
    /// bytes, whatever was on the stack before (no uninitialised padding is hashed).
    #[pg_test]
    fn equal_keys_are_equal_bytes() {
        dirty_stack(0xAA);
        let a = key_bytes("scope", "consumer");
        dirty_stack(0x55);
        let b = key_bytes("scope", "consumer");
        assert_eq!(a, b);
    }
}
