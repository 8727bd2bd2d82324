//! The per-database *epoch* (docs/design/generations.md, "The layout"): a counter in shared
//! memory that every change of a database's `dedup.generations` moves, odd while the change
//! is committing. A backend keeps its list of generations with the even epoch it read
//! before loading it, and reloads whenever the epoch differs ([`read_even`]).
//!
//! **The memory.** An array of [`SLOTS`] [`Slot`]s from `ShmemInitStruct("dedup generations
//! epochs")`, asked for and attached next to the counters' and `src/expired`'s (by
//! `stats::shmem::shmem_request` and `shmem_startup`, so only with `shared_preload_libraries
//! = 'dedup'`: [`available`]). It is zeroed when made: at server start, and at each crash
//! restart, which makes the shared memory anew. After a crash restart every epoch is 0
//! again and every slot free; that is sound because every backend is new too (the
//! postmaster kills them all before it re-initialises): no process keeps a list, or a
//! pointer to a slot, from before.
//!
//! **A database's slot.** A database gets a slot the first time a transaction of it is
//! about to change `dedup.generations` ([`publishing`], also through the table's trigger:
//! a restore of its rows): a compare-and-swap of `db` from 0
//! to its OID, probing linearly from a hash of the OID. A read never takes a slot: a
//! database without one reads 0 (it has never published, since this shared memory was
//! made). The launcher frees the slot of a dropped database ([`forget_database`]). A freed
//! slot keeps `used` = 1, so a probe goes on past it (open addressing with tombstones): a
//! probe stops only at a slot never used since the memory was made. A slot is taken again
//! by the first database whose probe reaches it; its epoch goes on from the value the
//! dropped database left (made even), which is as good as 0 to the new database's backends:
//! each of them had read 0 (no slot), and any value that differs only costs a reload, and
//! every publication moves it by 2 from there.
//!
//! **Publishing.** A transaction about to change `dedup.generations` calls [`publishing`]:
//! it takes a transaction-level lock no SQL can take (so two publishers of one database
//! never interleave their increments) and marks the transaction; this module's transaction
//! callback then adds 1 at `XACT_EVENT_PRE_COMMIT` (odd: before the commit record), and 1
//! at `XACT_EVENT_COMMIT` (even: after the commit is visible, before the lock is released),
//! or at `XACT_EVENT_ABORT` if it had made it odd, so that an ERROR, or a FATAL, between the
//! two cannot leave it odd for ever. `PREPARE TRANSACTION` of such a transaction is refused
//! (at `XACT_EVENT_PRE_PREPARE`).
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Slots in the shared array: at most this many databases of one server use generations
/// (between two restarts, counting the dropped ones the launcher has not freed yet).
const SLOTS: usize = 1024;
const SLOT_BITS: u32 = SLOTS.trailing_zeros();
const _: () = assert!(SLOTS.is_power_of_two(), "the probe wraps with a mask");

