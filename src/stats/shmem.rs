//! The shared table of counters: its key and entries, the shared memory it lives in (asked
//! for while preloading), finding or adding an entry (the overflow entry when full), and
//! what reads, resets or empties the table (`dedup.stats_counters`, `stats_reset`, the
//! forgetting of a dropped database's counters).
use super::*;

/// The consumer's field: a name of at most [`MAX_CONSUMER`] bytes and one zero byte, which
/// makes the key 200 bytes with no padding.
pub(super) const CONSUMER_FIELD: usize = MAX_CONSUMER + 1;

/// The hash key. The shared table hashes and compares its bytes (`HASH_BLOBS`), so every
/// byte must be one that [`Key::new`] wrote: the struct has no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Key {
    pub(super) dbid: pg_sys::Oid,
    pub(super) scope_len: u16,
    pub(super) consumer_len: u16,
    pub(super) scope: [u8; MAX_SCOPE],
    pub(super) consumer: [u8; CONSUMER_FIELD],
}

const _: () = assert!(
    std::mem::size_of::<Key>()
        == std::mem::size_of::<pg_sys::Oid>() + 2 + 2 + MAX_SCOPE + CONSUMER_FIELD,
    "stats::Key must have no padding: its bytes are hashed"
);

impl Key {
    pub(super) fn new(dbid: pg_sys::Oid, scope: &str, consumer: &str) -> Key {
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
    pub(super) fn scope(&self) -> &str {
        std::str::from_utf8(&self.scope[..self.scope_len as usize]).unwrap_or("")
    }
    pub(super) fn consumer(&self) -> &str {
        std::str::from_utf8(&self.consumer[..self.consumer_len as usize]).unwrap_or("")
    }
    pub(super) fn same(&self, dbid: pg_sys::Oid, scope: &str, consumer: &str) -> bool {
        self.dbid == dbid
            && self.scope() == scope
            && self.consumer() == truncate_utf8(consumer, MAX_CONSUMER)
    }
}

pub(super) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What a counter holds, which says how `dedup.stats_counters` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shown {
    /// A count (bigint).
    Count,
    /// A time, microseconds since 2000-01-01 (timestamptz); 0 = never (NULL).
    Time,
    /// Milliseconds (interval).
    Millis,
    /// Microseconds (interval).
    Micros,
    /// One count per bucket of [`AGE_BOUNDS`] (bigint[]).
    Buckets,
    /// Billionths of a count (float8).
    Billionths,
}

/// A counter: where its values are in an entry, how many there are (1, or the buckets),
/// its column of `dedup.stats_counters` ("" for a counter kept but not shown), and how it is
/// shown there.
#[derive(Clone, Copy, Debug)]
pub(super) struct Counter {
    pub(super) at: usize,
    pub(super) len: usize,
    /// Read by the tests that compare the table with the catalog.
    #[cfg_attr(not(feature = "pg_test"), allow(dead_code))]
    pub(super) column: &'static str,
    pub(super) shown: Shown,
}

impl Counter {
    /// This counter of the entry at `e` (its first bucket for [`Shown::Buckets`]), through
    /// a reference of its own, never one to the whole Entry: a reset in another backend may
    /// be rewriting the slot's key (the miscount of one the module accepts), and a
    /// reference to the Entry would assert that nobody writes it.
    ///
    /// # Safety
    ///
    /// `e` points to an entry of the shared table (its counters are atomics, shared across
    /// processes with no lock), and `i < self.len`.
    #[inline]
    pub(super) unsafe fn of<'a>(self, e: *const Entry, i: usize) -> &'a AtomicU64 {
        debug_assert!(i < self.len);
        &*std::ptr::addr_of!((*e).counters)
            .cast::<AtomicU64>()
            .add(self.at + i)
    }
}

/// The table of counters, the one place a counter is defined: `counters! { NAME: shown
/// "column" (* buckets), ... }` makes a [`Counter`] constant for each, [`COUNTERS`] in this
/// order, and [`VALUES`], the u64s an entry holds. The order is the counter file's, and
/// `dedup.stats_counters`'s columns after the key's (stats::tests::the_counters_are_the_functions_columns
/// compares them with the catalog): a new counter goes at the end, and an entry, the
/// file, the reset and the rows follow. Its column is added to `sql::stats_counters` and to
/// the view `dedup.stats`.
macro_rules! counters {
    ($($name:ident: $shown:ident $column:literal $(* $len:expr)?,)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
        #[derive(Clone, Copy)]
        enum Index { $($name,)* End }
        const LENS: [usize; Index::End as usize] = [$(counters!(@len $($len)?),)*];
        /// Where the counter at index `i` of the table starts.
        const fn offset(i: usize) -> usize {
            let (mut sum, mut j) = (0, 0);
            while j < i {
                sum += LENS[j];
                j += 1;
            }
            sum
        }
        $(pub(super) const $name: Counter = Counter {
            at: offset(Index::$name as usize),
            len: LENS[Index::$name as usize],
            column: $column,
            shown: Shown::$shown,
        };)*
        /// Every counter, in the table's order (read by the tests that compare the table
        /// with the catalog).
        #[cfg_attr(not(feature = "pg_test"), allow(dead_code))]
        pub(super) const COUNTERS: [Counter; Index::End as usize] = [$($name,)*];
        /// The u64 values of an entry (a counter with buckets holds one per bucket).
        pub(super) const VALUES: usize = offset(Index::End as usize);
    };
    (@len) => { 1 };
    (@len $len:expr) => { $len };
}

counters! {
    // Calls that took a job: try_claim true, lease acquired, each job of a batch.
    CLAIMS: Count "claims",
    // Copies of jobs already done.
    DUPLICATES: Count "duplicates",
    // Copies that found a concurrent holder.
    BUSY: Count "busy",
    // Another payload fingerprint (YD001).
    MISMATCHES: Count "fingerprint_mismatches",
    LAST_CLAIM_AT: Time "last_claim_at",
    LAST_DUPLICATE_AT: Time "last_duplicate_at",
    // The last fingerprint mismatch: kept, and saved, but not a column.
    LAST_USED_AT: Time "",
    // Duplicates (and busy copies) whose claim was older than half its scope's retention.
    LATE_DUPLICATES: Count "late_duplicates",
    // Ages of the claims duplicates hit: their sum (milliseconds, so that a million copies
    // a day of day-old claims take centuries to overflow), the largest (microseconds), and
    // a count per bucket of AGE_BOUNDS.
    AGE_SUM: Millis "duplicate_age_sum",
    AGE_MAX: Micros "duplicate_age_max",
    AGES: Buckets "duplicate_ages" * AGE_BUCKETS,
    // Claims that waited for a concurrent holder of the same job: how many, and the time
    // waited (microseconds): in all, and the longest.
    WAITS: Count "waits",
    WAIT_SUM: Micros "wait_time",
    WAIT_MAX: Micros "wait_max",
    // try_claim_many calls, and dedup.advance calls that raised a mark.
    BATCHES: Count "batches",
    ADVANCES: Count "advances",
    // Claims that returned true for a job whose claim pruning had removed (src/expired/):
    // how many, the last, and the longest after the claim expired (microseconds, at most:
    // from the earliest expiry of the summary that held it).
    EXPIRED: Count "expired_duplicates",
    LAST_EXPIRED_AT: Time "last_expired_duplicate_at",
    EXPIRED_AFTER_MAX: Micros "expired_duplicate_after_max",
    // How many of them chance alone explains: the summaries' false-positive rate, summed
    // over the claims that looked (billionths).
    EXPIRED_EXPECTED: Billionths "expired_duplicates_expected",
    // Index probes a claim made in a sealed generation of dedup.generations for want of its
    // summary (none built yet, or it did not fit dedup.generation_memory), and probes a
    // summary's "maybe" asked for that found no row of the job (its false positives, or a
    // row dedup.forget deleted): src/generations, counted by the call that made them.
    UNSUMMARISED_PROBES: Count "unsummarised_probes",
    SUMMARY_FALSE_POSITIVES: Count "summary_false_positives",
}

/// One entry of the shared hash table (the key must come first): its generation, then the
/// counters of [`COUNTERS`], each at its `at`.
#[repr(C)]
pub(super) struct Entry {
    pub(super) key: Key,
    pub(super) generation: AtomicU64,
    pub(super) counters: [AtomicU64; VALUES],
}

impl Entry {
    /// Every counter's values, in the order of the counter file.
    ///
    /// # Safety
    ///
    /// `e` points to an entry of the shared table (its counters are atomics).
    pub(super) unsafe fn values<'a>(e: *const Entry) -> &'a [AtomicU64; VALUES] {
        &*std::ptr::addr_of!((*e).counters)
    }
}

/// The shared state besides the hash table.
#[repr(C)]
pub(super) struct Shared {
    pub(super) lock: *mut pg_sys::LWLock,
    pub(super) next_generation: AtomicU64,
    /// Calls counted in the overflow entry.
    pub(super) overflowed: AtomicU64,
    pub(super) reset_at: AtomicU64,
    /// The entry that counts the combinations that found the table full.
    pub(super) overflow: *mut Entry,
}

pub(super) static mut SHARED: *mut Shared = std::ptr::null_mut();
pub(super) static mut HASH: *mut pg_sys::HTAB = std::ptr::null_mut();
pub(super) static mut PREV_SHMEM_REQUEST: pg_sys::shmem_request_hook_type = None;
pub(super) static mut PREV_SHMEM_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// Is counting possible here (the library was preloaded and the shared memory exists)?
pub fn available() -> bool {
    // SAFETY: SHARED is written only by shmem_startup in the postmaster (before any backend
    // is forked, which inherits it) and read here by value through a raw pointer, on the
    // process's only thread: no reference to the static mut is made.
    unsafe { !std::ptr::addr_of!(SHARED).read().is_null() }
}

pub(super) fn max_entries() -> i64 {
    i64::from(guc::STATS_MAX.get())
}

/// # Safety
///
/// Call on the postmaster's thread while it sizes shared memory (from shmem_request, or
/// _PG_init before PostgreSQL 15), under a #[pg_guard]: hash_estimate_size only computes,
/// and add_size raises an ERROR on size_t overflow, which that guard re-raises.
pub(super) unsafe fn shmem_size() -> usize {
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
pub(super) unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: PREV_SHMEM_REQUEST is read by value, written only by request_shared_memory
    // before this hook can run; the previous hook is a valid C function pointer (or None).
    // RequestAddinShmemSpace and RequestNamedLWLockTranche only record the request (the
    // latter copies the tranche name); both are allowed here, inside shmem_request_hook.
    if let Some(prev) = PREV_SHMEM_REQUEST {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(shmem_size());
    pg_sys::RequestNamedLWLockTranche(c"dedup".as_ptr(), 1);
    // The summaries of pruned claims (src/expired/), when dedup.expired_memory > 0.
    crate::expired::request();
    // The generations' epochs (src/generations/epoch.rs).
    crate::generations::epoch::request();
    // The summaries of sealed generations (src/generations/summary.rs).
    crate::generations::summary::request();
}

/// # Safety
///
/// Called only by PostgreSQL, as shmem_startup_hook, after the shared memory segment was
/// made: in the postmaster (on its only thread) at start and at each crash restart, and in
/// each child under EXEC_BACKEND. The #[pg_guard] turns an ERROR (out of shared memory in
/// ShmemInitStruct, ShmemInitHash or hash_search, an unregistered tranche) or a panic into
/// a PostgreSQL ERROR raised from this frame (fatal at postmaster start), never an unwind
/// into C.
///
/// Long because its steps run in this order under one lock (AddinShmemInitLock), each with
/// the contract that makes it sound.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn shmem_startup() {
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
    // SAFETY: AddinShmemInitLock is held, as expired::attach requires.
    let expired_new = crate::expired::attach();
    // SAFETY: AddinShmemInitLock is held, as generations::epoch::attach requires.
    crate::generations::epoch::attach();
    // SAFETY: AddinShmemInitLock is held, as generations::summary::attach requires.
    crate::generations::summary::attach();
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
    if expired_new {
        crate::expired::load();
    }
}

pub(super) fn overflow_key() -> Key {
    Key::new(pg_sys::InvalidOid, "", "")
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
pub(super) unsafe fn find_or_add(key: &Key) -> Option<(*mut Entry, u64)> {
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
pub(super) unsafe fn init_entry(e: *mut Entry, generation: u64) {
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
pub(super) unsafe fn entries() -> Vec<*mut Entry> {
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
pub(super) unsafe fn remove(e: *mut Entry) {
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
    /// The counters' values, as [`Entry::values`] orders them.
    pub(super) values: [u64; VALUES],
}

impl Row {
    /// The values of `counter` (one, or one per bucket).
    pub(super) fn get(&self, counter: Counter) -> &[u64] {
        &self.values[counter.at..counter.at + counter.len]
    }
}

pub(super) fn ts(v: u64) -> Option<i64> {
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
                    values: std::array::from_fn(|i| e.counters[i].load(Ordering::Relaxed)),
                }
            })
            .filter(|r: &Row| {
                // The overflow entry, once it has counted something.
                r.dbid != pg_sys::InvalidOid || r.values.iter().any(|v| *v != 0)
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
