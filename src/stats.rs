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

const MAX_SCOPE: usize = error::MAX_SCOPE_BYTES;
/// application_name and dedup.consumer are names: at most NAMEDATALEN - 1 bytes.
const MAX_CONSUMER: usize = 63;
const STAT_FILE: &str = "pg_stat/dedup.stat";
const STAT_FILE_TMP: &str = "pg_stat/dedup.stat.tmp";
const FILE_MAGIC: u32 = 0x4445_4455; // "DEDU"
/// 1: 0.4.0 (no layout, no checksum); 2: 0.5.0; 3: 0.6.0 (duplicate ages and
/// waits). A version 2 file is read; others are refused.
const FILE_VERSION: u32 = 3;
/// The scope the overflow entry is shown under (a claim's scope is never empty, so the
/// entry's key, with an empty scope, is no real combination's).
pub const OVERFLOW_SCOPE: &str = "(overflow)";

/// What a claim or lease call found, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The call took the job: `try_claim` returned true, `lease` acquired it.
    Claim,
    /// `n` jobs of one `try_claim_many` call taken (counted once per batch, as n claims).
    Claims(u64),
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
const _: () = assert!(
    VALUES == 15 + AGE_BUCKETS,
    "Entry::values lists every counter"
);

/// The consumer's field: a name of at most [`MAX_CONSUMER`] bytes and one zero byte, which
/// makes the key 200 bytes with no padding.
const CONSUMER_FIELD: usize = MAX_CONSUMER + 1;

/// The hash key. The shared table hashes and compares its bytes (`HASH_BLOBS`), so every
/// byte must be one that [`Key::new`] wrote: the struct has no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy)]
struct Key {
    dbid: pg_sys::Oid,
    scope_len: u16,
    consumer_len: u16,
    scope: [u8; MAX_SCOPE],
    consumer: [u8; CONSUMER_FIELD],
}

const _: () = assert!(
    std::mem::size_of::<Key>()
        == std::mem::size_of::<pg_sys::Oid>() + 2 + 2 + MAX_SCOPE + CONSUMER_FIELD,
    "stats::Key must have no padding: its bytes are hashed"
);