/// One database's epoch. 16 bytes, `repr(C)`: every field is an atomic, read and written by
/// every backend with no lock, so only shared references to it are ever made.
#[repr(C)]
#[derive(Default)]
struct Slot {
    /// The database's OID; 0: free.
    db: AtomicU32,
    /// 1 once a database has taken (or tried to take) this slot since the memory was made;
    /// never reset. A probe stops at a slot with `db` = 0 and `used` = 0 only (see
    /// [`find`]). It lives in what would be padding before `epoch`.
    used: AtomicU32,
    /// The epoch: even when no change of the database's generations is committing.
    epoch: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

type Array = [Slot; SLOTS];

/// The shared array, once attached in this process (null: not preloaded). Written by
/// [`attach`] in the postmaster before any backend is forked (children inherit it), or in a
/// child under EXEC_BACKEND before it runs anything; an atomic only so that no `static mut`
/// is needed (Relaxed: this process's own value).
static ARRAY: AtomicPtr<Array> = AtomicPtr::new(std::ptr::null_mut());

// Backend-local state (a backend runs on one thread; atomics rather than `static mut`, each
// used with Relaxed, for this process only).
/// The database whose slot [`CACHED_SLOT`] is (0: none cached). A backend's MyDatabaseId
/// does not change once connected; the check covers processes that read before connecting.
static CACHED_DB: AtomicU32 = AtomicU32::new(0);
static CACHED_SLOT: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
/// The slot of the database whose generations this transaction is changing (null: this
/// transaction called no [`publishing`]). Reset by the callback at the transaction's end.
static PUBLISHING: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
/// This transaction's pre-commit made the epoch odd (the commit or abort makes it even).
static MADE_ODD: AtomicBool = AtomicBool::new(false);
/// [`xact_callback`] is registered in this backend (once: it stays for the backend's life).
static CALLBACK_REGISTERED: AtomicBool = AtomicBool::new(false);

/// The shared memory the array needs.
///
/// # Safety
///
/// In the postmaster while it sizes shared memory (shmem_request_hook), under a
/// #[pg_guard]: mul_size raises an ERROR on size_t overflow (it cannot here).
pub(crate) unsafe fn shmem_size() -> usize {
    // SAFETY: the contract above; mul_size takes two sizes by value.
    pg_sys::mul_size(SLOTS, std::mem::size_of::<Slot>())
}

/// Ask for the array's memory (from stats' shmem_request hook).
///
/// # Safety
///
/// Inside shmem_request_hook, in the postmaster, under a #[pg_guard].
pub(crate) unsafe fn request() {
    // SAFETY: the contract above: RequestAddinShmemSpace only records the request, and is
    // allowed inside shmem_request_hook (it raises an ERROR anywhere else).
    pg_sys::RequestAddinShmemSpace(shmem_size());
}

/// Make (zeroed) or attach to the array.
///
/// # Safety
///
/// From stats' shmem_startup hook, with AddinShmemInitLock held, under its #[pg_guard]: in
/// the postmaster at start and at each crash restart (before any backend exists), or in a
/// child under EXEC_BACKEND (then the array exists: found = true, never rewritten).
pub(crate) unsafe fn attach() {
    let size = shmem_size();
    let mut found = false;
    // SAFETY: ShmemInitStruct returns `size` bytes of shared memory (an ERROR, raised
    // through the caller's guard, when out of shared memory), MAXALIGNed or better, mapped
    // for the postmaster's life and every child's; AddinShmemInitLock, held by the caller,
    // serialises it with other modules' startup. The name is a C string constant.
    let base = pg_sys::ShmemInitStruct(c"dedup generations epochs".as_ptr(), size, &mut found);
    if !base.cast::<Slot>().is_aligned() {
        pgrx::error!("dedup: the shared memory of the generations' epochs is misaligned");
    }
    if !found {
        // SAFETY: the `size` bytes just made are ours alone (no backend exists yet: the
        // postmaster runs this before forking any, also at a crash restart, after every
        // backend was killed). All zero bytes are a valid Slot (atomics of 0): db free,
        // never used, epoch 0.
        std::ptr::write_bytes(base.cast::<u8>(), 0, size);
    }
    ARRAY.store(base.cast::<Array>(), Ordering::Relaxed);
}

/// Is the array attached in this process (the library was preloaded)?
pub(crate) fn available() -> bool {
    !ARRAY.load(Ordering::Relaxed).is_null()
}

fn array() -> Option<&'static Array> {
    let p = ARRAY.load(Ordering::Relaxed);
    // SAFETY: when not null, ARRAY points to SLOTS slots in shared memory, initialised (all
    // zero bytes, or written since through atomics) before it was stored, and mapped for
    // this process's life (a crash restart makes new processes). A shared reference is
    // sound although other processes write it: every field is an atomic.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn my_db() -> u32 {
    // SAFETY: a plain read of the backend global MyDatabaseId (InvalidOid = 0 until the
    // process connects to a database).
    u32::from(unsafe { pg_sys::MyDatabaseId })
}

/// Where a probe for `db` starts: Fibonacci hashing (the top SLOT_BITS bits of the OID
/// times 2^32 / phi), which spreads consecutive OIDs.
#[inline]
fn home(db: u32) -> usize {
    (db.wrapping_mul(0x9E37_79B9) >> (32 - SLOT_BITS)) as usize
}

