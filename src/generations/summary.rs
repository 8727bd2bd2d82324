//! Summaries of sealed generations (issue 26, slice 4; docs/design/generations.md, "Cheap on
//! the claim path"): a split-block Bloom filter of the keys of each sealed generation, in
//! shared memory, so that a new claim skips the index probe of every sealed generation whose
//! filter says its key is certainly not there.
//!
//! **Why it is sound.** A sealed generation gains no row: its seal waited for every
//! transaction that could insert into it (`rotate.rs`), and a claimer with an old list that
//! still takes it for current starts over at its epoch check before inserting (the claim
//! protocol). Its rows can only go (`forget`, generation 0's pruner). So a filter built from
//! every row a snapshot taken after the seal wait sees holds every key the generation will
//! ever hold: "not in the filter" means "not in the generation", and the probe it saves
//! would have found nothing. A row deleted later stays in the filter, which then says
//! "maybe" for it: one probe, not a wrong answer. A generation with no filter (not built
//! yet, no room, after a restart or a promotion until the worker builds it) is probed:
//! slower, never wrong.
//!
//! **The memory.** `dedup.generation_memory` (postmaster; 0: none) of blocks shared by at
//! most [`SLOTS`] filters, plus their headers, asked for next to the epochs (so only with
//! `shared_preload_libraries = 'dedup'`). A filter is sized at [`BITS_PER_KEY`] bits per key
//! (a false-positive rate of about 0.1%) when that is at most an even share of the memory
//! (among the filters in use and those waiting to be built, and at least four), else at
//! less, never below [`MIN_BITS_PER_KEY`] (about 9%: still 11 probes spared of 12): the
//! rules are [`sizing`]'s. It is placed at the first gap that fits (when none does but the
//! free blocks together would, the filters in use are first moved down to join them:
//! [`compact`]); it is one range of 64-byte blocks, one cache line read per look-up (the
//! layout and hash steps of `src/expired`). A generation that does not fit gets no filter.
//!
//! **Filled as the claims go in** (`dedup.summaries_as_claimed`, on by default): the
//! publication opens a filter for the new generation before it commits ([`open_collecting`]),
//! every claim that inserts a row there sets its key's bits ([`Collecting::add`]), and once
//! the generation is sealed [`sync`] adopts it ([`adopt`]) instead of reading the table. Its
//! soundness is the seal's, as above: every inserter ended before the seal, and each added
//! its key first; a filter whose `seq` moved from the one it was opened at (no writer moves
//! one that collects: a check kept for safety) is not adopted, and one that is lost or
//! never opened leaves the table to be read.
//!
//! **Who writes.** Only [`sync`] (the worker after each pass, and
//! `dedup.rotate_generations`), and [`open_collecting`] (the publication) and the claims'
//! bits in a filter collecting: [`sync`] frees the filters of its database's generations that are
//! no longer sealed (retired, dropped) and builds the missing ones (when no gap fits a new
//! one but the free blocks would, it first moves the filters in use, of any database, down
//! to join them: [`compact`]); the worker frees those of a database that no longer uses
//! generations, and the launcher those of a dropped database. A filter is known by
//! (database, table OID, generation number): a table dropped and an OID used again by a
//! later generation of the same number in the same database would need the generation
//! numbers to go back, which only a restore into the database's own OID could make, after
//! the worker or the launcher had freed the old one. Writers take [`Area::busy`] with a
//! compare-and-swap, spinning, and hold it only while they copy bits already computed or
//! move filters: no call that can raise an ERROR runs under it. A filter being written has
//! an odd `seq` (a seqlock; the writer fences after making it odd): a reader notes the even
//! `seq` it matched, reads the bits with no lock, and trusts an "absent" only if `seq` is
//! unchanged after the read, so a filter freed and rebuilt for another generation under a
//! reader is never believed. A crash restart makes the memory anew: every filter is gone and
//! is rebuilt by the worker.
use crate::guc;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Filters at most: a few databases' sealed generations (a series has at most 4 sealed).
pub const SLOTS: usize = 32;
/// Bits per key a filter is sized at when the memory has room: a false-positive rate of
/// about 0.1% (at 10 bits, about 1%, the four summaries of a series at its flat-out
/// benchmark made 4% of all claims probe an index for nothing).
pub const BITS_PER_KEY: u64 = 16;
/// Bits per key a filter is sized at least, when the memory has less room than
/// [`BITS_PER_KEY`] takes: about 9%. Below it the generation waits, unsummarised, for
/// room (a summary dropped with its generation frees its blocks at the next pass).
pub const MIN_BITS_PER_KEY: u64 = 6;

/// The summaries the memory is shared by at least: a series' sealed generations (at most
/// four not yet expired), so that the first ones of a series do not take the room of those
/// sealed after them.
pub const SHARED_BY_AT_LEAST: u64 = 4;

/// What set a filter's size ([`sizing`]).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Sized {
    /// All it takes at [`BITS_PER_KEY`].
    Full,
    /// An even share among this many summaries.
    Share(u64),
    /// [`MIN_BITS_PER_KEY`]: its share among this many is less.
    Least(u64),
    /// The free blocks, too few for each generation waiting to have its share, split among
    /// this many.
    Free(u64),
    /// [`MIN_BITS_PER_KEY`]: too few blocks are free for more, or for the least of each
    /// generation waiting (the others wait for room).
    LeastFree,
}

/// The blocks a new filter of `keys` keys gets, and why, in an area of `total` blocks with
/// `in_use` filters in use, `waiting` generations of this database waiting for one (this
/// one included) and `free` blocks free: all it takes at [`BITS_PER_KEY`] if that is no
/// more than an even share among those filters and generations, and at least
/// [`SHARED_BY_AT_LEAST`]; else the share, never less than [`MIN_BITS_PER_KEY`] takes;
/// when the free blocks would not give each generation waiting that much, an even share of
/// them among those generations if that holds the least; else, if they do not hold this
/// one's size but hold the least, the least (the others wait for room); else that size
/// (place_filter finds no room, or this one gets it and the others wait). Flat out with 32
/// MB and generations of about 6 million claims (12 MB at 16 bits): when a filter took all
/// that was free (`1cc7687`), or an even share among the filters there were (`9899298`),
/// the first three were built at their full 16 bits (12 MB, then about 8 MB each: 28 MB),
/// and the fourth generation sealed found too little room and waited about 30 s,
/// unsummarised, for the first to be dropped (3.1 and 3.3 million probes).
fn sizing(keys: u64, total: u64, in_use: u64, waiting: u64, free: u64) -> (u64, Sized) {
    let least = blocks_for(keys, MIN_BITS_PER_KEY);
    let full = blocks_for(keys, BITS_PER_KEY);
    let sharing = (in_use + waiting).max(SHARED_BY_AT_LEAST);
    let share = total / sharing;
    let (want, why) = if full <= share {
        (full, Sized::Full)
    } else if share >= least {
        (share, Sized::Share(sharing))
    } else {
        (least, Sized::Least(sharing))
    };
    let of_free = free / waiting.max(1);
    if of_free < want && of_free >= least {
        (of_free, Sized::Free(waiting.max(1)))
    } else if want > free && free >= least {
        (least, Sized::LeastFree)
    } else {
        (want, why)
    }
}

const BLOCK_WORDS: usize = 8;
const BLOCK_BYTES: usize = BLOCK_WORDS * 8;

/// One filter's header.
#[repr(C)]
#[derive(Default)]
struct Slot {
    /// Odd while written; every write moves it by 2 in all.
    seq: AtomicU64,
    db: AtomicU32,
    relid: AtomicU32,
    n: AtomicU32,
    /// Its first block in the shared bits.
    offset: AtomicU64,
    /// Its blocks; 0: the slot is free.
    blocks: AtomicU64,
    keys: AtomicU64,
    built_at: AtomicI64,
    /// The latest `lease_expires_at` of its rows when it was built (µs since 2000;
    /// i64::MIN: none; i64::MAX: not known, for a filter built as its claims went in that
    /// took a lease function's row). A sealed generation gains no lease and none changes
    /// there (a lease taken over, extended or completed moves out), so no lease in it runs
    /// past this.
    leases_until: AtomicI64,
    /// 1 while the filter is filled as its generation's claims go in ([`open_collecting`]):
    /// no claim believes its "absent" answers ([`find`] skips it) until the seal has waited
    /// for every inserter and [`sync`] has adopted it.
    collecting: AtomicU32,
    /// The `seq` it was opened at: any later change of the slot (a move, a free) moves
    /// `seq`, and a filter whose `seq` moved while it was collecting is not adopted (a claim
    /// may have set its bits where it was before).
    opened: AtomicU64,
    /// The transaction that opened it while collecting (the publication's): until it ends
    /// the generation is in no list another transaction reads, so [`sync`] and
    /// [`forget_idle_database`] leave the filter alone.
    opener: AtomicU32,
    /// 1 once a lease function's row went into it while collecting (the leases are then
    /// looked for at the retirement, as without a summary).
    leases: AtomicU32,
}

