//! Claims in rotating generations (issue 26, slices 1 and 2; docs/design/generations.md).
//!
//! A database that ran `dedup.use_generations()` keeps its claims in several tables, the
//! generations, listed in `dedup.generations`: `dedup.processed` (n = 0) and the tables
//! `dedup.processed_<n>` the worker creates (`rotate.rs`), in a series per retention in
//! force. A claim inserts into the `current` one of its scope's series and checks the
//! others for the same key (`claim.rs`, the design's claim protocol); the worker publishes
//! a new generation of each series every quarter of its retention, waits for the claimers
//! of the old one, seals it, and drops it once its claims are past their retention.
//!
//! Which generations exist is read here, with a snapshot of its own, once per value of the
//! database's epoch (`epoch.rs`), which every change of the list moves.
use crate::error;
use pgrx::pg_sys;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) mod epoch;
pub(crate) mod rotate;
pub(crate) mod summary;

/// A generation's state in `dedup.generations`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum State {
    /// Claims go there.
    Current,
    /// Published away from; claimers that were in flight may still insert there.
    Sealing,
    /// No insert ever again.
    Sealed,
    /// No claim reads it; waiting to be dropped (or, for n = 0, truncated).
    Retired,
}

impl State {
    fn parse(s: &str) -> Option<State> {
        Some(match s {
            "current" => State::Current,
            "sealing" => State::Sealing,
            "sealed" => State::Sealed,
            "retired" => State::Retired,
            _ => return None,
        })
    }
}

/// One generation a claim uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Generation {
    pub(crate) n: i32,
    pub(crate) relid: pg_sys::Oid,
    /// Sealed (not sealing, not current) as of the list's epoch: its seal wait is over, so
    /// no claim inserts into it again, and what a look-up finds there can only go away (a
    /// prune of generation 0), never appear.
    pub(crate) sealed: bool,
}

/// The generations a claim uses: the current one of each series (one per retention in
/// force, `rotate.rs`), and the others still read (sealing and sealed), newest first. A
/// retired generation is not in it. A claim inserts into the current generation of its
/// scope's series ([`List::current_for`]) and looks in the sealing and sealed ones
/// ([`List::others`]), not in another series' current generation: the routes are
/// published with the list (`dedup.generations.routes`), and a scope leaves a series only
/// with a publication away from that series' current generation (`rotate.rs`), so a
/// current generation holds claims only of scopes routed to it since it became current.
/// For one key, a scope's move from one series to another is then a publication as the
/// one-series protocol has it (the model's `EPOCH` configuration): the generation it left
/// is sealing, the one it goes to has none of its claims.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct List {
    /// The current generation of each series, newest first.
    pub(crate) currents: Vec<Generation>,
    pub(crate) others: Vec<Generation>,
    /// The scopes named in the routes of a current generation other than `default`'s, as
    /// published with the list: the index into `currents`.
    routes: std::collections::HashMap<String, usize>,
    /// The index into `currents` of the generation whose routes have a NULL element (the
    /// series of `dedup.retention`): every scope not in `routes` goes there.
    default: usize,
}

impl List {
    /// The index into `currents` of the generation a claim of `scope` inserts into, as the
    /// routes published with the list have it.
    pub(crate) fn current_for(&self, scope: &str) -> usize {
        self.routes.get(scope).copied().unwrap_or(self.default)
    }

    /// The current generation of index `i` (see [`List::current_for`]).
    pub(crate) fn current(&self, i: usize) -> Generation {
        self.currents[i]
    }

    /// Every generation a claim looks in besides the current one it inserts into: the
    /// sealing and sealed ones, newest first (not another series' current generation: see
    /// [`List`]).
    pub(crate) fn others(&self) -> impl Iterator<Item = &Generation> {
        self.others.iter()
    }
}