/// The `k`th slot of a probe from `start`.
#[inline]
fn at(slots: &Array, start: usize, k: usize) -> &Slot {
    &slots[(start + k) & (SLOTS - 1)]
}

/// The slot of `db`, if it has one. Probes from [`home`] until it finds `db`, or a slot that
/// was never used (then `db` has none: every slot a claim of `db` passed has `used` = 1, for
/// good, see [`find_or_claim`]), or it has looked at every slot.
///
/// SeqCst loads, `db` before `used`: a claimer stores `used` before its compare-and-swap of
/// `db`, so a probe that reads `db` = 0 and then `used` = 0 ran, in the single order of
/// SeqCst operations, before any claim of that slot, hence before any claim that probed past
/// it: "no slot" was true when it looked.
fn find(slots: &Array, db: u32) -> Option<&Slot> {
    debug_assert!(db != 0);
    let start = home(db);
    for k in 0..SLOTS {
        let s = at(slots, start, k);
        let d = s.db.load(Ordering::SeqCst);
        if d == db {
            return Some(s);
        }
        if d == 0 && s.used.load(Ordering::SeqCst) == 0 {
            return None;
        }
    }
    None
}

/// The slot of `db`, taken if it has none: the first free slot (freed, or never used) on its
/// probe, by a compare-and-swap of `db` from 0, after `used` is set (so a probe goes on past
/// it from then on, whoever wins it). A slot another database wins meanwhile is skipped.
///
/// Claims for one database must be serialised by the caller (the publishing lock, taken by
/// [`publishing`] first): two claimers of `db` could otherwise take two slots. Databases
/// that differ only race for free slots, which the compare-and-swap settles.
///
/// Raises an ERROR (54000) when every slot is taken.
fn find_or_claim(slots: &Array, db: u32) -> &Slot {
    debug_assert!(db != 0);
    let start = home(db);
    // Is it there already? And the first free slot on its probe.
    let mut first_free = None;
    for k in 0..SLOTS {
        let s = at(slots, start, k);
        let d = s.db.load(Ordering::SeqCst);
        if d == db {
            return s;
        }
        if d == 0 {
            first_free.get_or_insert(k);
            if s.used.load(Ordering::SeqCst) == 0 {
                break;
            }
        }
    }
    if let Some(first) = first_free {
        for k in first..SLOTS {
            let s = at(slots, start, k);
            if s.db.load(Ordering::SeqCst) != 0 {
                continue;
            }
            s.used.store(1, Ordering::SeqCst);
            if s.db
                .compare_exchange(0, db, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                // A freed slot keeps the epoch of the database it served; were that odd (a
                // publisher of the dropped database died between its increments without a
                // crash restart: not expected), this database's readers would poll for ever.
                // No publisher of `db` runs now (the caller holds its lock).
                if s.epoch.load(Ordering::SeqCst) & 1 == 1 {
                    s.epoch.fetch_add(1, Ordering::SeqCst);
                }
                return s;
            }
        }
    }
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("dedup: no room for this database's generations: {SLOTS} databases of this server use them"),
        "dedup",
    )
    .set_hint(
        "The launcher frees the room of a dropped database within dedup.prune_interval; a \
         restart of the server frees every one.",
    )
    .report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// This backend's slot: the cached one, or found (never taken: see [`publishing`]). None
/// without the array, outside a database, or when the database has no slot yet.
#[inline]
fn my_slot() -> Option<&'static Slot> {
    let db = my_db();
    if db == 0 {
        return None;
    }
    if CACHED_DB.load(Ordering::Relaxed) == db {
        // SAFETY: CACHED_SLOT was stored (before CACHED_DB, on this thread) from a slot of
        // the shared array, which stays mapped; the slot stays this database's while the
        // database exists, and a backend connected to it keeps it from being dropped.
        return Some(unsafe { &*CACHED_SLOT.load(Ordering::Relaxed) });
    }
    let s = find(array()?, db)?;
    cache(db, s);
    Some(s)
}

fn cache(db: u32, s: &'static Slot) {
    CACHED_SLOT.store(std::ptr::from_ref(s).cast_mut(), Ordering::Relaxed);
    CACHED_DB.store(db, Ordering::Relaxed);
}