impl Slot {
    /// Is it in use, for generation `n`, table `relid`, of database `db` (collecting or
    /// built, whatever its `seq`: a seqlock reader checks `seq` around it)?
    fn is(&self, db: u32, relid: pg_sys::Oid, n: i32) -> bool {
        self.blocks.load(Ordering::Relaxed) > 0
            && self.db.load(Ordering::Relaxed) == db
            && self.relid.load(Ordering::Relaxed) == u32::from(relid)
            && self.n.load(Ordering::Relaxed) == n as u32
    }

    fn is_collecting(&self) -> bool {
        self.collecting.load(Ordering::Relaxed) == 1
    }
}

#[repr(C)]
struct Area {
    /// The hash's seed, random at each start (a role cannot choose job ids whose keys
    /// collide in every filter).
    secret: u64,
    /// The blocks of the shared bits.
    blocks: u64,
    /// 1 while a writer changes the slots.
    busy: AtomicU32,
    slots: [Slot; SLOTS],
}

static mut AREA: *mut Area = std::ptr::null_mut();
static mut BITS: *mut AtomicU64 = std::ptr::null_mut();

/// Blocks for `dedup.generation_memory` (kB); 0: off.
fn total_blocks() -> u64 {
    let bytes = u64::try_from(guc::GENERATION_MEMORY.get()).unwrap_or(0) * 1024;
    bytes / BLOCK_BYTES as u64
}

/// The shared memory the filters need (0: off).
fn shmem_size() -> usize {
    let blocks = total_blocks();
    if blocks == 0 {
        return 0;
    }
    std::mem::size_of::<Area>() + BLOCK_BYTES + blocks as usize * BLOCK_BYTES
}

/// Ask for the filters' memory (from stats' shmem_request hook).
///
/// # Safety
///
/// Inside shmem_request_hook (or _PG_init before 15's hook existed), in the postmaster,
/// under a #[pg_guard].
pub(crate) unsafe fn request() {
    let size = shmem_size();
    if size > 0 {
        // SAFETY: the contract above: it only records the request.
        pg_sys::RequestAddinShmemSpace(size);
    }
}

/// Make (zeroed) or attach to the filters' memory.
///
/// # Safety
///
/// From stats' shmem_startup hook, with AddinShmemInitLock held, under its #[pg_guard].
pub(crate) unsafe fn attach() {
    let size = shmem_size();
    if size == 0 {
        return;
    }
    let mut found = false;
    // SAFETY: ShmemInitStruct returns `size` bytes of shared memory, MAXALIGNed, for the
    // postmaster's life; when new they are written here before AREA is set (no backend
    // exists yet; under EXEC_BACKEND a child finds them made). The bits start at the first
    // 64-byte boundary after the Area, inside the `size` bytes (BLOCK_BYTES of slack).
    let base = pg_sys::ShmemInitStruct(c"dedup generation summaries".as_ptr(), size, &mut found)
        .cast::<u8>();
    let area = base.cast::<Area>();
    let after = base.add(std::mem::size_of::<Area>());
    let bits = after
        .add(after.align_offset(BLOCK_BYTES))
        .cast::<AtomicU64>();
    if !found {
        std::ptr::write_bytes(base, 0, size);
        (*area).blocks = total_blocks();
        (*area).secret = crate::expired::random_secret();
    }
    AREA = area;
    BITS = bits;
}

fn area() -> Option<&'static Area> {
    // SAFETY: AREA is written only in attach(), in the postmaster before any backend is
    // forked (or in a child before it runs anything); the Area's plain fields are written
    // before it is set, the rest are atomics.
    unsafe {
        let a = std::ptr::addr_of!(AREA).read();
        (!a.is_null()).then(|| &*a)
    }
}

impl Area {
    fn block(&self, block: u64) -> &[AtomicU64; BLOCK_WORDS] {
        debug_assert!(block < self.blocks);
        // SAFETY: BITS points to `blocks` blocks of BLOCK_WORDS atomics in shared memory
        // (attach()), and the index is inside them.
        unsafe {
            &*std::ptr::addr_of!(BITS)
                .read()
                .add(block as usize * BLOCK_WORDS)
                .cast::<[AtomicU64; BLOCK_WORDS]>()
        }
    }
}

/// Is there shared memory for the filters (preloaded, `dedup.generation_memory` above 0)?
pub(crate) fn available() -> bool {
    area().is_some()
}

/// The part of a key's hash for the summaries its scope decides (not the expired claims'
/// ring's `expired::scope_seed`, which has its own secret and the database): made once for
/// the keys of a call, which share their scope ([`hash_in`]); 1 + len/8 (rounded up) of the
/// rounds, two of a bigint id's six in the scope 'default'.
pub(crate) fn filter_seed(scope: &str) -> u64 {
    seed_of(scope.as_bytes())
}

/// The hash of a key of the scope whose [`filter_seed`] is `seed`, the same for every filter
/// of this server's life.
#[inline]
pub(crate) fn hash_in(seed: u64, job_id: &str) -> u64 {
    crate::expired::fold(seed, job_id.as_bytes())
}

fn seed_of(scope: &[u8]) -> u64 {
    let secret = area().map_or(0, |a| a.secret);
    crate::expired::fold(secret, scope)
}

/// The hash of a key read from a generation's row: [`hash_in`]'s.
fn hash_bytes(scope: &[u8], job_id: &[u8]) -> u64 {
    crate::expired::fold(seed_of(scope), job_id)
}

/// The bytes of text column `att` of the slot's row (detoasted into the current memory
/// context); an ERROR if it is NULL (a claim table's key columns are NOT NULL).
///
/// # Safety
///
/// `slot` holds a row whose column `att` is text; under pgrx's guard.
unsafe fn text_bytes<'a>(slot: *mut pg_sys::TupleTableSlot, att: i32) -> &'a [u8] {
    let mut isnull = false;
    let datum = pg_sys::slot_getattr(slot, att, &mut isnull);
    if isnull {
        pgrx::error!("dedup: a generation holds a claim whose key is NULL");
    }
    // SAFETY: a text datum; pg_detoast_datum_packed returns it, or a detoasted copy in the
    // current memory context, valid while the slot holds the row (the caller hashes it at
    // once).
    let v = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
    pgrx::varlena::varlena_to_byte_slice(v)
}

/// A filter a claim holds for one sealed generation: which slot, and the `seq` it matched.
pub(crate) struct Held {
    slot: usize,
    seq: u64,
    offset: u64,
    blocks: u64,
}

/// What a generation without a summary costs, said (at LOG, by the worker) when one does not
/// fit: the worker says it again at each pass until it fits or is dropped.
pub(crate) const UNSUMMARISED: &str =
    "until it is summarised or dropped, every new claim probes its index (counted in \
     unsummarised_probes of dedup.stats; raise dedup.generation_memory, which needs a \
     restart: about 2 bytes per sealed claim)";

/// The filter of generation `n`, table `relid`, of this database, if it is built. A table
/// rewritten since (VACUUM FULL, CLUSTER) holds the same rows or fewer: its filter still
/// holds every key it has. A claim may use it without a lock on the table: a key the filter
/// does not hold is not in the table, whether or not the table is being dropped.
pub(crate) fn find(relid: pg_sys::Oid, n: i32) -> Option<Held> {
    let (slot, seq, offset, blocks) = lookup(relid, n, false)?;
    Some(Held {
        slot,
        seq,
        offset,
        blocks,
    })
}

/// The filter of generation `n`, table `relid`, of this database, built (`collecting`
/// false) or still collecting (true), read under its seqlock: its slot, the `seq` it
/// matched, its first block and its blocks, as one consistent state of the slot.
fn lookup(relid: pg_sys::Oid, n: i32, collecting: bool) -> Option<(usize, u64, u64, u64)> {
    let area = area()?;
    // SAFETY: a backend global.
    let db = u32::from(unsafe { pg_sys::MyDatabaseId });
    for (i, s) in area.slots.iter().enumerate() {
        let seq = s.seq.load(Ordering::Acquire);
        if seq % 2 == 1 || s.is_collecting() != collecting || !s.is(db, relid, n) {
            continue;
        }
        let (offset, blocks) = (
            s.offset.load(Ordering::Relaxed),
            s.blocks.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) == seq {
            return Some((i, seq, offset, blocks));
        }
    }
    None
}

/// Ask the CPU to bring into its cache the block of `hash` in the filter of `blocks` blocks
/// from `offset` (for [`Held::prefetch`] and [`Collecting::prefetch`]).
#[inline]
fn prefetch_block(offset: u64, blocks: u64, hash: u64) {
    let Some(area) = area() else { return };
    crate::expired::prefetch(area.block(offset + crate::expired::block_of(hash, blocks)));
}