/// This backend's copy of the list: the database, the epoch it was read at, and the list
/// (None: the database does not use generations).
struct Cache {
    db: pg_sys::Oid,
    epoch: u64,
    list: Option<Rc<List>>,
}

static mut CACHE: Option<Cache> = None;

/// The epoch of this database as read now (None without shared memory: the library is not
/// preloaded) and its generations as of that epoch (None: the database does not use
/// generations, the common case: one atomic load and a comparison per claim once this
/// backend has read the catalog). A claim that goes on with the list reads the epoch again
/// after its locks and after its insert, and starts over if it moved, also when there is no
/// list: a claim into dedup.processed alone that began before `use_generations()`
/// committed must not confirm without checking generation 1.
///
/// # Safety
///
/// In a transaction, on the backend's main thread, under pgrx's guard (the catalog read
/// raises ERRORs as panics).
pub(crate) unsafe fn list(func: &str) -> (Option<u64>, Option<Rc<List>>) {
    // Replay changes dedup.generations without moving this server's epoch (the publishing
    // transaction's callbacks ran on the primary), so a list read during recovery is never
    // cached: a session that read one on a hot standby (claim_result does) would otherwise
    // claim with it after a promotion, and miss the generations published since. Looked at
    // before the epoch and the catalog: once recovery has ended, every publication after
    // the catalog read moves this server's epoch.
    let in_recovery = pg_sys::RecoveryInProgress();
    let shared = epoch::available();
    let now = if shared { epoch::read_even() } else { 0 };
    let epoch = shared.then_some(now);
    let db = pg_sys::MyDatabaseId;
    // SAFETY: CACHE is backend-local and only touched on the main thread, through this raw
    // pointer, with no reference kept across a call.
    let cache = std::ptr::addr_of_mut!(CACHE);
    if let Some(c) = (*cache).as_ref() {
        if c.db == db && c.epoch == now && !epoch::publishing_now() {
            return (epoch, c.list.clone());
        }
    }
    let loaded = load(func).map(Rc::new);
    if loaded.is_some() && !shared {
        // The epoch is what tells this backend that the list changed: without it a claim
        // could miss a new generation. (use_generations refuses without preloading, so this
        // is a server whose shared_preload_libraries lost dedup since.)
        error::generations_need_preload(func);
    }
    // A list read inside the transaction that is changing it is not cached: if that
    // transaction rolls back, the epoch does not move. Nor one read during recovery (above).
    let keep = !epoch::publishing_now() && !in_recovery;
    *cache = Some(Cache {
        db,
        epoch: if keep { now } else { u64::MAX },
        list: loaded.clone(),
    });
    (epoch, loaded)
}

/// The tables of this database's generations (`dedup.processed_<n>`, and `dedup.processed`
/// for generation 0 while it is not retired), each opened and checked to be the table its
/// row names ([`open`]): first the current one of `scope`'s series with `current_mode`,
/// then the others as a claim looks in them ([`List::others`]) with AccessShareLock;
/// the lock is kept to the end of the transaction, so none is dropped under a read that
/// follows. A generation dropped since the list was read is left out: it
/// had been retired, its claims expired. None: the database does not use generations.
///
/// # Safety
///
/// As for [`list`].
pub(crate) unsafe fn tables(
    func: &str,
    scope: &str,
    current_mode: pg_sys::LOCKMODE,
) -> Option<Vec<String>> {
    let (_, list) = list(func);
    let list = list?;
    let mut tables = Vec::new();
    let modes =
        std::iter::once(current_mode).chain(std::iter::repeat(pg_sys::AccessShareLock as _));
    let i = list.current_for(scope);
    let current = list.current(i);
    for (g, mode) in std::iter::once(&current).chain(list.others()).zip(modes) {
        // SAFETY: the contract of this function; the relation is closed at once, its lock
        // kept (NoLock) to the end of the transaction.
        if let Some(rel) = open(*g, mode, func) {
            pg_sys::table_close(rel, pg_sys::NoLock as _);
            tables.push(format!("dedup.{}", relname_of(g.n)));
        }
    }
    Some(tables)
}