/// This database's epoch, even: while it is odd (a change of `dedup.generations` is
/// committing), polls every 100 µs, and answers interrupts (cancel, `statement_timeout`,
/// termination) meanwhile. 0 without the array ([`available`]), outside a database, or for
/// a database that never published since the shared memory was made.
///
/// The common path is one Acquire load of the shared epoch (the cache checks before it are
/// of this backend's own memory).
///
/// Raises an ERROR if this very transaction made the epoch odd (a read from a pre-commit
/// callback run after ours): it would wait for itself.
#[inline]
pub(crate) fn read_even() -> u64 {
    let Some(slot) = my_slot() else {
        return 0;
    };
    let e = slot.epoch.load(Ordering::Acquire);
    if e & 1 == 0 {
        return e;
    }
    wait_even(slot)
}

#[cold]
#[inline(never)]
fn wait_even(slot: &Slot) -> u64 {
    loop {
        if MADE_ODD.load(Ordering::Relaxed)
            && std::ptr::eq(PUBLISHING.load(Ordering::Relaxed), slot)
        {
            pgrx::error!(
                "dedup: the generations' epoch was read while this transaction commits a change to dedup.generations"
            );
        }
        // SAFETY: pg_usleep only sleeps (interrupted early by a signal, which is fine: we
        // look again).
        unsafe { pg_sys::pg_usleep(100) };
        // An ERROR or FATAL here (cancel, statement_timeout, termination) is raised through
        // the caller's pgrx guard.
        pg_sys::check_for_interrupts!();
        let e = slot.epoch.load(Ordering::Acquire);
        if e & 1 == 0 {
            return e;
        }
    }
}

/// Whether this transaction called [`publishing`] (it is changing `dedup.generations`):
/// a list it reads may roll back with it, so the caller does not keep it.
pub(crate) fn publishing_now() -> bool {
    !PUBLISHING.load(Ordering::Relaxed).is_null()
}