impl Held {
    /// Ask the CPU to bring into its cache the block [`Held::absent`] will read for `hash`,
    /// without waiting for it: a batch asks a few keys ahead, so that a new key's look-up
    /// (a cache miss per filter otherwise: the filters are megabytes, read at random) finds
    /// its block there. Changes no answer: a hint that reads nothing observable.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        prefetch_block(self.offset, self.blocks, hash);
    }

    /// Is the key of `hash` certainly not in the generation? False when it may be, and when
    /// the filter changed since it was found.
    pub(crate) fn absent(&self, hash: u64) -> bool {
        let Some(area) = area() else { return false };
        let (block, bits) = crate::expired::place(hash, self.blocks);
        let words = area.block(self.offset + block);
        let missing = words
            .iter()
            .zip(bits)
            .any(|(w, b)| w.load(Ordering::Relaxed) & b == 0);
        fence(Ordering::Acquire);
        missing && area.slots[self.slot].seq.load(Ordering::Relaxed) == self.seq
    }
}

/// Take the writers' flag, or None if another writer kept it through a few million tries. A
/// writer holds it only while it copies bits it has computed or moves filters (no call that
/// can raise an ERROR or wait runs under it): microseconds to a few milliseconds for the
/// largest filter, and for a compaction the copy of the filters it moves (at most
/// `dedup.generation_memory`; the line that says the new filter was built says how long it
/// took); a process killed under it takes the shared memory with it (the postmaster's crash
/// restart makes it anew).
fn take(area: &Area) -> Option<Busy<'_>> {
    for i in 0..10_000_000u32 {
        if area
            .busy
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return Some(Busy(area));
        }
        if i % 1024 == 1023 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    None
}

struct Busy<'a>(&'a Area);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.store(0, Ordering::Release);
    }
}

/// Free slot `s` (the writers' flag held).
fn free(s: &Slot) {
    s.seq.fetch_add(1, Ordering::Relaxed);
    // The writer's half of the seqlock: no write below becomes visible before the odd
    // number does (a reader that sees one of them sees seq changed after its read).
    fence(Ordering::Release);
    s.blocks.store(0, Ordering::Relaxed);
    s.collecting.store(0, Ordering::Relaxed);
    s.seq.fetch_add(1, Ordering::Release);
}

/// The free gaps among the filters in use, as (first block, blocks), lowest first, the one
/// after the last filter included (the writers' flag held).
fn gaps(area: &Area) -> Vec<(u64, u64)> {
    let mut used: Vec<(u64, u64)> = area
        .slots
        .iter()
        .filter(|s| s.blocks.load(Ordering::Relaxed) > 0)
        .map(|s| {
            (
                s.offset.load(Ordering::Relaxed),
                s.blocks.load(Ordering::Relaxed),
            )
        })
        .collect();
    used.sort_unstable();
    let mut gaps = Vec::new();
    let mut at = 0u64;
    for (offset, blocks) in used.into_iter().chain([(area.blocks, 0)]) {
        if offset > at {
            gaps.push((at, offset - at));
        }
        at = at.max(offset + blocks);
    }
    gaps
}

/// A gap of `want` blocks among the filters in use, first fit (the writers' flag held).
fn gap(area: &Area, want: u64) -> Option<u64> {
    gaps(area)
        .into_iter()
        .find(|&(_, len)| len >= want)
        .map(|(at, _)| at)
}

/// A gap of `want` blocks among the filters in use, the highest that fits, at its top (the
/// writers' flag held): where a filter still collecting goes, which is not moved while it
/// collects, so that it splits the free blocks below it as little as it can.
fn gap_at_top(area: &Area, want: u64) -> Option<u64> {
    gaps(area)
        .into_iter()
        .rev()
        .find(|&(_, len)| len >= want)
        .map(|(at, len)| at + len - want)
}

/// The blocks of the largest gap among the filters in use (the writers' flag held).
fn largest_gap(area: &Area) -> u64 {
    gaps(area)
        .into_iter()
        .map(|(_, len)| len)
        .max()
        .unwrap_or(0)
}

/// How many slots hold a summary (the writers' flag held, or an estimate without it).
fn slots_in_use(area: &Area) -> u64 {
    area.slots
        .iter()
        .filter(|s| s.blocks.load(Ordering::Relaxed) > 0)
        .count() as u64
}

/// The blocks no filter uses (the writers' flag held, or an estimate without it).
fn free_blocks(area: &Area) -> u64 {
    let used: u64 = area
        .slots
        .iter()
        .map(|s| s.blocks.load(Ordering::Relaxed))
        .sum();
    area.blocks.saturating_sub(used)
}

/// Is there a free slot, and `want` free blocks, now (in one gap, or once [`compact`]
/// has joined the gaps)? (Read without the writers' flag: an estimate, which the placement
/// checks again under it.)
fn room_for(area: &Area, want: u64) -> bool {
    area.slots
        .iter()
        .any(|s| s.blocks.load(Ordering::Relaxed) == 0)
        && free_blocks(area) >= want
}

/// Where each filter in use moves to join the free blocks into one gap at the end: the
/// slots in use, as (slot, offset, blocks, fixed), give (slot, from, to) for each that
/// moves, in the order to move them (lowest first, each down to the end of the one before,
/// so a move never overwrites a filter not moved yet). A fixed one (a filter still
/// collecting, which claims write into where they found it: moved, it would not be adopted)
/// stays, and the ones after it move down to its end.
fn compaction(mut used: Vec<(usize, u64, u64, bool)>) -> Vec<(usize, u64, u64)> {
    used.sort_unstable_by_key(|&(_, offset, _, _)| offset);
    let mut at = 0;
    let mut moves = Vec::new();
    for (slot, offset, blocks, fixed) in used {
        // Filters do not overlap: each starts at or after the new end of the one before,
        // and one moved ends at or before its old end, below the next one's start.
        if fixed {
            at = offset + blocks;
            continue;
        }
        if offset > at {
            moves.push((slot, offset, at));
        }
        at += blocks;
    }
    moves
}