/// The table name of generation `n` in the schema dedup: `processed` for generation 0,
/// `processed_<n>` for the others.
pub(crate) fn relname_of(n: i32) -> String {
    if n == 0 {
        "processed".to_string()
    } else {
        format!("processed_{n}")
    }
}

/// Forget this backend's copy (a reload at the next claim).
pub(crate) fn forget() {
    // SAFETY: as in list().
    unsafe {
        *std::ptr::addr_of_mut!(CACHE) = None;
    }
}

/// Whether this database uses generations.
///
/// # Safety
///
/// As for [`list`].
pub(crate) unsafe fn in_use(func: &str) -> bool {
    list(func).1.is_some()
}

/// The tables a lease function (`dedup.lease`, `complete`, `extend_lease`,
/// `release_lease`) looks for its job of `scope` in ([`tables`]), each locked to the end of
/// the transaction (the first as a claim locks it, in `ROW EXCLUSIVE` mode; the others in
/// share mode), with the list current after the locks (so the first is the generation
/// claims of the scope go to, and a seal of it waits for this transaction); None in a
/// database that does not use generations, where the function uses `dedup.processed`.
///
/// Where generations are not used, `use_generations()` is held off until this transaction
/// ends, and the list looked at again: a `use_generations()` that committed after the first
/// look (the lock waited for it) would otherwise let a lease insert into `dedup.processed`
/// with its `INSERT ... ON CONFLICT` after generation 1 took claims, and a copy claimed
/// there in the meantime would not be seen: one job granted twice.
///
/// # Safety
///
/// As for [`list`].
pub(crate) unsafe fn lease_tables(func: &str, scope: &str) -> Option<Vec<String>> {
    // Not in the transaction that changes dedup.generations (see claim::insert_claims_from).
    if epoch::publishing_now() {
        error::claim_while_publishing(func);
    }
    if !in_use(func) {
        epoch::hold_off_publishing();
        // The epoch moved if a publication committed since the first look: the list is
        // read again (with a snapshot taken now) only then.
        if !in_use(func) {
            return None;
        }
    }
    loop {
        let (epoch, _) = list(func);
        // The generation claims go to is locked as a claim locks it, RowExclusiveLock: the
        // seal lists the transactions that hold a lock of that strength or stronger on it
        // (share locks, as the others get, do not make it wait). The list is the one just
        // read (the cache, unless the epoch moved, which the check below sees).
        let tables = tables(func, scope, pg_sys::RowExclusiveLock as _)?;
        // Locked, then the epoch read again: unchanged, so no publication committed before
        // the locks, and a later one's seal waits for this transaction (the claim path's
        // rule). A lease written in place in the first table is in the generation claims go
        // to, or in one whose seal time comes after this transaction.
        if epoch.is_some_and(|e| epoch::read_even() == e) {
            return Some(tables);
        }
        forget();
        pg_sys::check_for_interrupts!();
    }
}

/// Does this transaction hold a lock on `relid` in `mode` or a stronger one (AccessShareLock:
/// in any mode)?
pub(crate) fn locked_by_me(relid: pg_sys::Oid, mode: u32) -> bool {
    // SAFETY: CheckRelationOidLockedByMe looks in this backend's local lock table only; the
    // same signature from 15 to 18; no ERROR.
    unsafe { pg_sys::CheckRelationOidLockedByMe(relid, mode as pg_sys::LOCKMODE, true) }
}

/// The OID of `dedup.generations` (InvalidOid: no such table, the extension's SQL is older
/// than 0.7.0).
///
/// # Safety
///
/// In a transaction (syscache lookups), under pgrx's guard.
unsafe fn catalog_relid() -> pg_sys::Oid {
    extension_relid(c"generations")
}