/// The lock that keeps two publishers of one database apart: an advisory lock tag
/// (database, 'dedu', 1) whose fourth field is 4. `pg_advisory_lock` and its kin only ever
/// make tags with 1 (one bigint key) or 2 (two integer keys) there, and the prune lock
/// (prune/pass.rs) has 3: no SQL can take this lock or wait for it, but through dedup's
/// functions (publishers exclusive; the lease functions in share mode,
/// [`hold_off_publishing`]). `pg_locks` shows it as `advisory` with classid 1684366453,
/// objid 1, objsubid 4.
fn lock_tag(db: u32) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: db,
        locktag_field2: 0x6465_6475,
        locktag_field3: 1,
        locktag_field4: 4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        // The user lock method, as every advisory lock: a transaction lock of it is released
        // at the end of the top-level transaction (ProcReleaseLocks), after the commit's or
        // abort's transaction callbacks ran.
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Puts CurrentResourceOwner back when dropped, also while an ERROR unwinds (pgrx turns it
/// into a panic at the pg_sys call), for a caller that catches it and goes on.
struct RestoreOwner(pg_sys::ResourceOwner);

impl Drop for RestoreOwner {
    fn drop(&mut self) {
        // SAFETY: a plain store of the backend global, putting back the value it had.
        unsafe { pg_sys::CurrentResourceOwner = self.0 };
    }
}

/// Wait for the publishing lock of `db` in `mode`, held until the top-level transaction
/// ends.
///
/// # Safety
///
/// In a transaction (TopTransactionResourceOwner set), on the backend's main thread, under
/// pgrx's guard.
unsafe fn lock_for_transaction(db: u32, mode: u32) {
    let tag = lock_tag(db);
    let _restore = RestoreOwner(pg_sys::CurrentResourceOwner);
    // SAFETY: the contract above. The lock is recorded under the top-level transaction's
    // resource owner, not the current subtransaction's: a subtransaction that rolls back
    // (a PL/pgSQL EXCEPTION block) would otherwise release it while this transaction stays
    // marked as publishing, and its increments could then interleave with another
    // publisher's. The abort paths reset CurrentResourceOwner themselves, and RestoreOwner
    // puts it back on every path here. LockAcquire waits as any lock does (lock_timeout,
    // deadlock detection, cancellation: ERRORs raised through the caller's guard); the tag is
    // a local the lock manager copies.
    pg_sys::CurrentResourceOwner = pg_sys::TopTransactionResourceOwner;
    pg_sys::LockAcquire(&tag, mode as pg_sys::LOCKMODE, false, false);
}

/// Called by the lease functions in a database that does not use
/// generations, before they read or write `dedup.processed`: the publishing lock in share
/// mode, held until the transaction ends. Leases do not conflict with each other; a
/// `use_generations()` (exclusive) waits for every transaction that took it, and they wait
/// for it, so that once it holds the lock no lease can still be on its way into
/// `dedup.processed` by its `INSERT ... ON CONFLICT` (the leases there stay in generation 0),
/// and a lease that waited for it sees the generations when it looks again
/// (`generations::lease_tables`).
pub(crate) fn hold_off_publishing() {
    let db = my_db();
    // SAFETY: IsTransactionState reads CurrentTransactionState, no ereport.
    if db == 0 || !unsafe { pg_sys::IsTransactionState() } {
        return;
    }
    // SAFETY: in a transaction (checked above), on the main thread, under the guard of the
    // #[pg_extern] function that called us.
    unsafe { lock_for_transaction(db, pg_sys::ShareLock) };
}

/// Called by a transaction about to change `dedup.generations` (the worker's rotation,
/// `dedup.use_generations()`), before it changes anything: from its commit on, every
/// backend of the database sees the epoch move (odd from its pre-commit until its commit is
/// visible). Idempotent within a transaction.
///
/// It takes the database's publishing lock (held to the transaction's end), then the
/// database's slot (an ERROR when none is free), and marks the transaction for the
/// callback. The lock comes first so that two claims of one database's slot never race.
///
/// Raises an ERROR without the array (the caller checks [`available`] first, with its own
/// error), outside a transaction or a database.
pub(crate) fn publishing() {
    let Some(slots) = array() else {
        pgrx::error!("dedup: the generations' epoch needs shared_preload_libraries = 'dedup'");
    };
    let db = my_db();
    if db == 0 {
        pgrx::error!("dedup: publishing generations outside a database");
    }
    // SAFETY: IsTransactionState reads CurrentTransactionState, no ereport.
    if !unsafe { pg_sys::IsTransactionState() } {
        pgrx::error!("dedup: publishing generations outside a transaction");
    }
    if publishing_now() {
        return;
    }
    if !CALLBACK_REGISTERED.load(Ordering::Relaxed) {
        // SAFETY: RegisterXactCallback keeps the function pointer in a list allocated in
        // TopMemoryContext (an out-of-memory ERROR raised through the caller's guard, then
        // the flag stays unset); the callback is a #[pg_guard] extern "C-unwind" fn with
        // XactCallback's signature, valid for the backend's life, and ignores its argument.
        unsafe { pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut()) };
        CALLBACK_REGISTERED.store(true, Ordering::Relaxed);
    }
    // SAFETY: in a transaction (checked above), on the main thread, under the guard of the
    // #[pg_extern] or background worker main function that called us.
    unsafe { lock_for_transaction(db, pg_sys::ExclusiveLock) };
    // The epoch is odd from the pre-commit to the commit, and every claim of the database
    // polls meanwhile: this commit must not wait for a synchronous standby (a claim that
    // commits into a new generation flushes the WAL, this change's included, before its own
    // commit is acknowledged). The local flush only, for this transaction.
    pgrx::spi::Spi::run("SELECT pg_catalog.set_config('synchronous_commit', 'local', true)")
        .unwrap_or_else(|e| pgrx::error!("dedup: setting synchronous_commit failed: {e}"));
    let slot = find_or_claim(slots, db);
    cache(db, slot);
    MADE_ODD.store(false, Ordering::Relaxed);
    PUBLISHING.store(std::ptr::from_ref(slot).cast_mut(), Ordering::Relaxed);
}