/// Move the filters in use down, each to the end of the one before it, until a gap of `want`
/// blocks is free (at the latest when the free blocks are one gap at the end; the writers'
/// flag held; a filter still collecting is not moved, so the free blocks may stay in a gap
/// below it and one above). Filters of about the same size, freed oldest first, leave gaps each a little
/// too small for the next one: at the benchmark flat out, 12.6 MB free in three gaps (6.1,
/// 4.7 and 1.8 MB), none of which held a summary of 6.7 MB. A filter is moved as it is
/// built: its number is odd while its bits are copied, so a claim that found it before
/// believes none of its "absent" answers after (it probes instead, as for a generation
/// without a summary), and one that finds it after reads the bits where they are then. The
/// copy goes from the lowest block up, the destination below the source. The filters it
/// moved and their blocks.
fn compact(area: &Area, want: u64) -> (usize, u64) {
    let used: Vec<(usize, u64, u64, bool)> = area
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.blocks.load(Ordering::Relaxed) > 0)
        .map(|(i, s)| {
            (
                i,
                s.offset.load(Ordering::Relaxed),
                s.blocks.load(Ordering::Relaxed),
                s.collecting.load(Ordering::Relaxed) == 1,
            )
        })
        .collect();
    let mut moved = (0, 0);
    for (i, from, to) in compaction(used) {
        // Only as far as it takes: each move joins the gap below the filter with the one
        // above it.
        if gap(area, want).is_some() {
            break;
        }
        let slot = &area.slots[i];
        let blocks = slot.blocks.load(Ordering::Relaxed);
        slot.seq.fetch_add(1, Ordering::Relaxed);
        // As in free(): the odd number before any bit.
        fence(Ordering::Release);
        for b in 0..blocks {
            for (dst, src) in area.block(to + b).iter().zip(area.block(from + b)) {
                dst.store(src.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        slot.offset.store(to, Ordering::Relaxed);
        slot.seq.fetch_add(1, Ordering::Release);
        moved = (moved.0 + 1, moved.1 + blocks);
    }
    moved
}

/// "N claim(s) in M kB", of a summary of `keys` claims in `blocks` blocks (as the lines that
/// say a summary was made put it).
fn claims_in(keys: u64, blocks: u64) -> String {
    format!(
        "{keys} claim{} in {} kB",
        if keys == 1 { "" } else { "s" },
        (blocks * BLOCK_BYTES as u64).div_ceil(1024)
    )
}

/// The blocks a filter of `keys` keys at `bits` bits per key takes.
pub fn blocks_for(keys: u64, bits: u64) -> u64 {
    (keys * bits).div_ceil(BLOCK_BYTES as u64 * 8).max(1)
}

/// One generation a summary is for: its number and table.
pub(crate) struct Gen {
    pub(crate) n: i32,
    pub(crate) relid: pg_sys::Oid,
}

impl From<&super::Generation> for Gen {
    fn from(g: &super::Generation) -> Gen {
        Gen {
            n: g.n,
            relid: g.relid,
        }
    }
}

/// Bring this database's filters in line with its generations: free the filters of
/// generations that are no longer sealed (retired, dropped), but for those still collecting
/// of the generations in `open` (current or sealing) and those whose publication may not have
/// ended (not in `ended`, taken by [`ended_openers`] before the list); adopt the filter a sealed generation
/// collected as its claims went in ([`adopt`]), and build by a scan those still missing.
/// What it did, one line each (nothing: an empty list).
///
/// # Safety
///
/// In a transaction of this database, under pgrx's guard (the scans raise ERRORs), after the
/// seal waits of `sealed` are over.
pub(crate) unsafe fn sync(sealed: &[Gen], open: &[Gen], ended: &[u32]) -> Vec<String> {
    let Some(area) = area() else {
        return Vec::new();
    };
    let db = u32::from(pg_sys::MyDatabaseId);
    // The sealed generations' tables, each locked in share mode to the end of the
    // transaction (no drop under the scan).
    let mut files = Vec::new();
    for g in sealed {
        let rel = pg_sys::try_table_open(g.relid, pg_sys::AccessShareLock as _);
        if rel.is_null() {
            continue;
        }
        files.push((g, rel));
    }
    let mut done = Vec::new();
    {
        let Some(_busy) = take(area) else {
            for (_, rel) in files {
                pg_sys::table_close(rel, pg_sys::NoLock as _);
            }
            return done;
        };
        for s in &area.slots {
            if s.blocks.load(Ordering::Relaxed) == 0 || s.db.load(Ordering::Relaxed) != db {
                continue;
            }
            let of = |g: &Gen| s.is(db, g.relid, g.n);
            // A filter still collecting is kept for a generation current or sealing, and for
            // a sealed one without a built filter (adopted below); not beside a built one.
            let keep = if s.is_collecting() {
                open.iter().any(of)
                    || files.iter().any(|(g, _)| of(g) && !built(area, db, g))
                    || opening(s, ended)
            } else {
                files.iter().any(|(g, _)| of(g))
            };
            if !keep {
                done.push(format!(
                    "freed the summary of generation {}",
                    s.n.load(Ordering::Relaxed)
                ));
                free(s);
            }
        }
    }
    // This database's sealed generations without a filter, which share the memory with
    // the filters in use (`sizing`); fewer as they are built (not when one finds no room:
    // it still waits). (Built, even if being moved by a compaction in another database's
    // sync: not read again for that.)
    let mut waiting = files.iter().filter(|(g, _)| !built(area, db, g)).count() as u64;
    for (g, rel) in files {
        // The filter it collected as its claims went in, if it has one and it holds (a
        // delete does not matter to it: it holds every key inserted).
        let adopted = if built(area, db, g) {
            None
        } else {
            adopt(area, db, g, waiting.max(1))
        };
        if let Some((line, true)) = &adopted {
            done.push(line.clone());
            waiting = waiting.saturating_sub(1);
        } else if !built(area, db, g) {
            if let Some((line, false)) = adopted {
                done.push(line);
            }
            // Not read by a transaction that deleted from the generation (a `forget`, a
            // lease moved out, in the caller's transaction of rotate_generations()): its
            // snapshot does not see the rows it deleted, which come back if it rolls back,
            // and a filter without them would tell a claim of their jobs that they are not
            // there. The next pass builds it. (A delete of another transaction in progress
            // is seen: its rows are read.)
            if super::locked_by_me(g.relid, pg_sys::RowExclusiveLock) {
                done.push(format!(
                    "did not summarise generation {}: this transaction changed it (a later \
                     pass builds it)",
                    g.n
                ));
            } else {
                // Not read at every pass when it cannot fit: a table whose row count is known
                // (VACUUM and ANALYZE set it) and needs more than the free blocks even at
                // MIN_BITS_PER_KEY is left alone.
                let estimate = (*(*rel).rd_rel).reltuples;
                if estimate > 0.0
                    && !room_for(area, blocks_for((estimate * 0.9) as u64, MIN_BITS_PER_KEY))
                {
                    done.push(format!(
                        "did not summarise generation {} (about {estimate:.0} claims): no free \
                         summary, or no room in dedup.generation_memory; {UNSUMMARISED}",
                        g.n
                    ));
                } else {
                    let (hashes, leases_until) = keys_of(rel);
                    done.push(place_filter(
                        area,
                        db,
                        g,
                        &hashes,
                        leases_until,
                        waiting.max(1),
                    ));
                    // (Another writer may have freed one counted as built since, which this
                    // pass then built, or built one counted as waiting: hence no underflow, at
                    // worst a share a little too large or too small for this pass.)
                    if built(area, db, g) {
                        waiting = waiting.saturating_sub(1);
                    }
                }
            }
        }
        pg_sys::table_close(rel, pg_sys::NoLock as _);
    }
    done
}

/// The publications (transaction ids) of the filters collecting that have ended, committed
/// or rolled back, looked up before the writers' flag is taken (the look-up takes a
/// lightweight lock, which is not taken under the flag). Until its publication ends a
/// generation is in no list but its publisher's, so a filter collecting whose opener is not
/// in it (still in progress, or opened since) is kept ([`opening`]). Taken before the list
/// of generations is read: a publication that ended by then is in it, if it committed.
///
/// # Safety
///
/// In a transaction.
pub(crate) unsafe fn ended_openers() -> Vec<u32> {
    let Some(area) = area() else {
        return Vec::new();
    };
    let mut ended = Vec::new();
    for s in &area.slots {
        let xid = s.opener.load(Ordering::Relaxed);
        if s.blocks.load(Ordering::Relaxed) > 0
            && s.collecting.load(Ordering::Relaxed) == 1
            && !pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(xid))
        {
            ended.push(xid);
        }
    }
    ended
}

/// Is `s` a filter still collecting whose publication may not have ended (its opener not
/// among `ended`: see [`ended_openers`])?
fn opening(s: &Slot, ended: &[u32]) -> bool {
    s.collecting.load(Ordering::Relaxed) == 1 && !ended.contains(&s.opener.load(Ordering::Relaxed))
}

/// Free the filters of this database, which no longer uses generations (the extension was
/// dropped; the worker), but one whose publication is still open (a `use_generations()` not
/// committed yet); how many.
///
/// # Safety
///
/// In a transaction.
pub(crate) unsafe fn forget_idle_database() -> usize {
    let Some(area) = area() else { return 0 };
    let db = u32::from(pg_sys::MyDatabaseId);
    let ended = ended_openers();
    let Some(_busy) = take(area) else { return 0 };
    let mut n = 0;
    for s in &area.slots {
        if s.blocks.load(Ordering::Relaxed) > 0
            && s.db.load(Ordering::Relaxed) == db
            && !opening(s, &ended)
        {
            free(s);
            n += 1;
        }
    }
    n
}

/// Does a filter of generation `g` of database `db` exist, whatever its sequence number
/// (a writer may be moving it)? An estimate: [`place_filter`] looks again under the
/// writers' flag.
fn built(area: &Area, db: u32, g: &Gen) -> bool {
    area.slots
        .iter()
        .any(|s| !s.is_collecting() && s.is(db, g.relid, g.n))
}

/// The hashes of every key of `rel` a snapshot taken now sees, and the latest
/// `lease_expires_at` among them (i64::MIN: none, or a table of 0.2.0's columns).
///
/// # Safety
///
/// `rel` is an open generation table (scope and job_id its first two columns, as
/// `claim::check_layout` requires); in a transaction, under pgrx's guard.
unsafe fn keys_of(rel: pg_sys::Relation) -> (Vec<u64>, i64) {
    // Its columns are a claim table's (scope, job_id first), or an ERROR.
    let leases = crate::claim::check_layout(rel, "dedup: summarising a generation")
        == crate::claim::Layout::Leases;
    // SAFETY: scan_rows' contract; the keys' bytes are hashed before the next row;
    // lease_expires_at is the seventh column of the Leases layout, a timestamptz.
    let mut hashes = Vec::new();
    let mut leases_until = i64::MIN;
    super::scan_rows(rel, |slot| {
        let (scope, job) = (text_bytes(slot, 1), text_bytes(slot, 2));
        hashes.push(hash_bytes(scope, job));
        if leases {
            let mut null = false;
            let until = pg_sys::slot_getattr(slot, crate::claim::LEASE_EXPIRES_AT, &mut null);
            if !null {
                leases_until = leases_until.max(until.value() as i64);
            }
        }
    });
    (hashes, leases_until)
}

/// The latest `lease_expires_at` in generation `n`, table `relid`, of this database when
/// its summary was built (i64::MIN: none), and how many claims it had; None without a
/// summary. No lease in the generation runs past it (see [`Slot`]).
pub(crate) fn built_with(relid: pg_sys::Oid, n: i32) -> Option<(i64, u64)> {
    let held = find(relid, n)?;
    let s = &area()?.slots[held.slot];
    let read = (
        s.leases_until.load(Ordering::Relaxed),
        s.keys.load(Ordering::Relaxed),
    );
    fence(Ordering::Acquire);
    (s.seq.load(Ordering::Relaxed) == held.seq).then_some(read)
}

/// Pass the claims of a generation being retired to the summaries of expired claims
/// (`src/expired`), as a prune pass passes those it deletes: from the retirement on no claim
/// looks in the generation, so a copy of one of its jobs that comes later runs again, and
/// is counted in `expired_duplicates` (measured from the claim's `processed_at` plus
/// `longest_secs`, the retention the generation was kept for). Read in batches with a
/// snapshot taken now, until the summary in use is full after a batch wholly inside the
/// look-back (then the rest, by the generation's summary's count, are counted as not kept
/// unread); how many claims it had, and how many the summaries took (the others were past
/// the look-back, or the current summary was full). Nothing without the
/// ring (`dedup.expired_memory = 0`) or with `dedup.expired_lookback = 0`.
///
/// # Safety
///
/// In a transaction of this database, under pgrx's guard.
pub(crate) unsafe fn pass_to_expired(relid: pg_sys::Oid, n: i32, longest_secs: f64) -> (u64, u64) {
    if !crate::expired::enabled() {
        return (0, 0);
    }
    // How many claims its summary was built with: once the summaries of expired claims
    // are full, the rest are counted as not kept, not read (a generation of millions of
    // claims, most past what a summary takes, was read whole at each retirement). Not for
    // generation 0, dedup.processed, from which the pruner deletes (claims it passed to
    // the summaries already) until its truncation: its summary's count is too high.
    let total = (n != 0)
        .then(|| built_with(relid, n).map(|(_, keys)| keys))
        .flatten();
    let rel = pg_sys::try_table_open(relid, pg_sys::AccessShareLock as _);
    if rel.is_null() {
        return (0, 0);
    }
    let longest_us = (longest_secs * 1e6) as i64;
    // Its columns are a claim table's (scope, job_id, processed_at first), or an ERROR.
    crate::claim::check_layout(rel, "dedup: retiring a generation");
    // SAFETY: as in keys_of (the keys copied into Strings before the next row); the third
    // column is processed_at, a timestamptz.
    let mut batch: Vec<(String, String, i64)> = Vec::with_capacity(PASS_BATCH);
    let (mut read, mut kept) = (0u64, 0u64);
    let mut stopped = false;
    let mut earliest = i64::MAX;
    super::scan_rows_while(rel, |slot| {
        read += 1;
        let (scope, job) = (text_bytes(slot, 1), text_bytes(slot, 2));
        let mut at_null = false;
        let at = pg_sys::slot_getattr(slot, 3, &mut at_null);
        // A key that is not UTF-8 (a database of another encoding) is left out: no claim
        // function could have taken it, and the summaries hash the text of a claim's key.
        if let (Ok(scope), Ok(job), false) = (
            std::str::from_utf8(scope),
            std::str::from_utf8(job),
            at_null,
        ) {
            let expiry = (at.value() as i64).saturating_add(longest_us);
            earliest = earliest.min(expiry);
            batch.push((scope.to_string(), job.to_string(), expiry));
        }
        if batch.len() == PASS_BATCH {
            kept += crate::expired::remember(&batch, longest_us);
            batch.clear();
            // Only once a whole batch was inside the look-back (the rows after it, inserted
            // later, expire later), so that the rest counted as not kept are those a read
            // would have counted so.
            let now = pg_sys::GetCurrentTimestamp();
            stopped = total.is_some_and(|t| t > read)
                && earliest >= crate::expired::lookback_start(now)
                && crate::expired::full(now);
            earliest = i64::MAX;
        }
        !stopped
    });
    kept += crate::expired::remember(&batch, longest_us);
    pg_sys::table_close(rel, pg_sys::NoLock as _);
    if stopped {
        let rest = total.unwrap_or(read).saturating_sub(read);
        crate::expired::count_not_kept(rest);
        read += rest;
    }
    (read, kept)
}

/// Claims passed to `src/expired` at a time.
const PASS_BATCH: usize = 10_000;

/// Place a filter of `hashes` for generation `g` in a free slot and a gap of the bits, sized
/// by [`sizing`] with `waiting` generations of this database still to build (`g`
/// included); what was done.
fn place_filter(
    area: &Area,
    db: u32,
    g: &Gen,
    hashes: &[u64],
    leases_until: i64,
    waiting: u64,
) -> String {
    let Some(_busy) = take(area) else {
        return format!(
            "did not summarise generation {}: another process was changing the summaries",
            g.n
        );
    };
    // Built meanwhile by another writer (the worker and rotate_generations() at once).
    if find(g.relid, g.n).is_some() {
        return format!(
            "did not summarise generation {}: it was summarised meanwhile",
            g.n
        );
    }
    let keys = hashes.len() as u64;
    let in_use = slots_in_use(area);
    let (want, why) = sizing(keys, area.blocks, in_use, waiting, free_blocks(area));
    let Some(slot) = area
        .slots
        .iter()
        .find(|s| s.blocks.load(Ordering::Relaxed) == 0)
    else {
        return format!(
            "did not summarise generation {}: all {SLOTS} summaries are in use; {UNSUMMARISED}",
            g.n
        );
    };
    // Enough free blocks in gaps that are each too small: join them first (said with the
    // time it held the writers' flag for it).
    let mut compacted = String::new();
    if gap(area, want).is_none() && free_blocks(area) >= want {
        let started = std::time::Instant::now();
        let (filters, blocks) = compact(area, want);
        compacted = format!(
            ", after moving {filters} summar{} of {} kB in {:.1} ms to join the free blocks",
            if filters == 1 { "y" } else { "ies" },
            (blocks * BLOCK_BYTES as u64).div_ceil(1024),
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    let Some(offset) = gap(area, want) else {
        return format!(
            "did not summarise generation {} ({} claims): dedup.generation_memory has no room \
             for {} kB more (its summary at {MIN_BITS_PER_KEY} bits a claim); {UNSUMMARISED}",
            g.n,
            hashes.len(),
            (blocks_for(keys, MIN_BITS_PER_KEY) * BLOCK_BYTES as u64).div_ceil(1024)
        );
    };
    slot.seq.fetch_add(1, Ordering::Relaxed);
    // As in free(): the odd number before any bit.
    fence(Ordering::Release);
    for b in offset..offset + want {
        for w in area.block(b) {
            w.store(0, Ordering::Relaxed);
        }
    }
    for &h in hashes {
        let (block, bits) = crate::expired::place(h, want);
        for (w, bit) in area.block(offset + block).iter().zip(bits) {
            w.fetch_or(bit, Ordering::Relaxed);
        }
    }
    slot.db.store(db, Ordering::Relaxed);
    slot.relid.store(u32::from(g.relid), Ordering::Relaxed);
    slot.n.store(g.n as u32, Ordering::Relaxed);
    slot.offset.store(offset, Ordering::Relaxed);
    slot.blocks.store(want, Ordering::Relaxed);
    slot.keys.store(hashes.len() as u64, Ordering::Relaxed);
    slot.leases_until.store(leases_until, Ordering::Relaxed);
    slot.collecting.store(0, Ordering::Relaxed);
    // SAFETY: reads the clock.
    slot.built_at
        .store(unsafe { pg_sys::GetCurrentTimestamp() }, Ordering::Relaxed);
    slot.seq.fetch_add(1, Ordering::Release);
    let why = match why {
        Sized::Full => None,
        Sized::Share(n) => Some(format!(
            "its even share of dedup.generation_memory among {n} summaries"
        )),
        Sized::Least(n) => Some(format!(
            "the least a summary is given, its even share of dedup.generation_memory among \
             {n} summaries being less"
        )),
        Sized::Free(n) => Some(format!(
            "an even share of the free part of dedup.generation_memory among the {n} \
             generations waiting for a summary"
        )),
        Sized::LeastFree => Some(
            "the least a summary is given, with too little of dedup.generation_memory free \
             for more"
                .to_string(),
        ),
    };
    let fewer = why.map_or(String::new(), |why| {
        format!(
            " (at {:.1} bits a claim, a false-positive rate of {:.1}%: {why})",
            (want * BLOCK_BYTES as u64 * 8) as f64 / keys as f64,
            100.0 * crate::expired::false_positive_rate(keys, want),
        )
    });
    format!(
        "summarised generation {}: {}{fewer}{compacted}",
        g.n,
        claims_in(keys, want)
    )
}

/// `blocks` rounded down to its four highest bits (a multiple of 2^j with an odd factor
/// below 16): a filter that collects has that many, so that [`adopt`] can halve it until
/// half would hold less than its claims take, from any size down to 8 to 15 blocks. (The
/// even share of the memory a first generation opens with rarely is one: 5,462 kB took 3
/// claims, folded once to 2,731 kB, then odd.) Less than an eighth below `blocks`.
fn foldable(blocks: u64) -> u64 {
    let shift = (64 - blocks.leading_zeros()).saturating_sub(4);
    (blocks >> shift) << shift
}

/// How many claims a new generation's filter is opened for ([`open_collecting`]).
pub(crate) enum Expected {
    /// About as many as the generation before it had: twice this.
    Keys(u64),
    /// Not known (no generation before; its summary too full to count; without a summary,
    /// its table never analysed), but at least `at_least`.
    NotKnown { at_least: u64 },
}

/// The keys a filter collected as claims went in is sized for at least (a generation that
/// follows one of fewer claims): an underestimate is read again at the seal.
const COLLECT_AT_LEAST: u64 = 65_536;

/// Open a filter for generation `n`, table `relid`, of this database, which its claims fill
/// as they go in ([`Collecting::add`]), sized for twice `expected` keys (the claims of the
/// generation before; not known, a share of the memory among at least eight, or twice
/// what it had at least if more; folded down at the seal to what it took: [`adopt`]) within [`sizing`]'s share of
/// the memory: what was done. The caller is publishing the
/// generation (under the publishing lock, before its commit): no claim can insert into it
/// before the filter exists, so every claim of it finds the filter and adds its key, or
/// finds none (freed meanwhile, or never opened: no room) and the seal reads the table.
/// Only here is a filter opened for collecting, and only for a generation not yet published
/// (a filter opened later would lack the keys of the claims before it).
///
/// The filters of this database's generations not in `live` (retired or dropped, by this
/// pass or another: [`sync`] frees them only after the publication) are freed first, so
/// that a retirement due with the publication makes room for it: said first, one line each.
pub(crate) fn open_collecting(
    relid: pg_sys::Oid,
    n: i32,
    expected: Expected,
    live: &[Gen],
    opener: pg_sys::TransactionId,
) -> (Vec<String>, String) {
    let Some(area) = area() else {
        return (Vec::new(), String::new());
    };
    // SAFETY: a backend global.
    let db = u32::from(unsafe { pg_sys::MyDatabaseId });
    let Some(_busy) = take(area) else {
        return (
            Vec::new(),
            format!(
                "did not open a summary of generation {n} to fill as claims go in: another \
                 process was changing the summaries (its seal reads it)"
            ),
        );
    };
    let mut freed = Vec::new();
    for s in &area.slots {
        if s.blocks.load(Ordering::Relaxed) > 0
            && s.db.load(Ordering::Relaxed) == db
            && !live.iter().any(|g| s.is(db, g.relid, g.n))
        {
            freed.push(format!(
                "freed the summary of generation {}",
                s.n.load(Ordering::Relaxed)
            ));
            free(s);
        }
    }
    let in_use = slots_in_use(area);
    // Twice the claims of the generation before; when nothing says how many (the first
    // generation of a series, one after a table never analysed, or after a summary too full
    // to count its keys), as many as an even share of the memory among at least eight
    // filters holds (4 MB of the default 32 MB: 2 million claims at 16 bits, and adopted up
    // to some 5 million): folded at the seal to what its claims take. Among eight, not the
    // four of `sizing`, so that the series `use_generations()` opens at once (up to four)
    // leave half the memory to the generations sealed meanwhile, dedup.processed first.
    // (Sized for the least instead, the first generation of a run flat out took millions
    // of claims into 128 kB and was read at its seal, and so was the next, sized by it.)
    // Not known but at least some (a summary too full to count), twice that if more: a
    // generation past what the share holds, read at each seal, would otherwise open the
    // next at the share again, and be read again.
    let keys = match expected {
        Expected::Keys(e) => e.saturating_mul(2),
        Expected::NotKnown { at_least } => {
            let share = area.blocks / (in_use + 1).max(2 * SHARED_BY_AT_LEAST);
            (share * BLOCK_BYTES as u64 * 8 / BITS_PER_KEY).max(at_least.saturating_mul(2))
        }
    }
    .max(COLLECT_AT_LEAST);
    let (want, _) = sizing(keys, area.blocks, in_use, 1, free_blocks(area));
    let mut want = foldable(want);
    let Some(slot) = area
        .slots
        .iter()
        .find(|s| s.blocks.load(Ordering::Relaxed) == 0)
    else {
        return (
            freed,
            format!(
                "did not open a summary of generation {n} to fill as claims go in: all \
                 {SLOTS} summaries are in use (its seal reads it)"
            ),
        );
    };
    if gap(area, want).is_none() && free_blocks(area) >= want {
        compact(area, want);
    }
    // Short of room for its share (the summaries of the generations still read, one of them
    // maybe due for retirement at the next pass, hold it), the largest gap there is, down to
    // 8 bits a claim of the generation before: adopted at the seal if its claims have at
    // least 6 bits each and half of what a read would give (`adopt`).
    if gap_at_top(area, want).is_none() {
        let least = blocks_for(keys / 2, BITS_PER_KEY / 2);
        let widest = largest_gap(area);
        if widest >= least.max(2) {
            want = foldable(widest);
        }
    }
    let Some(offset) = gap_at_top(area, want) else {
        return (
            freed,
            format!(
                "did not open a summary of generation {n} to fill as claims go in: \
                 dedup.generation_memory has no room for {} kB more (its seal reads it)",
                (want * BLOCK_BYTES as u64).div_ceil(1024)
            ),
        );
    };
    let before = slot.seq.fetch_add(1, Ordering::Relaxed);
    // As in free(): the odd number before any bit.
    fence(Ordering::Release);
    for b in offset..offset + want {
        for w in area.block(b) {
            w.store(0, Ordering::Relaxed);
        }
    }
    slot.db.store(db, Ordering::Relaxed);
    slot.relid.store(u32::from(relid), Ordering::Relaxed);
    slot.n.store(n as u32, Ordering::Relaxed);
    slot.offset.store(offset, Ordering::Relaxed);
    slot.blocks.store(want, Ordering::Relaxed);
    slot.keys.store(0, Ordering::Relaxed);
    slot.leases_until.store(i64::MIN, Ordering::Relaxed);
    slot.leases.store(0, Ordering::Relaxed);
    slot.collecting.store(1, Ordering::Relaxed);
    slot.opened.store(before + 2, Ordering::Relaxed);
    slot.opener.store(u32::from(opener), Ordering::Relaxed);
    // SAFETY: reads the clock.
    slot.built_at
        .store(unsafe { pg_sys::GetCurrentTimestamp() }, Ordering::Relaxed);
    slot.seq.fetch_add(1, Ordering::Release);
    (
        freed,
        format!(
            "opened a summary of generation {n} to fill as claims go in: {} kB",
            (want * BLOCK_BYTES as u64).div_ceil(1024)
        ),
    )
}

/// The filter generation `n`, table `relid`, of this database, collects as its claims go
/// in, if it has one: where a claim that inserted a row there adds its key.
pub(crate) struct Collecting {
    slot: usize,
    offset: u64,
    blocks: u64,
}

/// [`Collecting`] for generation `n`, table `relid`: found as [`find`] finds a built one.
pub(crate) fn collecting(relid: pg_sys::Oid, n: i32) -> Option<Collecting> {
    let (slot, _, offset, blocks) = lookup(relid, n, true)?;
    Some(Collecting {
        slot,
        offset,
        blocks,
    })
}

impl Collecting {
    /// As [`Held::prefetch`], for the block [`Collecting::add`] writes for `hash`.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        prefetch_block(self.offset, self.blocks, hash);
    }

    /// Add the key of `hash` (a claim's, whose row this transaction inserted into the
    /// generation and still holds its lock on, so the seal waits for it); `lease`: the row
    /// is a lease function's. Sets bits only: where the filter was freed or moved since it
    /// was found, the bits land in blocks of another filter or none (a false positive
    /// there, never a wrong "absent"), and a filter moved is not adopted ([`adopt`]).
    #[inline]
    pub(crate) fn add(&self, hash: u64, lease: bool) {
        let Some(area) = area() else { return };
        let (block, bits) = crate::expired::place(hash, self.blocks);
        for (w, b) in area.block(self.offset + block).iter().zip(bits) {
            if w.load(Ordering::Relaxed) & b == 0 {
                w.fetch_or(b, Ordering::Relaxed);
            }
        }
        if lease {
            let flag = &area.slots[self.slot].leases;
            if flag.load(Ordering::Relaxed) == 0 {
                flag.store(1, Ordering::Relaxed);
            }
        }
        // The seal's adoption reads these after the seal wait (this transaction's end, its
        // locks released, then the worker's look at them): ordered by those locks.
        fence(Ordering::Release);
    }
}

/// The keys a filter of `blocks` blocks holds, estimated from its bits: a key sets one bit
/// of 64 in each word of its block, so with keys spread over the blocks (Poisson, mean m) a
/// bit is clear with probability exp(-m/64). None: every bit is set.
fn estimated_keys(area: &Area, offset: u64, blocks: u64) -> Option<u64> {
    let mut clear = 0u64;
    for b in offset..offset + blocks {
        for w in area.block(b) {
            clear += u64::from(w.load(Ordering::Relaxed).count_zeros());
        }
    }
    if clear == 0 {
        return None;
    }
    let fraction = clear as f64 / (blocks * BLOCK_BYTES as u64 * 8) as f64;
    Some((-64.0 * blocks as f64 * fraction.ln()).round() as u64)
}

/// Adopt the filter sealed generation `g` collected as its claims went in, as its summary,
/// folded down to what its keys take ([`BITS_PER_KEY`] each, or less when that is all a
/// filter built by a scan would get now: [`sizing`], with `waiting` generations waiting).
/// Some((line, true)): adopted; Some((line, false)): it had one, freed as unfit (moved while
/// collecting, or too full for its keys: the caller reads the table); None: it had none.
///
/// Sound because the seal waited for every transaction that could insert into `g`, each of
/// which added its key before its end when it found the filter, and the filter existed
/// before the generation was published ([`open_collecting`]): so it holds every key `g` will
/// ever hold, unless a claim set its bits where it was before a move, which moved `seq`
/// from `opened`, and such a filter is not adopted.
fn adopt(area: &Area, db: u32, g: &Gen, waiting: u64) -> Option<(String, bool)> {
    let _busy = take(area)?;
    let slot = area
        .slots
        .iter()
        .find(|s| s.is_collecting() && s.is(db, g.relid, g.n))?;
    let (offset, blocks) = (
        slot.offset.load(Ordering::Relaxed),
        slot.blocks.load(Ordering::Relaxed),
    );
    // Moved or rewritten since it was opened: no writer does that to a filter that collects
    // (a compaction leaves it, `compaction`), so a check kept for safety.
    if slot.seq.load(Ordering::Relaxed) != slot.opened.load(Ordering::Relaxed) {
        free(slot);
        return Some((
            format!(
                "the summary generation {} filled as its claims went in was moved meanwhile: \
                 reading the generation instead",
                g.n
            ),
            false,
        ));
    }
    let in_use = slots_in_use(area);
    let keys = estimated_keys(area, offset, blocks);
    // What a filter built by a scan would get now, with this one's blocks free.
    let (rebuilt, _) = keys.map_or((u64::MAX, Sized::Full), |k| {
        sizing(
            k,
            area.blocks,
            in_use - 1,
            waiting,
            free_blocks(area) + blocks,
        )
    });
    let Some(keys) = keys.filter(|&k| {
        blocks >= blocks_for(k, MIN_BITS_PER_KEY) && blocks.saturating_mul(2) >= rebuilt
    }) else {
        free(slot);
        return Some((
            format!(
                "the summary generation {} filled as its claims went in, {} kB, holds too few \
                 bits for about {} claims: reading the generation instead",
                g.n,
                (blocks * BLOCK_BYTES as u64).div_ceil(1024),
                keys.map_or("all".to_string(), |k| k.to_string())
            ),
            false,
        ));
    };
    slot.seq.fetch_add(1, Ordering::Relaxed);
    // As in free(): the odd number before any bit.
    fence(Ordering::Release);
    // Folded in halves while half is still at least what a filter built by a scan would get
    // (BITS_PER_KEY a key when the memory has room, [`sizing`]'s share when not): a key's block among `2m` blocks is `b`, among `m` it is `b / 2`
    // (`expired::block_of` maps the hash's top bits onto the blocks by multiplication), so
    // block `i` of the half is blocks `2i` and `2i + 1` OR-ed, and a key present before is
    // present after. In place, from the lowest block up: block `i` is written after blocks
    // `2i` and `2i + 1` were read, and no block at or above `2i` was written yet.
    let mut now = blocks;
    while now % 2 == 0 && now / 2 >= rebuilt {
        for i in 0..now / 2 {
            for ((dst, lo), hi) in area
                .block(offset + i)
                .iter()
                .zip(area.block(offset + 2 * i))
                .zip(area.block(offset + 2 * i + 1))
            {
                dst.store(
                    lo.load(Ordering::Relaxed) | hi.load(Ordering::Relaxed),
                    Ordering::Relaxed,
                );
            }
        }
        now /= 2;
    }
    slot.blocks.store(now, Ordering::Relaxed);
    slot.keys.store(keys, Ordering::Relaxed);
    slot.leases_until.store(
        if slot.leases.load(Ordering::Relaxed) == 1 {
            i64::MAX
        } else {
            i64::MIN
        },
        Ordering::Relaxed,
    );
    slot.collecting.store(0, Ordering::Relaxed);
    // SAFETY: reads the clock.
    slot.built_at
        .store(unsafe { pg_sys::GetCurrentTimestamp() }, Ordering::Relaxed);
    slot.seq.fetch_add(1, Ordering::Release);
    let folded = if now < blocks {
        format!(
            " (folded from {} kB)",
            (blocks * BLOCK_BYTES as u64).div_ceil(1024)
        )
    } else {
        String::new()
    };
    Some((
        format!(
            "summarised generation {} as its claims went in: about {}{folded}",
            g.n,
            claims_in(keys, now)
        ),
        true,
    ))
}

/// What the summary of a generation says of how many claims it holds.
pub(crate) enum Counted {
    /// About this many (built: counted or estimated at its adoption; collecting: estimated
    /// from its bits now).
    Keys(u64),
    /// It collects and is too full to tell (fewer than [`MIN_BITS_PER_KEY`] bits a claim by
    /// its estimate): more than it can count, at least the claims its bits hold at that
    /// rate, and more than a `reltuples` taken early in the generation may say.
    TooFull { at_least: u64 },
    /// It has none.
    NoSummary,
}

/// The claims generation `n`, table `relid`, of this database holds, as its summary (built
/// or collecting) has them. What the next generation's filter is sized by.
pub(crate) fn keys_of_summary(relid: pg_sys::Oid, n: i32) -> Counted {
    let Some(area) = area() else {
        return Counted::NoSummary;
    };
    if let Some((_, keys)) = built_with(relid, n) {
        return Counted::Keys(keys);
    }
    // Counted without the writers' flag (megabytes of bits, which other writers would
    // spin on): the offset and blocks are one state of the slot, inside the shared bits,
    // and a filter freed or moved under the count only misestimates what the next
    // generation's filter is sized by.
    let Some((_, _, offset, blocks)) = lookup(relid, n, true) else {
        return Counted::NoSummary;
    };
    match estimated_keys(area, offset, blocks) {
        Some(k) if blocks >= blocks_for(k, MIN_BITS_PER_KEY) => Counted::Keys(k),
        _ => Counted::TooFull {
            at_least: blocks * BLOCK_BYTES as u64 * 8 / MIN_BITS_PER_KEY,
        },
    }
}

/// The databases that have a filter (the launcher looks for dropped ones among them, so a
/// dropped database whose filters [`forget_databases`] could not free, its writers' flag
/// taken, is found again at the next cycle).
pub fn databases() -> Vec<pg_sys::Oid> {
    let Some(area) = area() else {
        return Vec::new();
    };
    let mut dbs: Vec<u32> = area
        .slots
        .iter()
        .filter(|s| s.blocks.load(Ordering::Relaxed) > 0)
        .map(|s| s.db.load(Ordering::Relaxed))
        .collect();
    dbs.sort_unstable();
    dbs.dedup();
    dbs.into_iter().map(pg_sys::Oid::from).collect()
}

/// Free the filters of dropped databases (the launcher); how many (0 also when the writers'
/// flag could not be taken: [`databases`] still lists them at the next cycle).
pub fn forget_databases(gone: &[pg_sys::Oid]) -> usize {
    let Some(area) = area() else { return 0 };
    let Some(_busy) = take(area) else { return 0 };
    let mut n = 0;
    for s in &area.slots {
        if s.blocks.load(Ordering::Relaxed) > 0
            && gone
                .iter()
                .any(|d| u32::from(*d) == s.db.load(Ordering::Relaxed))
        {
            free(s);
            n += 1;
        }
    }
    n
}

/// `dedup.generation_summaries()`: the sealed generations of this database, newest first,
/// and the summary of each (NULLs: it has none yet, or did not fit: a claim probes it).
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
pub(crate) fn generation_summaries() -> TableIterator<
    'static,
    (
        name!(generation, i32),
        name!(relid, pg_sys::Oid),
        name!(summarised, bool),
        name!(keys, Option<i64>),
        name!(bytes, Option<i64>),
        name!(false_positive_rate, Option<f64>),
        name!(built_at, Option<TimestampWithTimeZone>),
    ),
> {
    const F: &str = "dedup.generation_summaries";
    if area().is_none() {
        if crate::stats::available() {
            crate::error::generation_memory_off(F);
        } else {
            crate::stats::sql::warn_not_preloaded(F);
        }
    }
    // SAFETY: in a transaction, under the guard of this #[pg_extern].
    let Some(list) = (unsafe { super::load(F) }) else {
        return TableIterator::new(Vec::new());
    };
    // SAFETY: a backend global.
    let db = u32::from(unsafe { pg_sys::MyDatabaseId });
    let mut rows = Vec::new();
    for g in list.others.iter().filter(|g| g.sealed) {
        let mut row = (g.n, g.relid, false, None, None, None, None);
        for s in area().map_or(&[][..], |a| &a.slots[..]) {
            let seq = s.seq.load(Ordering::Acquire);
            if seq % 2 == 1 || s.is_collecting() || !s.is(db, g.relid, g.n) {
                continue;
            }
            let (keys, blocks) = (
                s.keys.load(Ordering::Relaxed),
                s.blocks.load(Ordering::Relaxed),
            );
            let built = s.built_at.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if s.seq.load(Ordering::Relaxed) == seq {
                row = (
                    g.n,
                    g.relid,
                    true,
                    Some(keys as i64),
                    Some((blocks * BLOCK_BYTES as u64) as i64),
                    Some(crate::expired::false_positive_rate(keys, blocks)),
                    TimestampWithTimeZone::try_from(built).ok(),
                );
                break;
            }
        }
        rows.push(row);
    }
    TableIterator::new(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_hash_is_the_same_from_its_scopes_seed_and_from_its_row() {
        // A claim hashes its keys with the scope's seed made once (hash_in); the seal's
        // read of a generation hashes each row's bytes (hash_bytes): one filter holds both.
        for (scope, job) in [
            ("default", "1234567890123456789"),
            ("", "a"),
            ("other scope", ""),
            ("a scope of more than eight bytes", "full-200000"),
        ] {
            // The hash as it was before the seed was made once a call (8431ac5).
            let secret = area().map_or(0, |a| a.secret);
            let before = crate::expired::fold(
                crate::expired::fold(secret, scope.as_bytes()),
                job.as_bytes(),
            );
            assert_eq!(
                hash_in(filter_seed(scope), job),
                before,
                "{scope:?} {job:?}"
            );
            assert_eq!(
                hash_bytes(scope.as_bytes(), job.as_bytes()),
                before,
                "{scope:?} {job:?}"
            );
        }
    }

    #[test]
    fn a_filter_is_sized_at_about_a_tenth_of_a_percent_or_at_least_nine() {
        for keys in [1_000u64, 100_000, 5_000_000] {
            let fpr = crate::expired::false_positive_rate(keys, blocks_for(keys, BITS_PER_KEY));
            assert!(fpr > 0.0005 && fpr < 0.0015, "{keys} keys: {fpr}");
            let fpr = crate::expired::false_positive_rate(keys, blocks_for(keys, MIN_BITS_PER_KEY));
            assert!(fpr > 0.08 && fpr < 0.10, "{keys} keys at the least: {fpr}");
        }
        assert_eq!(blocks_for(0, BITS_PER_KEY), 1);
    }

    #[test]
    fn a_filter_gets_an_even_share_never_less_than_the_least() {
        let (full, least) = (
            blocks_for(6000, BITS_PER_KEY),
            blocks_for(6000, MIN_BITS_PER_KEY),
        );
        assert_eq!((full, least), (188, 71));
        // Room for all it takes.
        assert_eq!(sizing(6000, 1000, 1, 1, 1000), (188, Sized::Full));
        // An even share of 400 among 4: 100, though 400 are free; among 4 when fewer share.
        assert_eq!(sizing(6000, 400, 2, 2, 400), (100, Sized::Share(4)));
        assert_eq!(sizing(6000, 400, 0, 1, 400), (100, Sized::Share(4)));
        // A share below the least: the least.
        assert_eq!(sizing(6000, 400, 6, 2, 400), (71, Sized::Least(8)));
        // Fewer free than the share: the free ones shared among those waiting, if that
        // holds the least.
        assert_eq!(sizing(6000, 400, 3, 1, 80), (80, Sized::Free(1)));
        assert_eq!(sizing(6000, 400, 2, 2, 160), (80, Sized::Free(2)));
        // Too few free for the least of each of two, and for this one's share, but enough
        // for one least: the least (the other waits).
        assert_eq!(sizing(6000, 400, 2, 2, 90), (71, Sized::LeastFree));
        // Else the share: more than is free, which place_filter then finds no room for; or
        // the first of two waiting gets it and the second waits.
        assert_eq!(sizing(6000, 400, 3, 1, 70), (100, Sized::Share(4)));
        assert_eq!(sizing(6000, 400, 2, 2, 140), (100, Sized::Share(4)));
        assert_eq!(sizing(0, 400, 0, 0, 400), (1, Sized::Full));
    }

    #[test]
    fn a_key_of_block_b_among_2m_blocks_is_in_block_b_over_2_among_m() {
        // What folding a filter in halves (adopt) relies on, for even sizes that are and are
        // not powers of two.
        let mut h = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            h = h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            for m in [1u64, 2, 3, 63, 64, 125, 2048, 1_000_003] {
                assert_eq!(
                    crate::expired::block_of(h, 2 * m) / 2,
                    crate::expired::block_of(h, m),
                    "hash {h:#x}, {m} blocks"
                );
            }
        }
    }

    #[test]
    fn compaction_joins_the_gaps_without_overwriting_a_filter_not_moved_yet() {
        // The filter at 0..59 was freed: slot 1 (59..118) moves to 0, slot 2 (130..190)
        // to 59.
        let moves = compaction(vec![(2, 130, 60, false), (1, 59, 59, false)]);
        assert_eq!(moves, vec![(1, 59, 0), (2, 130, 59)]);
        // Nothing to move when the filters are end to end from 0.
        assert_eq!(
            compaction(vec![(0, 0, 10, false), (5, 10, 3, false)]),
            vec![]
        );
        // Each move's destination ends at or below the next one's source.
        let moves = compaction(vec![
            (0, 5, 10, false),
            (1, 20, 10, false),
            (2, 40, 1, false),
        ]);
        assert_eq!(moves, vec![(0, 5, 0), (1, 20, 10), (2, 40, 20)]);
        // A filter still collecting stays: those below it move down under it, those above
        // it down to its end.
        let moves = compaction(vec![
            (0, 5, 10, false),
            (1, 30, 10, true),
            (2, 45, 5, false),
        ]);
        assert_eq!(moves, vec![(0, 5, 0), (2, 45, 40)]);
    }

    #[test]
    fn a_filter_that_collects_folds_to_within_twice_what_its_claims_take() {
        for blocks in [2u64, 15, 16, 17, 1000, 2048, 87_390, 131_072, 1_000_003] {
            let f = foldable(blocks);
            assert!(f <= blocks && f * 8 > blocks * 7, "{blocks} -> {f}");
            // Halved as adopt halves it, for every size its claims could take.
            for need in 1..=f {
                let mut now = f;
                while now.is_multiple_of(2) && now / 2 >= need {
                    now /= 2;
                }
                assert!(
                    now >= need && (now < 2 * need || now < 16),
                    "{blocks} blocks ({f}), {need} needed: folded to {now}"
                );
            }
        }
    }

    #[test]
    fn a_filter_that_collects_goes_to_the_highest_gap_that_fits() {
        // Without shared memory there is no Area: the gap search is tested on one made
        // here, 100 blocks with filters at 10..20 and 50..60.
        let area = Area {
            secret: 0,
            blocks: 100,
            busy: AtomicU32::new(0),
            slots: std::array::from_fn(|_| Slot::default()),
        };
        for (i, (offset, blocks)) in [(10u64, 10u64), (50, 10)].into_iter().enumerate() {
            area.slots[i].offset.store(offset, Ordering::Relaxed);
            area.slots[i].blocks.store(blocks, Ordering::Relaxed);
        }
        assert_eq!(gap_at_top(&area, 40), Some(60));
        assert_eq!(gap_at_top(&area, 30), Some(70));
        assert_eq!(gap_at_top(&area, 41), None);
        assert_eq!(gap(&area, 30), Some(20));
        assert_eq!(gap_at_top(&area, 10), Some(90));
        assert_eq!(largest_gap(&area), 40);
    }
}