/// The OID of the table `dedup.<name>` if it is the extension's own (InvalidOid
/// otherwise: missing, or made by someone in a schema dedup that is not the extension's).
///
/// # Safety
///
/// In a transaction (syscache lookups), under pgrx's guard.
pub(crate) unsafe fn extension_relid(name: &std::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: the names are NUL-terminated strings the lookups only read;
    // get_namespace_oid with missing_ok returns InvalidOid for a missing schema.
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    if nsp == pg_sys::InvalidOid {
        return pg_sys::InvalidOid;
    }
    let relid = pg_sys::get_relname_relid(name.as_ptr(), nsp);
    if relid == pg_sys::InvalidOid {
        return relid;
    }
    // Only the extension's own table counts: one of that name someone made in a schema
    // dedup that is not the extension's would otherwise route claims.
    let ext = pg_sys::get_extension_oid(c"dedup".as_ptr(), true);
    if ext == pg_sys::InvalidOid
        || pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, relid) != ext
    {
        return pg_sys::InvalidOid;
    }
    relid
}

/// Read `dedup.generations` with a snapshot taken now (not the transaction's: a REPEATABLE
/// READ claimer must see a generation published after its snapshot), with a sequential
/// scan (the table has a handful of rows), no SPI.
///
/// # Safety
///
/// As for [`list`].
unsafe fn load(func: &str) -> Option<List> {
    let relid = catalog_relid();
    if relid == pg_sys::InvalidOid {
        return None;
    }
    // SAFETY: table_open takes AccessShareLock and returns an open relation (it raises an
    // ERROR through the guard if it went away); the snapshot is registered until the
    // UnregisterSnapshot below (or the abort's resource owner cleanup); the scan and the
    // slot live until table_endscan and ExecDropSingleTupleTableSlot, all before
    // table_close. slot_getattr deforms the slot's current tuple, which stays pinned while
    // it is read; text and name datums are copied into Rust values before the next fetch.
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
    if (*(*rel).rd_att).natts < 11 {
        pgrx::error!("dedup: the table dedup.generations does not have its columns");
    }
    // n, relid, state, the series' span, the routes (read for a current generation).
    type Row = (
        i32,
        pg_sys::Oid,
        State,
        Option<i128>,
        Option<Vec<Option<String>>>,
    );
    let mut rows: Vec<Row> = Vec::new();
    scan_rows(rel, |slot| {
        let mut isnull = false;
        let n = pg_sys::slot_getattr(slot, 1, &mut isnull).value() as i32;
        // relid is a regclass: its datum is the OID.
        let relid = pg_sys::Oid::from(pg_sys::slot_getattr(slot, 3, &mut isnull).value() as u32);
        let state = pg_sys::slot_getattr(slot, 4, &mut isnull);
        let state = <&str as pgrx::FromDatum>::from_datum(state, isnull)
            .and_then(State::parse)
            .unwrap_or_else(|| {
                pgrx::error!("dedup: a row of dedup.generations has no valid state")
            });
        let retention = pg_sys::slot_getattr(slot, 9, &mut isnull);
        let span = <pgrx::datum::Interval as pgrx::FromDatum>::from_datum(retention, isnull)
            .map(|i| i.as_micros());
        // Only a current generation's routes are read (copied into Rust values here).
        let routes = if state == State::Current {
            let routes = pg_sys::slot_getattr(slot, 11, &mut isnull);
            <Vec<Option<String>> as pgrx::FromDatum>::from_datum(routes, isnull)
        } else {
            None
        };
        rows.push((n, relid, state, span, routes));
    });
    pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
    if rows.is_empty() {
        return None;
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut currents: Vec<Generation> = Vec::new();
    // Each current generation's series: its retention as a span in µs (None for generation
    // 0, current only inside `use_generations()`).
    let mut series: Vec<Option<i128>> = Vec::new();
    let mut others = Vec::new();
    let mut routes = std::collections::HashMap::new();
    let mut default = None;
    for (n, relid, state, span, names) in rows {
        let g = Generation {
            n,
            relid,
            sealed: state == State::Sealed,
        };
        match state {
            State::Current if series.contains(&span) => {
                pgrx::error!("dedup: dedup.generations has two current generations of one series")
            }
            State::Current => {
                let i = currents.len();
                for name in names.into_iter().flatten() {
                    match name {
                        None if default.is_some() => pgrx::error!(
                            "dedup: two current generations of dedup.generations take every scope"
                        ),
                        None => default = Some(i),
                        Some(scope) => {
                            if routes.insert(scope, i).is_some() {
                                pgrx::error!(
                                    "dedup: two current generations of dedup.generations take one scope"
                                )
                            }
                        }
                    }
                }
                currents.push(g);
                series.push(span);
            }
            State::Sealing | State::Sealed => others.push(g),
            State::Retired => {}
        }
    }
    if currents.is_empty() {
        pgrx::error!("{func}: dedup.generations has no current generation");
    }
    // Generation 0 is current only inside use_generations(), which claims nothing.
    let default = match default {
        Some(i) => i,
        None if currents.len() == 1 => 0,
        None => pgrx::error!(
            "{func}: no current generation of dedup.generations takes every scope (its routes)"
        ),
    };
    // A scope named by the generation that takes every scope goes there anyway.
    routes.retain(|_, i| *i != default);
    Some(List {
        currents,
        others,
        routes,
        default,
    })
}

/// Call `each` with a slot holding each row of `rel` that a snapshot taken now sees (not the
/// transaction's: a REPEATABLE READ caller must see what committed since), with a sequential
/// scan and no SPI; interrupts are checked every 4096 rows.
///
/// # Safety
///
/// `rel` is open and locked; in a transaction, under pgrx's guard. The snapshot is
/// registered until the UnregisterSnapshot below (or the abort's resource owner cleanup);
/// the scan and the slot live until their ends below. `each` reads the slot's current tuple,
/// which stays pinned while it runs, and must copy what it keeps (a text datum points into
/// the buffer) before it returns.
pub(crate) unsafe fn scan_rows(
    rel: pg_sys::Relation,
    mut each: impl FnMut(*mut pg_sys::TupleTableSlot),
) {
    scan_rows_while(rel, |slot| {
        each(slot);
        true
    });
}

/// [`scan_rows`] until `each` returns false.
///
/// # Safety
///
/// As for [`scan_rows`].
pub(crate) unsafe fn scan_rows_while(
    rel: pg_sys::Relation,
    mut each: impl FnMut(*mut pg_sys::TupleTableSlot) -> bool,
) {
    let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
    let scan = pg_sys::table_beginscan(rel, snapshot, 0, std::ptr::null_mut());
    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    let mut rows = 0u64;
    while pg_sys::table_scan_getnextslot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
        if !each(slot) {
            break;
        }
        rows += 1;
        if rows.is_multiple_of(4096) {
            pg_sys::check_for_interrupts!();
        }
    }
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::table_endscan(scan);
    pg_sys::UnregisterSnapshot(snapshot);
}