/// The transaction callback (registered once per backend by [`publishing`]); does nothing
/// in a transaction that is not publishing.
///
/// From xact.c, as remembered (**unverified** against the sources, which are not here):
/// `CommitTransaction` runs the `XACT_EVENT_PRE_COMMIT` callbacks after the deferred
/// triggers and portals, while the transaction can still fail (an ERROR there aborts it),
/// and before the commit record (`RecordTransactionCommit`); it runs the `XACT_EVENT_COMMIT`
/// callbacks after `ProcArrayEndTransaction` (the commit is visible to new snapshots) and
/// before `ResourceOwnerRelease(RESOURCE_RELEASE_LOCKS)` (ProcReleaseLocks), so the
/// publishing lock is still held. `AbortTransaction` runs `XACT_EVENT_ABORT` likewise
/// before the locks are released; a FATAL in a transaction aborts it the same way at exit
/// (AbortOutOfAnyTransaction). `PrepareTransaction` runs `XACT_EVENT_PRE_PREPARE` first
/// thing after the deferred triggers, before its own ERROR checks (temporary objects,
/// exported snapshots) and before its state becomes TRANS_PREPARE: an ERROR there aborts
/// the transaction normally. postgres_fdw raised "cannot PREPARE a transaction that has
/// operated on postgres_fdw foreign tables" from this very event. An ERROR at COMMIT or
/// ABORT would not be (the first becomes a PANIC-grade "already committed" abort, the
/// second a recursion), so those arms only add to an atomic.
///
/// The parallel events (`XACT_EVENT_PARALLEL_PRE_COMMIT` and its kin) come in parallel
/// workers only, which never publish: ignored.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    let slot = PUBLISHING.load(Ordering::Relaxed);
    if slot.is_null() {
        return;
    }
    // SAFETY: PUBLISHING holds a slot of the shared array (publishing()), which stays
    // mapped for the process's life; its fields are atomics.
    let slot = &*slot;
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT if !MADE_ODD.load(Ordering::Relaxed) => {
            slot.epoch.fetch_add(1, Ordering::SeqCst);
            MADE_ODD.store(true, Ordering::Relaxed);
        }
        pg_sys::XactEvent::XACT_EVENT_COMMIT => {
            // Odd since the pre-commit: even again, the change visible. Without a pre-commit
            // of ours (publishing() was called from a pre-commit callback that ran after
            // this one: not expected) the change still moves the epoch, by 2.
            let by = if MADE_ODD.load(Ordering::Relaxed) {
                1
            } else {
                2
            };
            slot.epoch.fetch_add(by, Ordering::SeqCst);
            done();
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PREPARE => {
            // An abort after our pre-commit (a later pre-commit step failed, or a FATAL):
            // even again, nothing changed. PREPARE cannot come (PRE_PREPARE refuses it).
            if MADE_ODD.load(Ordering::Relaxed) {
                slot.epoch.fetch_add(1, Ordering::SeqCst);
            }
            done();
        }
        pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE => {
            // The epoch would move at the PREPARE, not at the COMMIT PREPARED that makes the
            // change visible: refused (the abort that follows resets the mark).
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "a transaction that changes dedup.generations cannot be prepared",
                "dedup",
            )
            .set_hint("Commit it with COMMIT instead of PREPARE TRANSACTION.")
            .report(PgLogLevel::ERROR);
        }
        _ => {}
    }
}

/// The transaction ended: it publishes no more.
fn done() {
    PUBLISHING.store(std::ptr::null_mut(), Ordering::Relaxed);
    MADE_ODD.store(false, Ordering::Relaxed);
}