impl Key {
    fn new(dbid: pg_sys::Oid, scope: &str, consumer: &str) -> Key {
        let mut k = Key {
            dbid,
            scope_len: 0,
            consumer_len: 0,
            scope: [0; MAX_SCOPE],
            consumer: [0; CONSUMER_FIELD],
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
    /// The last fingerprint mismatch.
    last_used_at: AtomicU64,
    /// Duplicates (and busy copies) whose claim was older than half its scope's retention.
    late_duplicates: AtomicU64,
    /// Ages of the claims duplicates hit: their sum (milliseconds, so that a million
    /// copies a day of day-old claims take centuries to overflow), the largest
    /// (microseconds), and a count per bucket of AGE_BOUNDS.
    age_sum: AtomicU64,
    age_max: AtomicU64,
    ages: [AtomicU64; AGE_BUCKETS],
    /// Claims that waited for a concurrent holder of the same job: how many, and the time
    /// waited (microseconds): in all, and the longest.
    waits: AtomicU64,
    wait_sum: AtomicU64,
    wait_max: AtomicU64,
    /// try_claim_many calls, and dedup.advance calls that raised a mark.
    batches: AtomicU64,
    advances: AtomicU64,
}

impl Entry {
    /// Every counter, in the order of the counter file (version 3); the first six are
    /// version 2's.
    ///
    /// # Safety
    ///
    /// `e` points to an entry of the shared table (its counters are atomics).
    unsafe fn values<'a>(e: *const Entry) -> [&'a AtomicU64; VALUES] {
        let f = |p: *const AtomicU64| &*p;
        let a = std::ptr::addr_of!((*e).ages).cast::<AtomicU64>();
        [
            f(std::ptr::addr_of!((*e).claims)),
            f(std::ptr::addr_of!((*e).duplicates)),
            f(std::ptr::addr_of!((*e).busy)),
            f(std::ptr::addr_of!((*e).mismatches)),
            f(std::ptr::addr_of!((*e).last_claim_at)),
            f(std::ptr::addr_of!((*e).last_duplicate_at)),
            f(std::ptr::addr_of!((*e).last_used_at)),
            f(std::ptr::addr_of!((*e).late_duplicates)),
            f(std::ptr::addr_of!((*e).age_sum)),
            f(std::ptr::addr_of!((*e).age_max)),
            f(a),
            f(a.add(1)),
            f(a.add(2)),
            f(a.add(3)),
            f(a.add(4)),
            f(a.add(5)),
            f(a.add(6)),
            f(a.add(7)),
            f(a.add(8)),
            f(a.add(9)),
            f(std::ptr::addr_of!((*e).waits)),
            f(std::ptr::addr_of!((*e).wait_sum)),
            f(std::ptr::addr_of!((*e).wait_max)),
            f(std::ptr::addr_of!((*e).batches)),
            f(std::ptr::addr_of!((*e).advances)),
        ]
    }
}

/// The shared state besides the hash table.
#[repr(C)]
struct Shared {
    lock: *mut pg_sys::LWLock,
    next_generation: AtomicU64,
    /// Calls counted in the overflow entry.
    overflowed: AtomicU64,
    reset_at: AtomicU64,
    /// The entry that counts the combinations that found the table full.
    overflow: *mut Entry,
}

static mut SHARED: *mut Shared = std::ptr::null_mut();
static mut HASH: *mut pg_sys::HTAB = std::ptr::null_mut();
static mut PREV_SHMEM_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// Is counting possible here (the library was preloaded and the shared memory exists)?
pub fn available() -> bool {
    // SAFETY: SHARED is written only by shmem_startup in the postmaster (before any backend
    // is forked, which inherits it) and read here by value through a raw pointer, on the
    // process's only thread: no reference to the static mut is made.
    unsafe { !std::ptr::addr_of!(SHARED).read().is_null() }
}

fn max_entries() -> i64 {
    i64::from(guc::STATS_MAX.get())
}

/// # Safety
///
/// Call on the postmaster's thread while it sizes shared memory (from shmem_request, or
/// _PG_init before PostgreSQL 15), under a #[pg_guard]: hash_estimate_size only computes,
/// and add_size raises an ERROR on size_t overflow, which that guard re-raises.
unsafe fn shmem_size() -> usize {
    // SAFETY: the contract above; both calls take sizes by value and no pointer.
    let hash = pg_sys::hash_estimate_size(max_entries(), std::mem::size_of::<Entry>());
    pg_sys::add_size(hash, std::mem::size_of::<Shared>())
}

/// Ask for the shared memory (from `_PG_init`, while preloading).
pub fn request_shared_memory() {
    // SAFETY: called once, from _PG_init (a #[pg_guard] function) in the postmaster while
    // shared_preload_libraries loads, on its only thread, before any backend exists: the
    // hook variables (PostgreSQL globals) and our PREV_* statics are read and written with
    // no concurrent access. The previous hooks are saved and chained by ours; the shared
    // memory itself is requested in shmem_request, as PostgreSQL 15 and later require.
    unsafe {
        PREV_SHMEM_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

/// # Safety
///
/// Called only by PostgreSQL, as shmem_request_hook, once in the postmaster (on its only
/// thread) while it sizes shared memory. The #[pg_guard] turns an ERROR (add_size's
/// overflow) or a panic into a PostgreSQL ERROR raised from this frame (fatal this early
/// in the postmaster), never an unwind into C.
#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: PREV_SHMEM_REQUEST is read by value, written only by request_shared_memory
    // before this hook can run; the previous hook is a valid C function pointer (or None).
    // RequestAddinShmemSpace and RequestNamedLWLockTranche only record the request (the
    // latter copies the tranche name); both are allowed here, inside shmem_request_hook.
    if let Some(prev) = PREV_SHMEM_REQUEST {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(shmem_size());
    pg_sys::RequestNamedLWLockTranche(c"dedup".as_ptr(), 1);
}

/// # Safety
///
/// Called only by PostgreSQL, as shmem_startup_hook, after the shared memory segment was
/// made: in the postmaster (on its only thread) at start and at each crash restart, and in
/// each child under EXEC_BACKEND. The #[pg_guard] turns an ERROR (out of shared memory in
/// ShmemInitStruct, ShmemInitHash or hash_search, an unregistered tranche) or a panic into
/// a PostgreSQL ERROR raised from this frame (fatal at postmaster start), never an unwind
/// into C.
#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: PREV_SHMEM_STARTUP is read by value, written only before this hook can run;
    // the previous hook is a valid C function pointer (or None).
    if let Some(prev) = PREV_SHMEM_STARTUP {
        prev();
    }
    // AddinShmemInitLock (lwlocknames.h): index 21 of the main LWLock array.
    // SAFETY: MainLWLockArray is in shared memory, made before this hook runs, and index
    // 21 is AddinShmemInitLock (lwlocknames.h of PostgreSQL 15, lwlocklist.h from 17);
    // the lock serialises ShmemInitStruct and ShmemInitHash with other modules' startup
    // hooks, as PostgreSQL requires, and is released below (on an ERROR, the process ends
    // or LWLockReleaseAll runs). ShmemInitStruct returns the named struct in shared memory,
    // MAXALIGNed, valid for the life of the postmaster (and its children); `found` says
    // whether it was made already (then it is already initialised: never rewritten).
    let addin_lock = std::ptr::addr_of_mut!((*pg_sys::MainLWLockArray.add(21)).lock);
    pg_sys::LWLockAcquire(addin_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let shared = pg_sys::ShmemInitStruct(
        c"dedup stats".as_ptr(),
        std::mem::size_of::<Shared>(),
        &mut found,
    )
    .cast::<Shared>();
    // SAFETY: on first creation the struct's memory is uninitialised and written whole with
    // `write` (no drop of garbage). GetNamedLWLockTranche returns the tranche requested in
    // shmem_request (an ERROR if not), an array in shared memory; we keep a pointer to its
    // first lock. GetCurrentTimestamp only reads the clock.
    if !found {
        shared.write(Shared {
            lock: std::ptr::addr_of_mut!((*pg_sys::GetNamedLWLockTranche(c"dedup".as_ptr())).lock),
            next_generation: AtomicU64::new(1),
            overflowed: AtomicU64::new(0),
            reset_at: AtomicU64::new(pg_sys::GetCurrentTimestamp() as u64),
            overflow: std::ptr::null_mut(),
        });
    }
    let mut info = pg_sys::HASHCTL {
        keysize: std::mem::size_of::<Key>(),
        entrysize: std::mem::size_of::<Entry>(),
        ..Default::default()
    };
    // SAFETY: ShmemInitHash makes (or attaches to) the named table in shared memory, with
    // max_entries() entries preallocated (init_size = max_size), keys of size_of::<Key>()
    // compared as bytes (HASH_BLOBS) and entries of size_of::<Entry>(); `info` is read
    // during the call only. The HTAB header it returns lives in TopMemoryContext of this
    // process (inherited by forked backends), for the life of the process.
    let hash = pg_sys::ShmemInitHash(
        c"dedup stats hash".as_ptr(),
        max_entries(),
        max_entries(),
        &mut info,
        (pg_sys::HASH_ELEM | pg_sys::HASH_BLOBS) as i32,
    );
    if !found {
        // The overflow entry takes its slot first, so it always has one.
        // SAFETY: hash_search(HASH_ENTER) copies the key's bytes (a fully written Key, no
        // padding) into a fresh entry of the empty, preallocated table (so no "out of shared
        // memory" ERROR) and returns it, MAXALIGNed, the key first as Entry's repr(C) layout
        // has it; init_entry writes the rest. No backend exists yet to race with.
        let key = overflow_key();
        let mut entered = false;
        let e = pg_sys::hash_search(
            hash,
            (&key as *const Key).cast(),
            pg_sys::HASHACTION::HASH_ENTER,
            &mut entered,
        )
        .cast::<Entry>();
        init_entry(e, (*shared).next_generation.fetch_add(1, Ordering::Relaxed));
        (*shared).overflow = e;
    }
    // SAFETY: SHARED and HASH are this process's statics, written here on its only thread
    // before any backend is forked (children inherit them). on_shmem_exit keeps the
    // function pointer (out of slots, it raises a FATAL, which ends the postmaster); its
    // callbacks run once at shmem_exit, which also empties the list, so a crash restart
    // registers it anew. read_file runs in the postmaster before any backend exists.
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

fn overflow_key() -> Key {
    Key::new(pg_sys::InvalidOid, "", "")
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
    // dedup._count), with SHARED and HASH set (available()). MyDatabaseId is a global read.
    // consumer_name's &str is used (and copied into a Key) before any setting can change.
    // LAST is backend-local: the &mut to it is the only one while it lives (nothing below
    // calls count() again). A cached entry pointer stays in mapped shared memory for the
    // postmaster's life, even if a reset removed the entry: its generation is read
    // atomically and compared before it is used, and find_or_add otherwise returns a live
    // entry; the counters are atomics, shared across processes with no lock.
    // GetCurrentTransactionStartTimestamp only returns a global (no ERROR).
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
        if entry == (*SHARED).overflow {
            (*SHARED).overflowed.fetch_add(1, Ordering::Relaxed);
        }
        // Each counter through its own reference, never one to the whole Entry: a reset in
        // another backend may be rewriting this slot's key (the miscount of one the module
        // accepts), and a reference to the Entry would assert that nobody writes it.
        let field = |f: *const AtomicU64| &*f;
        match event {
            Event::Claim | Event::Claims(_) => {
                let n = if let Event::Claims(n) = event { n } else { 1 };
                field(std::ptr::addr_of!((*entry).claims)).fetch_add(n, Ordering::Relaxed);
                advance(field(std::ptr::addr_of!((*entry).last_claim_at)), now);
            }
            Event::Duplicate { claimed_at } | Event::Busy { claimed_at, .. } => {
                let counter = if matches!(event, Event::Duplicate { .. }) {
                    std::ptr::addr_of!((*entry).duplicates)
                } else {
                    std::ptr::addr_of!((*entry).busy)
                };
                field(counter).fetch_add(1, Ordering::Relaxed);
                advance(field(std::ptr::addr_of!((*entry).last_duplicate_at)), now);
                if claimed_at > 0 {
                    // The age of the claim this copy hit, when the copy's transaction began
                    // (a claim made after that, by a concurrent transaction, is age 0).
                    let age = (now as i64 - claimed_at).max(0) as u64;
                    field(std::ptr::addr_of!((*entry).age_sum))
                        .fetch_add(age / 1000, Ordering::Relaxed);
                    field(std::ptr::addr_of!((*entry).age_max)).fetch_max(age, Ordering::Relaxed);
                    let bucket = AGE_BOUNDS
                        .iter()
                        .position(|b| age <= b * 1_000_000)
                        .unwrap_or(AGE_BOUNDS.len());
                    field(
                        std::ptr::addr_of!((*entry).ages)
                            .cast::<AtomicU64>()
                            .add(bucket),
                    )
                    .fetch_add(1, Ordering::Relaxed);
                    if age > late_after(scope) {
                        field(std::ptr::addr_of!((*entry).late_duplicates))
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
                if let Event::Busy { waited, .. } = event {
                    if waited > 0 {
                        let waited = waited as u64;
                        field(std::ptr::addr_of!((*entry).waits)).fetch_add(1, Ordering::Relaxed);
                        field(std::ptr::addr_of!((*entry).wait_sum))
                            .fetch_add(waited, Ordering::Relaxed);
                        field(std::ptr::addr_of!((*entry).wait_max))
                            .fetch_max(waited, Ordering::Relaxed);
                    }
                }
            }
            Event::FingerprintMismatch => {
                field(std::ptr::addr_of!((*entry).mismatches)).fetch_add(1, Ordering::Relaxed);
                advance(field(std::ptr::addr_of!((*entry).last_used_at)), now);
            }
            Event::Batch => {
                field(std::ptr::addr_of!((*entry).batches)).fetch_add(1, Ordering::Relaxed);
            }
            Event::Advance { raised: true } => {
                field(std::ptr::addr_of!((*entry).advances)).fetch_add(1, Ordering::Relaxed);
                advance(field(std::ptr::addr_of!((*entry).last_claim_at)), now);
            }
            Event::Advance { raised: false } => {
                field(std::ptr::addr_of!((*entry).duplicates)).fetch_add(1, Ordering::Relaxed);
                advance(field(std::ptr::addr_of!((*entry).last_duplicate_at)), now);
            }
        }
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

/// The entry for `key` and its generation, added if missing; the overflow entry when the
/// table is full. One hash lookup, or two and an insertion: never a scan. The exclusive
/// lock is taken only when the key is missing and the table has room for it: a full table
/// is seen under the shared lock: otherwise a stream of new names, each taking the lock
/// exclusively, would queue behind every reader of dedup.stats, and every other lookup
/// behind them (stats::a_full_counter_table_is_never_locked_exclusively).
///
/// # Safety
///
/// SHARED and HASH must be set (available()), on the backend's main thread, under pgrx's
/// guard (LWLockAcquire raises an ERROR only when too many LWLocks are held; the abort's
/// LWLockReleaseAll would release ours). The entry returned points into shared memory,
/// mapped for the postmaster's life; it is counted into only while its generation matches.
unsafe fn find_or_add(key: &Key) -> Option<(*mut Entry, u64)> {
    // SAFETY: `shared` is a shared reference to the Shared struct in shared memory: its
    // `lock` and `overflow` fields are written only in shmem_startup, the others are
    // atomics. Every hash_search is made with the table's lock held (shared for
    // HASH_FIND, exclusive to insert), `key` is a full Key read during the call only;
    // HASH_ENTER_NULL returns NULL instead of raising an ERROR when no entry is free, and
    // the entry count is checked against max_entries() first. init_entry runs with the
    // lock held exclusively on an entry just made. hash_get_num_entries reads the table's
    // count, which changes only under the exclusive lock (entries are added and removed
    // under it alone), so under the shared lock it cannot change until we release it.
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
    // Missing, and the table is full: no entry can be added or removed while we hold the
    // shared lock, so the exclusive one would find the same. The overflow entry's
    // generation, read under this lock, changes at a reset and when forget_databases makes
    // room, so a backend that caches it looks the key up again then.
    if pg_sys::hash_get_num_entries(HASH) >= max_entries() {
        let e = shared.overflow;
        let result = (!e.is_null()).then(|| (e, (*e).generation.load(Ordering::Acquire)));
        pg_sys::LWLockRelease(shared.lock);
        return result;
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
    if e.is_null() && pg_sys::hash_get_num_entries(HASH) < max_entries() {
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
    if e.is_null() {
        e = shared.overflow;
    }
    let result = (!e.is_null()).then(|| (e, (*e).generation.load(Ordering::Acquire)));
    pg_sys::LWLockRelease(shared.lock);
    result
}

/// # Safety
///
/// `e` points to an Entry in the shared hash table (its key already copied in by
/// hash_search), and the table's lock is held exclusively (or no other process exists
/// yet). The fields are set with atomic stores, never plain writes: a backend that checked
/// this entry's generation just before a reset may still be adding to a counter of the
/// overflow entry (or of a slot reused after HASH_REMOVE) while it is rewritten (the
/// miscount of one the module documentation accepts), and an atomic store racing atomic
/// additions is defined behaviour where a plain write is not. The generation is stored
/// last, with Release: whoever sees it sees the zeroed counters.
unsafe fn init_entry(e: *mut Entry, generation: u64) {
    // SAFETY: the contract above. AtomicU64 has no invalid bit patterns, so a slot's bytes
    // (initialised or not by a previous user) are a valid AtomicU64 to store into; the
    // references live only for the store.
    for f in Entry::values(e) {
        f.store(0, Ordering::Relaxed);
    }
    (*std::ptr::addr_of!((*e).generation)).store(generation, Ordering::Release);
}

/// Every entry (call with the lock held).
///
/// # Safety
///
/// HASH must be set, and the table's lock held (shared or exclusive), or no other process
/// may run (the postmaster at exit), so that no entry is added or removed during the scan.
/// The scan runs to its end (hash_seq_search returns NULL), which deregisters it; the
/// pointers returned are valid while the lock is held.
unsafe fn entries() -> Vec<*mut Entry> {
    // SAFETY: the contract above; `status` is a local that lives through the scan.
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
/// backends that cached it look it up again. The overflow entry stays, its counters zeroed.
///
/// # Safety
///
/// `e` is a live entry of the table (from entries()), SHARED and HASH are set, and the
/// table's lock is held exclusively. The key is copied out before HASH_REMOVE puts the
/// entry on the free list; `e` must not be used after this call.
unsafe fn remove(e: *mut Entry) {
    if e == (*SHARED).overflow {
        init_entry(e, (*SHARED).next_generation.fetch_add(1, Ordering::Relaxed));
        return;
    }
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

/// The databases that have counters (the overflow entry's none excluded).
pub fn counted_databases() -> Vec<pg_sys::Oid> {
    if !available() {
        return Vec::new();
    }
    // SAFETY: SHARED and HASH are set (available()); the shared lock is held while the
    // entries' keys are read, and released before returning; LWLockAcquire raises no ERROR
    // here (it holds no other LWLock).
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_SHARED);
        let mut dbs: Vec<pg_sys::Oid> = entries()
            .into_iter()
            .map(|e| (*e).key.dbid)
            .filter(|db| *db != pg_sys::InvalidOid)
            .collect();
        pg_sys::LWLockRelease(shared.lock);
        dbs.sort_unstable_by_key(|db| u32::from(*db));
        dbs.dedup();
        dbs
    }
}

/// Remove every entry of the databases `gone` (dropped: the launcher checks, each
/// interval); returns how many. Nothing else removes entries but a reset, so without this
/// a stream of created and dropped databases would fill the table for good. When it makes
/// room, the overflow entry gets a new generation (its counters stay): a backend that
/// cached it for a combination of its own looks that up again, and adds an entry.
pub fn forget_databases(gone: &[pg_sys::Oid]) -> usize {
    if !available() || gone.is_empty() {
        return 0;
    }
    // SAFETY: as in reset(): the exclusive lock is held while entries are removed, and no
    // call in between can raise an ERROR (hash_search with HASH_REMOVE does not). The
    // overflow entry (set at server start, never removed: its key's database is
    // InvalidOid, never a dropped one) has its generation stored atomically, with Release,
    // as init_entry does; no reference to the whole entry is made.
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut n = 0;
        for e in entries() {
            if gone.contains(&(*e).key.dbid) {
                remove(e);
                n += 1;
            }
        }
        if n > 0 && !shared.overflow.is_null() {
            (*shared.overflow).generation.store(
                shared.next_generation.fetch_add(1, Ordering::Relaxed),
                Ordering::Release,
            );
        }
        pg_sys::LWLockRelease(shared.lock);
        n
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
    pub late_duplicates: i64,
    /// Milliseconds.
    pub age_sum: i64,
    pub age_max: i64,
    pub ages: Vec<i64>,
    pub waits: i64,
    /// Microseconds.
    pub wait_sum: i64,
    pub wait_max: i64,
    pub batches: i64,
    pub advances: i64,
}

fn ts(v: u64) -> Option<i64> {
    (v != 0).then_some(v as i64)
}

/// Every entry, copied out under the shared lock.
pub fn rows() -> Vec<Row> {
    // SAFETY: called only when available() (SHARED and HASH set), from a #[pg_extern], on
    // the backend's main thread. The shared lock keeps every entry in place while
    // entries() scans and the keys are copied (a key is written only when an entry is
    // added, under the exclusive lock); the counters are atomics. LWLockAcquire raises an
    // ERROR only when too many LWLocks are held; String allocation failure would abort.
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_SHARED);
        let rows = entries()
            .into_iter()
            .map(|e| {
                let e = &*e;
                Row {
                    dbid: e.key.dbid,
                    scope: if e.key.scope_len == 0 {
                        OVERFLOW_SCOPE.to_string()
                    } else {
                        e.key.scope().to_string()
                    },
                    consumer: e.key.consumer().to_string(),
                    claims: e.claims.load(Ordering::Relaxed) as i64,
                    duplicates: e.duplicates.load(Ordering::Relaxed) as i64,
                    busy: e.busy.load(Ordering::Relaxed) as i64,
                    mismatches: e.mismatches.load(Ordering::Relaxed) as i64,
                    last_claim_at: ts(e.last_claim_at.load(Ordering::Relaxed)),
                    last_duplicate_at: ts(e.last_duplicate_at.load(Ordering::Relaxed)),
                    late_duplicates: e.late_duplicates.load(Ordering::Relaxed) as i64,
                    age_sum: i64::try_from(e.age_sum.load(Ordering::Relaxed)).unwrap_or(i64::MAX),
                    age_max: e.age_max.load(Ordering::Relaxed) as i64,
                    ages: e
                        .ages
                        .iter()
                        .map(|a| a.load(Ordering::Relaxed) as i64)
                        .collect(),
                    waits: e.waits.load(Ordering::Relaxed) as i64,
                    wait_sum: e.wait_sum.load(Ordering::Relaxed) as i64,
                    wait_max: e.wait_max.load(Ordering::Relaxed) as i64,
                    batches: e.batches.load(Ordering::Relaxed) as i64,
                    advances: e.advances.load(Ordering::Relaxed) as i64,
                }
            })
            .filter(|r: &Row| {
                // The overflow entry, once it has counted something.
                r.dbid != pg_sys::InvalidOid
                    || r.claims + r.duplicates + r.busy + r.mismatches + r.batches + r.advances > 0
            })
            .collect();
        pg_sys::LWLockRelease(shared.lock);
        rows
    }
}

/// (entries, overflowed, reset_at)
pub fn info() -> (i64, i64, i64) {
    // SAFETY: called only when available() (SHARED and HASH set), on the backend's main
    // thread, from a #[pg_extern]; hash_get_num_entries reads the table's counters under
    // the shared lock; the other fields are atomics.
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_SHARED);
        let n = pg_sys::hash_get_num_entries(HASH);
        pg_sys::LWLockRelease(shared.lock);
        (
            n,
            shared.overflowed.load(Ordering::Relaxed) as i64,
            shared.reset_at.load(Ordering::Relaxed) as i64,
        )
    }
}

/// Forget every counter.
pub fn reset() {
    // SAFETY: called only when available() (SHARED and HASH set), on the backend's main
    // thread, from the #[pg_extern] dedup.stats_reset(). The exclusive lock is held while
    // entries() lists the entries and each is removed (so none is added or removed by
    // another backend meanwhile); GetCurrentTimestamp only reads the clock.
    unsafe {
        let shared = &*SHARED;
        pg_sys::LWLockAcquire(shared.lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        for e in entries() {
            remove(e);
        }
        shared.overflowed.store(0, Ordering::Relaxed);
        shared
            .reset_at
            .store(pg_sys::GetCurrentTimestamp() as u64, Ordering::Relaxed);
        pg_sys::LWLockRelease(shared.lock);
    }
}

// --- the file -------------------------------------------------------------------------
//
// Layout (little-endian): magic, version, key size, values per entry (u32 each);
// overflowed, reset_at, entry count (u64 each); the entries, each a key's bytes and VALUES
// u64 counters; then an FNV-1a 64-bit checksum of everything before it. A file is loaded
// whole or not at all.

/// Counters per entry in the file: 25 from version 3 (0.6.0), 6 in version 2 (0.5.0),
/// which is still read (the new counters start at zero).
const VALUES: usize = 25;
const VALUES_V2: usize = 6;
const HEADER: usize = 4 * 4 + 3 * 8;
const fn record(values: usize) -> usize {
    std::mem::size_of::<Key>() + 8 * values
}
const RECORD: usize = record(VALUES);

/// FNV-1a, 64 bits: enough to tell a torn or altered file from a written one.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// # Safety
///
/// Called only by PostgreSQL, as the on_shmem_exit callback registered in shmem_startup,
/// in the postmaster as it exits, when no backend is left: the table is read without its
/// lock. The #[pg_guard] turns an ERROR or a panic into a PostgreSQL error raised from
/// this frame, never an unwind into C.
#[pg_guard]
unsafe extern "C-unwind" fn write_file_at_exit(code: i32, _arg: pg_sys::Datum) {
    // SAFETY: SHARED is read by value; when set, it and HASH point to the shared memory
    // that stays mapped until the postmaster is gone. entries() runs its scan to the end;
    // each `&*e` is a live entry, read through atomics and the key's plain bytes, which
    // no other process can change now. durable_rename takes 'static C strings and
    // reports every failure (open, fsync, rename) at the LOG level we pass: no ERROR.
    // Not after a crash: the counters may be half-written.
    if code != 0 || SHARED.is_null() {
        return;
    }
    let all = entries();
    let mut out = Vec::with_capacity(HEADER + all.len() * RECORD + 8);
    out.extend_from_slice(&FILE_MAGIC.to_le_bytes());
    out.extend_from_slice(&FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&(std::mem::size_of::<Key>() as u32).to_le_bytes());
    out.extend_from_slice(&(VALUES as u32).to_le_bytes());
    out.extend_from_slice(&((*SHARED).overflowed.load(Ordering::Relaxed)).to_le_bytes());
    out.extend_from_slice(&((*SHARED).reset_at.load(Ordering::Relaxed)).to_le_bytes());
    out.extend_from_slice(&(all.len() as u64).to_le_bytes());
    for e in all {
        // SAFETY: Key is plain bytes with no padding (the assertion at its definition).
        let key = std::slice::from_raw_parts(
            std::ptr::addr_of!((*e).key).cast::<u8>(),
            std::mem::size_of::<Key>(),
        );
        out.extend_from_slice(key);
        for v in Entry::values(e) {
            out.extend_from_slice(&v.load(Ordering::Relaxed).to_le_bytes());
        }
    }
    out.extend_from_slice(&checksum(&out).to_le_bytes());
    if let Err(e) = std::fs::File::create(STAT_FILE_TMP).and_then(|mut f| {
        use std::io::Write;
        f.write_all(&out)?;
        f.sync_all()
    }) {
        log!("dedup: could not write {STAT_FILE_TMP}: {e}");
        return;
    }
    // Renames it into place and fsyncs the file and pg_stat/; failures are logged (LOG).
    pg_sys::durable_rename(
        c"pg_stat/dedup.stat.tmp".as_ptr(),
        c"pg_stat/dedup.stat".as_ptr(),
        pg_sys::LOG as i32,
    );
}

/// Why a counter file is not loaded.
fn check_file(data: &[u8]) -> Result<(usize, usize), String> {
    if data.len() < HEADER + 8 {
        return Err(format!("{} bytes, shorter than a header", data.len()));
    }
    let (body, sum) = data.split_at(data.len() - 8);
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
    if u32_at(0) != FILE_MAGIC {
        return Err("not a dedup counter file".into());
    }
    let values = match u32_at(4) {
        FILE_VERSION => VALUES,
        2 => VALUES_V2,
        v => {
            return Err(format!(
                "format {v}, not {FILE_VERSION} or 2 (written by another version of dedup)"
            ))
        }
    };
    if u32_at(8) as usize != std::mem::size_of::<Key>() || u32_at(12) as usize != values {
        return Err("entries of another layout".into());
    }
    if u64::from_le_bytes(sum.try_into().unwrap()) != checksum(body) {
        return Err("its checksum does not match (torn or altered)".into());
    }
    let count = u64_at(32);
    if (body.len() - HEADER) as u64 != count.saturating_mul(record(values) as u64) {
        return Err(format!("{count} entries do not fill {} bytes", body.len()));
    }
    // Every entry is checked before any is loaded: a file is loaded whole or not at all.
    let mut seen = std::collections::HashSet::new();
    for i in 0..count as usize {
        let at = HEADER + i * record(values);
        let key = &body[at..at + std::mem::size_of::<Key>()];
        check_key(key).map_err(|why| format!("entry {}: {why}", i + 1))?;
        if !seen.insert(key) {
            return Err(format!("entry {}: a second entry with the same key", i + 1));
        }
    }
    Ok((count as usize, values))
}

/// Why the bytes of a saved [`Key`] are not ones [`Key::new`] could have written: a length
/// past its field, a byte after the length that is not zero, or a name that is not UTF-8.
fn check_key(key: &[u8]) -> Result<(), String> {
    let oid = std::mem::size_of::<pg_sys::Oid>();
    let len_at = |at: usize| u16::from_ne_bytes([key[at], key[at + 1]]) as usize;
    let (scope_len, consumer_len) = (len_at(oid), len_at(oid + 2));
    let scope = &key[oid + 4..oid + 4 + MAX_SCOPE];
    let consumer = &key[oid + 4 + MAX_SCOPE..];
    if scope_len > MAX_SCOPE || consumer_len > MAX_CONSUMER {
        return Err(format!(
            "a scope of {scope_len} bytes or a consumer of {consumer_len} (at most {MAX_SCOPE} and {MAX_CONSUMER})"
        ));
    }
    for (name, field, len) in [
        ("scope", scope, scope_len),
        ("consumer", consumer, consumer_len),
    ] {
        if field[len..].iter().any(|b| *b != 0) {
            return Err(format!("bytes after the {name}'s end"));
        }
        if std::str::from_utf8(&field[..len]).is_err() {
            return Err(format!("a {name} that is not UTF-8"));
        }
    }
    Ok(())
}

/// Load the counters saved at the last clean shutdown, then remove the file (it would be
/// stale after a crash).
///
/// # Safety
///
/// Call from shmem_startup, in the postmaster before any backend exists (the table is
/// filled without its lock), with SHARED and HASH set, under its #[pg_guard].
unsafe fn read_file() {
    let data = match std::fs::read(STAT_FILE) {
        Ok(data) => data,
        // Say so: after pg_upgrade (which copies no pg_stat/ file), a crash (the file is
        // removed once read) or on a first start, the counters are not carried over.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            log!(
                "dedup: no {STAT_FILE} (a first start, a crash, or a data directory made by \
                 pg_upgrade or a restore): the counters start from zero"
            );
            return;
        }
        Err(e) => {
            log!("dedup: could not read {STAT_FILE}: {e}; the counters start from zero");
            return;
        }
    };
    let _ = std::fs::remove_file(STAT_FILE);
    let (count, values) = match check_file(&data) {
        Ok(n) => n,
        Err(why) => {
            log!("dedup: ignoring {STAT_FILE}: {why}; the counters start from zero");
            return;
        }
    };
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    // SAFETY: SHARED points to the initialised Shared struct (shmem_startup wrote it just
    // before); these are atomic stores.
    (*SHARED).overflowed.store(u64_at(16), Ordering::Relaxed);
    (*SHARED).reset_at.store(u64_at(24), Ordering::Relaxed);
    for i in 0..count {
        let at = HEADER + i * record(values);
        let mut k = std::mem::MaybeUninit::<Key>::uninit();
        // SAFETY: record(values) bytes from `at` are in `data` (check_file); a Key is plain bytes
        // of exactly size_of::<Key>(), every one of them written here.
        std::ptr::copy_nonoverlapping(
            data[at..].as_ptr(),
            k.as_mut_ptr().cast::<u8>(),
            std::mem::size_of::<Key>(),
        );
        let k = k.assume_init();
        let mut found = false;
        // SAFETY: `k` is a full Key read during each call; HASH_ENTER_NULL returns NULL
        // instead of raising an ERROR when no entry is free. A new entry is initialised by
        // init_entry before its counters are stored; no other process exists yet.
        let mut e = pg_sys::hash_search(
            HASH,
            (&k as *const Key).cast(),
            pg_sys::HASHACTION::HASH_FIND,
            &mut found,
        )
        .cast::<Entry>();
        if e.is_null() && pg_sys::hash_get_num_entries(HASH) < max_entries() {
            e = pg_sys::hash_search(
                HASH,
                (&k as *const Key).cast(),
                pg_sys::HASHACTION::HASH_ENTER_NULL,
                &mut found,
            )
            .cast::<Entry>();
        }
        // An entry beyond a smaller dedup.stats_max is left out.
        if e.is_null() {
            continue;
        }
        if !found {
            init_entry(e, (*SHARED).next_generation.fetch_add(1, Ordering::Relaxed));
        }
        let v = |n: usize| u64_at(at + std::mem::size_of::<Key>() + 8 * n);
        // A version 2 file has the first six; the others stay as init_entry left them.
        for (n, f) in Entry::values(e).into_iter().enumerate().take(values) {
            f.store(v(n), Ordering::Relaxed);
        }
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
        name!(late_duplicates, i64),
        name!(duplicate_age_sum, Interval),
        name!(duplicate_age_max, Interval),
        name!(duplicate_ages, Vec<i64>),
        name!(waits, i64),
        name!(wait_time, Interval),
        name!(wait_max, Interval),
        name!(batches, i64),
        name!(advances, i64),
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
            // SAFETY: inside this #[pg_extern], in a transaction: get_database_name looks
            // the OID up in the syscache (catalog ERRORs go through pgrx's guard) and
            // returns NULL for a dropped database, else a NUL-terminated name palloc'd in
            // CurrentMemoryContext, valid for this call and copied out at once.
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
                r.late_duplicates,
                micros(r.age_sum.saturating_mul(1000)),
                micros(r.age_max),
                r.ages,
                r.waits,
                micros(r.wait_sum),
                micros(r.wait_max),
                r.batches,
                r.advances,
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// An interval of `us` microseconds.
fn micros(us: i64) -> Interval {
    Interval::new(0, 0, us).unwrap_or_else(|_| Interval::new(0, 0, 0).expect("zero"))
}

/// `dedup.stats_info()`: the size of the counter table and when it was last reset.
#[pg_extern(volatile, parallel_restricted)]
fn stats_info() -> TableIterator<
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
}