/// What a look for one key in a generation other than the claimer's found (the design's
/// table "Who gives way").
#[derive(Clone, Copy, Debug)]
pub(crate) enum Found {
    /// No row of the key, or only rows that are dead or killed.
    Clear,
    /// A row committed (or inserted by this transaction), not being deleted.
    Committed(pg_sys::ItemPointerData),
    /// A row still speculative: its inserter holds this token.
    Speculative(pg_sys::TransactionId, u32),
    /// A confirmed row of a transaction in progress.
    InProgress(pg_sys::TransactionId, pg_sys::ItemPointerData),
    /// A committed row that a transaction in progress is deleting (today's pruner on
    /// dedup.processed).
    Deleting(pg_sys::TransactionId, pg_sys::ItemPointerData),
}

/// A generation other than the claim's, open for the claim's look-ups: the table and its
/// primary key with AccessShareLock, a slot for its rows, the table's layout as
/// `check_layout` found it when it was opened, whether it was sealed (see
/// [`Generation::sealed`]), and its summary if it has one (`summary.rs`).
pub(crate) struct Other {
    pub(crate) heap: pg_sys::Relation,
    pub(crate) index: pg_sys::Relation,
    pub(crate) slot: *mut pg_sys::TupleTableSlot,
    pub(crate) layout: crate::claim::Layout,
    pub(crate) sealed: bool,
    pub(crate) summary: Option<summary::Held>,
}