/// Free the slot of `db` (dropped: the launcher checks); returns whether it had one. No
/// backend of a dropped database is left (DROP DATABASE waits for them, or fails), so no
/// process uses the slot any more; its epoch stays (even) for the next database that takes
/// it.
pub(crate) fn forget_database(db: pg_sys::Oid) -> bool {
    let db = u32::from(db);
    if db == 0 {
        return false;
    }
    let Some(slots) = array() else {
        return false;
    };
    let Some(slot) = find(slots, db) else {
        return false;
    };
    // `used` stays 1: the probes of databases whose slots lie past this one go on past it.
    slot.db
        .compare_exchange(db, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// The databases that have a slot (for the launcher, which frees the dropped ones').
pub(crate) fn databases() -> Vec<pg_sys::Oid> {
    let Some(slots) = array() else {
        return Vec::new();
    };
    let mut dbs: Vec<u32> = slots
        .iter()
        .map(|s| s.db.load(Ordering::Relaxed))
        .filter(|d| *d != 0)
        .collect();
    dbs.sort_unstable();
    dbs.into_iter().map(pg_sys::Oid::from).collect()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    /// An array of our own, in this backend's memory (the tests' server does not preload).
    fn fresh() -> Box<Array> {
        let v: Vec<Slot> = (0..SLOTS).map(|_| Slot::default()).collect();
        v.into_boxed_slice()
            .try_into()
            .unwrap_or_else(|_| panic!("SLOTS slots"))
    }

    /// `n` database OIDs whose probes start at the same slot as `first`'s.
    fn colliding(first: u32, n: usize) -> Vec<u32> {
        (first..)
            .filter(|d| home(*d) == home(first))
            .take(n)
            .collect()
    }

    fn index(slots: &Array, s: &Slot) -> usize {
        slots.iter().position(|x| std::ptr::eq(x, s)).unwrap()
    }

    #[pg_test]
    fn a_probe_goes_on_past_a_freed_slot_and_a_claim_takes_it_again() {
        let slots = fresh();
        let dbs = colliding(16_384, 4);
        let (a, b, c, d) = (dbs[0], dbs[1], dbs[2], dbs[3]);
        assert!(find(&slots, a).is_none());
        let sa = index(&slots, find_or_claim(&slots, a));
        let sb = index(&slots, find_or_claim(&slots, b));
        let sc = index(&slots, find_or_claim(&slots, c));
        assert_eq!((sb, sc), ((sa + 1) % SLOTS, (sa + 2) % SLOTS));
        // Found again, not taken twice.
        assert_eq!(index(&slots, find_or_claim(&slots, b)), sb);
        // Free b's slot: c is still found past it, b is not.
        slots[sb].epoch.store(7, Ordering::SeqCst);
        slots[sb].db.store(0, Ordering::SeqCst);
        assert!(find(&slots, b).is_none());
        assert_eq!(index(&slots, find(&slots, c).unwrap()), sc);
        // d takes b's old slot, its epoch made even; c is still where it was.
        let sd = find_or_claim(&slots, d);
        assert_eq!(index(&slots, sd), sb);
        assert_eq!(sd.epoch.load(Ordering::SeqCst), 8);
        assert_eq!(index(&slots, find(&slots, c).unwrap()), sc);
    }

    #[pg_test(
        error = "dedup: no room for this database's generations: 1024 databases of this server use them"
    )]
    fn a_full_array_refuses_one_more_database() {
        let slots = fresh();
        for db in 1..=SLOTS as u32 {
            find_or_claim(&slots, db);
        }
        for db in 1..=SLOTS as u32 {
            assert!(find(&slots, db).is_some());
        }
        find_or_claim(&slots, SLOTS as u32 + 1);
    }
}

/// `dedup._generations_changed()`, the trigger of `dedup.generations` (`AFTER` each row
/// inserted, updated or deleted, and each `TRUNCATE`): the changing transaction moves the
/// epoch at its commit, as a publication does ([`publishing`]; the rotation and
/// `use_generations()` have called it already, and a second call does nothing). What it is
/// for is a change that does not come through them: `pg_restore` copying the rows into a
/// database whose sessions (opened before the data) hold the list "no generations", which
/// they would keep, claiming into `dedup.processed` alone, while the epoch does not move.
/// Without the shared memory (not preloaded) it does nothing: no backend keeps a list then
/// (a claim refuses, 55000).
#[pg_trigger]
fn _generations_changed<'a>(
    _trigger: &'a pgrx::PgTrigger<'a>,
) -> Result<
    Option<pgrx::heap_tuple::PgHeapTuple<'a, pgrx::AllocatedByPostgres>>,
    pgrx::heap_tuple::PgHeapTupleError,
> {
    if available() {
        publishing();
    }
    Ok(None)
}