/// Index probes of sealed generations this backend made since [`take_probes`] last ran:
/// for want of a summary, and those a summary's "maybe" asked for that found no row of the
/// job. Backend-local (each backend is a process of its own). `claim::insert_claims` takes
/// (and drops) what is left from a call that failed before it begins, and each caller takes
/// its own right after it, for `stats::count_probes`.
static UNSUMMARISED: AtomicU64 = AtomicU64::new(0);
static FALSE_POSITIVES: AtomicU64 = AtomicU64::new(0);

/// The probes [`probe`] counted since the last take (the columns `unsummarised_probes` and
/// `summary_false_positives` of `dedup.stats`).
#[derive(Clone, Copy, Default)]
pub(crate) struct Probes {
    pub(crate) unsummarised: u64,
    pub(crate) false_positives: u64,
}

/// Take (and zero) the probes counted since the last take.
pub(crate) fn take_probes() -> Probes {
    Probes {
        unsummarised: UNSUMMARISED.swap(0, Ordering::Relaxed),
        false_positives: FALSE_POSITIVES.swap(0, Ordering::Relaxed),
    }
}

/// Look for (job_id, scope) in `other` with a dirty snapshot, which sees rows of
/// transactions in progress and whether a row is still speculative, as PostgreSQL's own
/// unique check does (check_exclusion_or_unique_constraint in execIndexing.c, whose loop is
/// static there). Takes no lock and waits for nothing: the caller decides.
///
/// # Safety
///
/// `other` is open (see [`Other`]), `job_id` and `scope` are text datums valid for the call;
/// in a transaction, under pgrx's guard (the index scan reads buffers: I/O ERRORs).
pub(crate) unsafe fn probe(other: &Other, job_id: pg_sys::Datum, scope: pg_sys::Datum) -> Found {
    // SAFETY: a zeroed SnapshotData with snapshot_type SNAPSHOT_DIRTY is what
    // InitDirtySnapshot (a macro, no binding) makes; it lives on this stack frame until
    // index_endscan below, and the heap fetches write its xmin, xmax and speculativeToken.
    // ScanKeyInit fills the two keys (the primary key is (job_id, scope), both text with
    // collation "C": the index's own collations are set after it); index_rescan copies
    // them. ItemPointer and slot reads are of the slot the scan filled.
    let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
    dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
    let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
    let collations = (*other.index).rd_indcollation;
    for (i, value) in [job_id, scope].into_iter().enumerate() {
        pg_sys::ScanKeyInit(
            &mut keys[i],
            (i + 1) as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            value,
        );
        keys[i].sk_collation = *collations.add(i);
    }
    let scan = crate::compat::index_beginscan(other.heap, other.index, &mut dirty, 2);
    pg_sys::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
    let mut found = Found::Clear;
    if pg_sys::index_getnext_slot(
        scan,
        pg_sys::ScanDirection::ForwardScanDirection,
        other.slot,
    ) {
        let tid = (*other.slot).tts_tid;
        found = if dirty.xmin != pg_sys::InvalidTransactionId {
            if dirty.speculativeToken != 0 {
                Found::Speculative(dirty.xmin, dirty.speculativeToken)
            } else {
                Found::InProgress(dirty.xmin, tid)
            }
        } else if dirty.xmax != pg_sys::InvalidTransactionId {
            Found::Deleting(dirty.xmax, tid)
        } else {
            Found::Committed(tid)
        };
    }
    pg_sys::index_endscan(scan);
    pg_sys::ExecClearTuple(other.slot);
    // A sealed generation is probed for want of a summary, or where its summary said
    // "maybe" (a claim looks only then): finding nothing there, the "maybe" was wrong, or
    // the summary could no longer answer (moved or freed since the claim found it).
    if other.sealed {
        match (&other.summary, &found) {
            (None, _) => {
                UNSUMMARISED.fetch_add(1, Ordering::Relaxed);
            }
            (Some(_), Found::Clear) => {
                FALSE_POSITIVES.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
    found
}

/// Wait for what `found` says is in flight, holding no token: a speculative inserter's
/// token, or the end of the transaction inserting or deleting the row.
///
/// # Safety
///
/// In a transaction, under pgrx's guard (lock waits: deadlock, lock_timeout, cancel);
/// `other` is the generation the row was found in.
pub(crate) unsafe fn wait_for(other: &Other, found: Found) {
    // SAFETY: the contract above; the TIDs are copies the waits only report in messages.
    match found {
        Found::Speculative(xid, token) => pg_sys::SpeculativeInsertionWait(xid, token),
        Found::InProgress(xid, mut tid) | Found::Deleting(xid, mut tid) => {
            pg_sys::XactLockTableWait(
                xid,
                other.heap,
                &mut tid,
                pg_sys::XLTW_Oper::XLTW_InsertIndexUnique,
            )
        }
        Found::Clear | Found::Committed(_) => {}
    }
}

/// Open generation `g` for a claim with `mode` (RowExclusiveLock for the current one,
/// AccessShareLock for the others), checked to be the table the catalog names: in the
/// schema dedup, called `processed` (n = 0) or `processed_<n>`. None: the table is gone,
/// so the list is out of date (a drop follows a retirement, which moves the epoch).
///
/// # Safety
///
/// In a transaction, under pgrx's guard; the relation returned is open until the caller
/// closes it (the lock kept to the end of the transaction).
pub(crate) unsafe fn open(
    g: Generation,
    mode: pg_sys::LOCKMODE,
    func: &str,
) -> Option<pg_sys::Relation> {
    // SAFETY: try_table_open returns NULL holding no lock when relid names nothing; rd_rel
    // is read at once (see claim::open_processed).
    let rel = pg_sys::try_table_open(g.relid, mode);
    if rel.is_null() {
        return None;
    }
    let form = (*rel).rd_rel;
    let name = std::ffi::CStr::from_ptr((*form).relname.data.as_ptr());
    let expected = relname_of(g.n);
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    if (*form).relnamespace != nsp || name.to_bytes() != expected.as_bytes() {
        pg_sys::table_close(rel, mode);
        pgrx::error!(
            "{func}: generation {} of dedup.generations is not the table dedup.{expected}",
            g.n
        );
    }
    Some(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current(n: i32) -> Generation {
        Generation {
            n,
            relid: pg_sys::Oid::from(16384 + n as u32),
            sealed: false,
        }
    }

    #[test]
    fn a_claim_goes_by_the_published_routes_and_looks_in_no_other_current_generation() {
        let sealed = Generation {
            n: 2,
            relid: pg_sys::Oid::from(16386),
            sealed: true,
        };
        let list = List {
            currents: vec![current(4), current(3)],
            others: vec![sealed],
            routes: std::collections::HashMap::from([("short".to_string(), 1)]),
            default: 0,
        };
        assert_eq!(list.current(list.current_for("short")).n, 3);
        assert_eq!(list.current(list.current_for("any")).n, 4);
        assert_eq!(list.others().map(|g| g.n).collect::<Vec<_>>(), vec![2]);
    }
}
