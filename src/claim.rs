//! The claim path: `dedup.try_claim(job_id, scope)`.
use crate::{citus, compat, error, guc, stats};
use pgrx::pg_sys;
use pgrx::prelude::*;

const FUNC: &str = "dedup.try_claim";

/// The columns of `dedup.processed`, in order: scope, job_id, processed_at (0.1.0), and
/// fingerprint, result, lease_id, lease_expires_at (0.3.0).
pub(crate) const COLUMNS: [pg_sys::Oid; 7] = [
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::TEXTOID,
    pg_sys::JSONBOID,
    pg_sys::UUIDOID,
    pg_sys::TIMESTAMPTZOID,
];
/// Attribute numbers (1-based) of the columns read by number.
pub(crate) const SCOPE: i32 = 1;
pub(crate) const PROCESSED_AT: i32 = 3;
pub(crate) const FINGERPRINT: i32 = 4;
pub(crate) const LEASE_EXPIRES_AT: i32 = 7;

/// The claim table as an installed version of the extension left it. The library works
/// with every version's table, so claims go on between installing a new library and
/// `ALTER EXTENSION dedup UPDATE`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Layout {
    /// 0.1.0 and 0.2.0: scope, job_id, processed_at.
    Claims,
    /// 0.3.0 on: also fingerprint, result, lease_id, lease_expires_at.
    Leases,
}

impl Layout {
    pub(crate) fn columns(self) -> usize {
        match self {
            Layout::Claims => 3,
            Layout::Leases => COLUMNS.len(),
        }
    }
}

/// Claim `job_id` in `scope` for the current transaction.
///
/// `true`: this transaction now holds the claim (permanent at COMMIT, gone at ROLLBACK).
/// `false`: a committed claim exists. A claim held by a concurrent transaction makes the call
/// wait for that transaction's end.
#[pg_extern(name = "try_claim", volatile, parallel_unsafe)]
fn try_claim_text(job_id: Option<&str>, scope: default!(Option<&str>, "'default'")) -> bool {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    claim(job_id, scope, None) == Outcome::Claimed
}

/// The same job as its decimal text form: `try_claim(42)` and `try_claim('42')` are one job.
#[pg_extern(name = "try_claim", volatile, parallel_unsafe)]
fn try_claim_bigint(job_id: Option<i64>, scope: default!(Option<&str>, "'default'")) -> bool {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    claim(&job_id.to_string(), scope, None) == Outcome::Claimed
}

/// The same job as the uuid's canonical text form (lowercase, hyphenated).
#[pg_extern(name = "try_claim", volatile, parallel_unsafe)]
fn try_claim_uuid(job_id: Option<pgrx::Uuid>, scope: default!(Option<&str>, "'default'")) -> bool {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    claim(&job_id.to_string(), scope, None) == Outcome::Claimed
}

pub(crate) fn check_key<'a>(scope: Option<&'a str>, job_id: &str) -> &'a str {
    let scope = scope.unwrap_or_else(|| error::null_argument(FUNC, "scope"));
    error::check_length(FUNC, || "job_id", job_id, error::MAX_JOB_ID_BYTES);
    check_scope(FUNC, scope);
    scope
}

/// A scope is 1 to [`error::MAX_SCOPE_BYTES`] bytes.
pub(crate) fn check_scope(func: &str, scope: &str) {
    error::check_length(func, || "scope", scope, error::MAX_SCOPE_BYTES);
}

pub(crate) fn check_transaction(func: &str) {
    check_writable(func);
    // SAFETY: unguarded::IsTransactionBlock only reads CurrentTransactionState->blockState
    // and never raises an ERROR, so it needs no pgrx guard; it runs on the backend's main
    // thread, inside a transaction, from a #[pg_extern] try_claim function. The WARNING is
    // emitted by safe Rust (error::warn_outside_transaction).
    unsafe {
        if !unguarded::IsTransactionBlock() && guc::WARN_OUTSIDE_TRANSACTION.get() {
            error::warn_outside_transaction(func);
        }
    }
}

/// Refuse to write on a standby, in a read-only transaction or in parallel mode.
pub(crate) fn check_writable(func: &str) {
    // SAFETY: RecoveryInProgress goes through pgrx's guarded binding (it reads the shared
    // XLogCtl recovery state and raises no ERROR); XactReadOnly is a plain read of a
    // backend-global bool; unguarded::IsInParallelMode only reads
    // CurrentTransactionState->parallelModeLevel and never raises an ERROR. Callers are
    // #[pg_extern] functions (try_claim's, dedup._check_claim) on the backend's main thread,
    // so the Rust panics that error::* raise are turned into ERRORs by their pgrx wrappers.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            error::on_standby(func);
        }
        if pg_sys::XactReadOnly {
            error::read_only(func);
        }
        if unguarded::IsInParallelMode() {
            error::parallel_mode(func);
        }
    }
}

/// `dedup._try_claim_fp(job_id, scope, fingerprint)`: the claim behind
/// `dedup.try_claim(job_id, scope, fingerprint)`; NULL when the job was claimed with another
/// fingerprint (the SQL wrapper raises the dedicated error, SQLSTATE YD001).
#[pg_extern(name = "_try_claim_fp", volatile, parallel_unsafe)]
pub(crate) fn try_claim_fingerprint(
    job_id: Option<&str>,
    scope: Option<&str>,
    fingerprint: Option<&str>,
) -> Option<bool> {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    if let Some(fp) = fingerprint {
        check_fingerprint(FUNC, fp);
    }
    match claim(job_id, scope, fingerprint) {
        Outcome::Claimed => Some(true),
        Outcome::Duplicate { .. } | Outcome::Busy { .. } => Some(false),
        Outcome::FingerprintMismatch => None,
    }
}

/// What a claim found.
#[derive(PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    /// This transaction now holds the claim.
    Claimed,
    /// A claim exists (committed before this call looked, or taken earlier by this
    /// transaction), made at `claimed_at` (its processed_at, microseconds since 2000).
    Duplicate { claimed_at: i64 },
    /// A claim exists that a concurrent transaction committed while this call waited for
    /// it (or after the call's snapshot): a copy that was in flight at the same time.
    Busy { claimed_at: i64 },
    /// A claim exists, made with another payload fingerprint.
    FingerprintMismatch,
}

/// The columns a lease function's row sets besides its key and fingerprint
/// (`dedup._write_lease`): its processed_at (a claim's is its transaction's start), result,
/// lease_id and lease_expires_at (None: NULL). Each datum lives as long as the call of
/// [`insert_claims`] that writes it.
#[derive(Clone, Copy)]
pub(crate) struct LeaseRow {
    pub(crate) processed_at: pg_sys::Datum,
    pub(crate) result: Option<pg_sys::Datum>,
    pub(crate) lease_id: Option<pg_sys::Datum>,
    pub(crate) lease_expires_at: Option<pg_sys::Datum>,
}

/// A fingerprint is 1 to [`error::MAX_FINGERPRINT_BYTES`] bytes.
pub(crate) fn check_fingerprint(func: &str, fingerprint: &str) {
    error::check_length(
        func,
        || "fingerprint",
        fingerprint,
        error::MAX_FINGERPRINT_BYTES,
    );
}

fn claim(job_id: &str, scope: Option<&str>, fingerprint: Option<&str>) -> Outcome {
    let scope = check_key(scope, job_id);
    check_transaction(FUNC);
    claim_checked(FUNC, scope, job_id, fingerprint, claim_route(FUNC))
}

/// Where this call's claims go; refused on a Citus worker whose claim table is not
/// distributed (they would stay on it).
pub(crate) fn claim_route(func: &str) -> citus::Route {
    let route = citus::route();
    if route == citus::Route::WorkerLocal {
        error::worker_not_distributed(func);
    }
    route
}

/// Claim one job whose key was checked, in a transaction check_transaction passed, by the
/// route claim_route gave; count the outcome.
pub(crate) fn claim_checked(
    func: &str,
    scope: &str,
    job_id: &str,
    fingerprint: Option<&str>,
    route: citus::Route,
) -> Outcome {
    // When the claim began, for the wait a busy claim had (0: not counting).
    let started = stats::clock_if_counting();
    // On Citus (dedup.distribute()), a statement Citus routes to the job's shard instead.
    let outcome = if route == citus::Route::Citus {
        citus::claim(func, scope, job_id, fingerprint)
    } else {
        // SAFETY: insert_claim's contract holds: we are in a transaction that may write
        // (check_writable refused a standby, a read-only transaction and parallel mode), on
        // the backend's main thread, under the pgrx guard of the #[pg_extern] function that
        // called us, which re-raises every ERROR insert_claim's PostgreSQL calls raise.
        let outcome = unsafe { insert_claim(scope, job_id, fingerprint) };
        stats::count_probes(scope, crate::generations::take_probes());
        outcome
    };
    // A copy of a job whose claim was pruned? (Not through Citus: its claims are pruned on
    // the nodes that hold the shards, where the claim is not made, so they are not kept.)
    let looked = if outcome == Outcome::Claimed && route != citus::Route::Citus {
        crate::expired::look(scope, job_id)
    } else {
        crate::expired::Looked::default()
    };
    count(scope, &outcome, started, looked);
    outcome
}

/// Count a claim's outcome in dedup.stats; `started` is the clock when the claim began
/// (0: not counting), for the wait of a busy one.
pub(crate) fn count(scope: &str, outcome: &Outcome, started: i64, looked: crate::expired::Looked) {
    let ended = if started > 0 && matches!(outcome, Outcome::Busy { .. }) {
        stats::clock_if_counting()
    } else {
        0
    };
    count_at(scope, outcome, started, ended, looked);
}

/// [`count`] with the clock at the claim's answer (`ended`) read already; `looked`: what a
/// claim that returned true found in the summaries of pruned claims.
pub(crate) fn count_at(
    scope: &str,
    outcome: &Outcome,
    started: i64,
    ended: i64,
    looked: crate::expired::Looked,
) {
    stats::count(
        scope,
        match *outcome {
            Outcome::Claimed => stats::Event::Claims { n: 1, looked },
            Outcome::Duplicate { claimed_at } => stats::Event::Duplicate { claimed_at },
            Outcome::Busy { claimed_at } => stats::Event::Busy {
                claimed_at,
                waited: if started > 0 && ended > 0 {
                    (ended - started).max(1)
                } else {
                    0
                },
            },
            Outcome::FingerprintMismatch => stats::Event::FingerprintMismatch,
        },
    );
}

/// Insert the claim row the way `INSERT ... ON CONFLICT DO NOTHING` does, without the
/// planner and executor around it: check the unique index for a conflict (waiting for an
/// in-progress inserter), insert the heap tuple speculatively, insert the index entries and
/// confirm the tuple, or kill it and start over if a concurrent inserter won the race.
/// The same executor routines as nodeModifyTable.c's ExecInsert are used, so the locking,
/// waiting and isolation behaviour are those of the SQL statement.
///
/// Returns whether this call inserted the row, and if not, what it found.
///
/// # Safety
///
/// Call inside a transaction that may write (check_writable passed), on the backend's main
/// thread, from a function run under pgrx's guard (the #[pg_extern] try_claim functions):
/// every ERROR raised by the PostgreSQL calls below (lock waits ending in deadlock,
/// lock_timeout or cancel, unique violations of other indexes, out of memory) is caught at
/// its pg_sys call, unwinds these frames as a Rust panic and is re-raised by that wrapper.
/// What such an unwind skips (table_close, ExecCloseIndices, ExecDropSingleTupleTableSlot,
/// FreeExecutorState, SpeculativeInsertionLockRelease) is released by the transaction's
/// (or subtransaction's) abort: relcache and index references, the slots' tuple
/// descriptor and buffer pins and the locks through the resource owner, and the executor
/// state's memory with the caller's memory context it is a child of.
unsafe fn insert_claim(scope: &str, job_id: &str, fingerprint: Option<&str>) -> Outcome {
    let mut outcome = Outcome::Claimed;
    insert_claims(
        FUNC,
        scope,
        &[(job_id, fingerprint)],
        false,
        None,
        |_, o| outcome = o,
    );
    outcome
}

/// [`insert_claim`] for several jobs of one scope, in the order given, with one executor
/// state, one open relation and one slot for all of them (what makes a batch cost what
/// one INSERT of many rows costs); `each(i, outcome)` is told the outcome of `keys[i]`
/// as soon as it is known, while the claim table is open: it must not run SQL.
///
/// # Safety
///
/// As for [`insert_claim`].
///
/// Long because the executor state it makes once for all keys is made and torn down here,
/// each step with the contract that makes it sound; each key is [`store_key`] and
/// [`speculative_claim`].
pub(crate) unsafe fn insert_claims(
    func: &str,
    scope: &str,
    keys: &[(&str, Option<&str>)],
    batch: bool,
    row: Option<LeaseRow>,
    mut each: impl FnMut(usize, Outcome),
) {
    // In a database that uses generations, a claim whose generations changed while it ran
    // (the epoch moved) starts over from the key it was at, with the new list: the keys
    // before it are decided.
    let mut start = 0;
    // Probes counted by a call that failed before it could take them are not this call's.
    crate::generations::take_probes();
    loop {
        // A claim can start over many times only if the generations keep changing.
        pg_sys::check_for_interrupts!();
        // SAFETY: the contract of this function.
        let next = insert_claims_from(func, scope, keys, start, batch, row, &mut each);
        if next >= keys.len() {
            break;
        }
        start = next;
    }
}

/// [`insert_claims`] from `keys[start]` on; returns the index of the key to start over
/// from (the generations changed under it), or `keys.len()` when every key is decided.
///
/// # Safety
///
/// As for [`insert_claim`].
unsafe fn insert_claims_from(
    func: &str,
    scope: &str,
    keys: &[(&str, Option<&str>)],
    start: usize,
    batch: bool,
    row: Option<LeaseRow>,
    each: &mut impl FnMut(usize, Outcome),
) -> usize {
    // The generations of this database (None: it uses the one table dedup.processed), read
    // with the epoch they belong to.
    // Not in the transaction that changes dedup.generations: its list names a generation no
    // other claimer knows until the commit, so a claim into it and a copy into the old one
    // could both be granted.
    if crate::generations::epoch::publishing_now() {
        error::claim_while_publishing(func);
    }
    let (epoch, gens) = crate::generations::list(func);
    // The current generation of the scope's series, which the claim inserts into.
    let route = gens.as_ref().map_or(0, |list| list.current_for(scope));
    // SAFETY: open_processed and generations::open (in a transaction, under the guard)
    // return the claim table open with RowExclusiveLock: `rel` points to its relcache
    // entry, valid until the table_close at the end of this function (or the
    // transaction's abort).
    let rel = match &gens {
        None => open_processed(),
        Some(list) => {
            match crate::generations::open(list.current(route), pg_sys::RowExclusiveLock as _, func)
            {
                Some(rel) => rel,
                None => return stale(func, epoch, start),
            }
        }
    };
    let layout = check_layout(rel, func);
    if keys.iter().any(|(_, fp)| fp.is_some()) && layout == Layout::Claims {
        error::needs_update(func, "a payload fingerprint", "0.3.0");
    }
    if row.is_some() && layout == Layout::Claims {
        error::needs_update(func, "a lease", "0.3.0");
    }

    // SAFETY: CreateExecutorState makes the "ExecutorState" context es_query_cxt as a child
    // of CurrentMemoryContext (the calling function's, usually the per-tuple memory of the
    // expression that calls try_claim) and allocates the EState in it; both live until
    // FreeExecutorState below. From the switch on, every palloc below (the ResultRelInfo,
    // the index info, the slot, the text datums, the arbiter list) lands in es_query_cxt;
    // MemoryContextSwitchTo is a plain global store in pgrx (no call, no ERROR).
    let estate = pg_sys::CreateExecutorState();
    let old_cxt = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);

    // SAFETY: palloc0 returns zeroed, MAXALIGNed memory of the ResultRelInfo's size in
    // es_query_cxt (or raises out of memory through the guard); InitResultRelInfo fills it
    // for `rel` (range-table index 1, no partition root); ExecOpenIndices(speculative)
    // opens each index of `rel` with RowExclusiveLock (index_open) and builds the
    // IndexInfo, with the unique-check data speculative insertion needs, in es_query_cxt;
    // they stay open until ExecCloseIndices below.
    let rri = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
        .cast::<pg_sys::ResultRelInfo>();
    (*rri).type_ = pg_sys::NodeTag::T_ResultRelInfo;
    pg_sys::InitResultRelInfo(rri, rel, 1, std::ptr::null_mut(), 0);
    pg_sys::ExecOpenIndices(rri, true);

    // SAFETY: table_slot_create with no list makes a standalone slot of the heap AM's type
    // for rel's tuple descriptor (pinned by the slot), in es_query_cxt; it is valid until
    // ExecDropSingleTupleTableSlot below. Its tts_values and tts_isnull arrays have natts
    // entries, which check_layout made layout.columns(); the two slices into them are used
    // only before ExecStoreVirtualTuple, while the slot lives. ExecClearTuple empties it.
    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    // The scope's text and the claim time are the same for every key: made once.
    let scope_datum = text_datum(scope);
    let now = pg_sys::Datum::from(unguarded::GetCurrentTransactionStartTimestamp());

    // The primary key is the only arbiter, as in ON CONFLICT ON CONSTRAINT processed_pkey
    // DO NOTHING: a unique index someone added is checked like any index (a conflict
    // there is a unique violation), never taken for a claim. (check_layout found the key.)
    let arbiters = arbiters(rel);
    // The other generations, each locked (AccessShareLock) before the epoch is read again:
    // the design's step 1, so that no lock is taken while a token is held, and a claimer
    // that locked the generation it inserts into after a seal wait listed its lockers sees
    // the publication that came before (and starts over). But a sealed generation with a
    // summary is not opened yet (`unopened`): only for a key its summary may hold, before
    // that key's insert (see the loop).
    let mut others: Vec<crate::generations::Other> = Vec::new();
    let mut unopened: Vec<(
        crate::generations::Generation,
        crate::generations::summary::Held,
    )> = Vec::new();
    let mut restart = None;
    if let Some(list) = &gens {
        for g in list.others() {
            if g.sealed {
                if let Some(held) = crate::generations::summary::find(g.relid, g.n) {
                    unopened.push((*g, held));
                    continue;
                }
            }
            match open_other(*g, None, func) {
                Some(o) => others.push(o),
                None => {
                    restart = Some(stale(func, epoch, start));
                    break;
                }
            }
        }
    }
    // The epoch read again after the locks (also with no list: use_generations() may have
    // committed since it was read, and this claim must then check generation 1).
    if let Some(e) = epoch {
        if restart.is_none() && crate::generations::epoch::read_even() != e {
            crate::generations::forget();
            restart = Some(start);
        }
    }
    // The transaction id and command id of the inserts: taken at the first insert (a batch
    // of duplicates assigns no transaction id), the same for every key of the call.
    let mut ids: Option<(pg_sys::TransactionId, pg_sys::CommandId)> = None;
    // A batch looks for a conflict before inserting only at its first key, and at every key
    // once one key has met a conflict (redelivered batches are duplicates throughout).
    // Otherwise it inserts at once: the check before the insert is not what decides (the
    // unique index insert is; PostgreSQL calls its own check "non-conclusive", there to
    // avoid a speculative insertion that has to be killed), and a key that does conflict is
    // found by the index insert, killed, and looked at again with the check (waiting for an
    // in-progress inserter), exactly as after a lost race. A new key saves the check: about
    // a fifth of a batch's cost. A single try_claim always checks first.
    let mut conflicts = false;
    // The summary the generation it inserts into fills as its claims go in, if it has one
    // (`summary::open_collecting`): each key this call inserts is added to it, before the
    // transaction's end (the seal waits for it), so that the summary holds every key of the
    // generation once it is sealed.
    let collecting = gens.as_ref().and_then(|list| {
        let g = list.current(route);
        crate::generations::summary::collecting(g.relid, g.n)
    });
    // Whether a key needs its hash: a summary is in play, unopened, open or collecting (set
    // once here; a generation opened in the loop comes from `unopened`, so it changes
    // nothing).
    let hashed =
        !unopened.is_empty() || others.iter().any(|o| o.summary.is_some()) || collecting.is_some();
    // The scope's part of the keys' hashes, made once.
    let seed = if hashed {
        crate::generations::summary::filter_seed(scope)
    } else {
        0
    };
    // A batch's hashes, made first, so that each key can ask for the filter blocks of the
    // key AHEAD places later (`Held::prefetch`): a new key's look-ups then find them in
    // cache instead of missing once per sealed generation, the most a batch key paid for
    // generations (perf at 1a05820: 8% of a batch's time in those loads).
    // (The summaries in play: those of the generations not opened yet, and of those a
    // key's "maybe" opened, which stay open for the call's later keys, each looked up
    // again after the insert: even at a 0.1% false-positive rate a batch of ten thousand
    // keys opens every summarised generation within its first thousand or so.)
    const AHEAD: usize = 8;
    let hashes: Vec<u64> = if hashed && batch {
        keys[start..]
            .iter()
            .map(|(job_id, _)| crate::generations::summary::hash_in(seed, job_id))
            .collect()
    } else {
        Vec::new()
    };
    let prefetch = |h: u64,
                    unopened: &[(_, crate::generations::summary::Held)],
                    others: &[crate::generations::Other]| {
        for (_, held) in unopened {
            held.prefetch(h);
        }
        for held in others.iter().filter_map(|o| o.summary.as_ref()) {
            held.prefetch(h);
        }
        if let Some(c) = &collecting {
            c.prefetch(h);
        }
    };
    for h in hashes.iter().take(AHEAD) {
        prefetch(*h, &unopened, &others);
    }
    let mut next = keys.len();
    for (i, &(job_id, fingerprint)) in keys.iter().enumerate().skip(start) {
        if restart.is_some() {
            break;
        }
        // A batch of thousands can be cancelled between two of its claims.
        pg_sys::check_for_interrupts!();
        store_key(
            slot,
            rel,
            layout,
            scope_datum,
            now,
            job_id,
            fingerprint,
            row,
        );
        let mut check_first = !batch || i == start || conflicts;
        let key = if let Some(h) = hashes.get(i - start) {
            if let Some(ahead) = hashes.get(i - start + AHEAD) {
                prefetch(*ahead, &unopened, &others);
            }
            *h
        } else if hashed {
            crate::generations::summary::hash_in(seed, job_id)
        } else {
            0
        };
        // A sealed generation not opened yet whose summary may hold this key (a duplicate,
        // or a false positive) is opened now, before this key's token, and looked in before
        // the insert; once open it stays open for the call's later keys. A new key (the
        // common case) opens none: no lock, no probe. Gone (dropped since the list was
        // read, so retired before, which moved the epoch): start over from this key.
        let mut j = 0;
        while j < unopened.len() {
            if unopened[j].1.absent(key) {
                j += 1;
                continue;
            }
            let (g, held) = unopened.swap_remove(j);
            match open_other(g, Some(held), func) {
                Some(o) => others.push(o),
                None => {
                    restart = Some(stale(func, epoch, i));
                    break;
                }
            }
            check_first = true;
        }
        if restart.is_some() {
            break;
        }
        let step = speculative_claim(
            func,
            rel,
            layout,
            Executor {
                rri,
                slot,
                estate,
                arbiters,
            },
            Generations {
                epoch,
                others: &others,
                key,
            },
            fingerprint,
            row.is_some(),
            check_first,
            &mut ids,
            &mut conflicts,
        );
        match step {
            Some(outcome) => {
                // A lease function's row with a running lease (a completed lease, moved here
                // with none, is never reopened in place).
                if let (Outcome::Claimed, Some(c)) = (&outcome, &collecting) {
                    c.add(key, row.is_some_and(|r| r.lease_expires_at.is_some()));
                }
                each(i, outcome)
            }
            None => {
                next = i;
                break;
            }
        }
    }
    if let Some(r) = restart {
        next = r;
    }
    for o in &others {
        // SAFETY: each was opened above and is closed once; the locks stay to the
        // transaction's end, as the executor keeps them.
        pg_sys::ExecDropSingleTupleTableSlot(o.slot);
        pg_sys::index_close(o.index, pg_sys::NoLock as _);
        pg_sys::table_close(o.heap, pg_sys::NoLock as _);
    }

    // SAFETY: teardown in reverse order, each object still valid: the slot is dropped (its
    // tuple descriptor pin released) before the indexes it was inserted into are closed
    // (index_close, their RowExclusiveLocks kept to the end of the transaction, as the
    // executor does); CurrentMemoryContext is switched back to the caller's
    // before FreeExecutorState deletes es_query_cxt and, with it, rri, the datums, the
    // arbiter list and the estate; table_close with NoLock drops our relcache reference
    // and keeps the RowExclusiveLock until the transaction ends. Nothing made above is
    // used after this point.
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::ExecCloseIndices(rri);
    pg_sys::MemoryContextSwitchTo(old_cxt);
    pg_sys::FreeExecutorState(estate);
    pg_sys::table_close(rel, pg_sys::NoLock as _);
    next
}

/// Open generation `g` (not the current one) for a claim's look-ups: the table and its
/// primary key with AccessShareLock, kept to the end of the transaction, a slot, its layout,
/// and `summary`, its summary if it has one. None: the table is gone.
///
/// # Safety
///
/// In a transaction, in the executor state's memory context of [`insert_claims_from`],
/// under pgrx's guard; the caller closes what is returned.
unsafe fn open_other(
    g: crate::generations::Generation,
    summary: Option<crate::generations::summary::Held>,
    func: &str,
) -> Option<crate::generations::Other> {
    let heap = crate::generations::open(g, pg_sys::AccessShareLock as _, func)?;
    let layout = check_layout(heap, func);
    let index = pg_sys::index_open(compat::primary_key(heap), pg_sys::AccessShareLock as _);
    let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
    Some(crate::generations::Other {
        heap,
        index,
        slot,
        layout,
        sealed: g.sealed,
        summary,
    })
}

/// A generation of the list is gone: if the epoch moved, the list is out of date, so start
/// over from `start` with a new one; at the same epoch the catalog names a table that does
/// not exist.
fn stale(func: &str, epoch: Option<u64>, start: usize) -> usize {
    // Forgotten either way: after an error, the next claim reads the catalog again (the
    // extension dropped and created again moves no epoch).
    crate::generations::forget();
    if epoch.is_none_or(|e| crate::generations::epoch::read_even() == e) {
        pgrx::error!("{func}: a generation named in dedup.generations does not exist");
    }
    start
}

/// The generations a claim checks besides the one it inserts into: the epoch its list was
/// read at (None: the database does not use generations), the others, open, and the key's
/// hash for their summaries (0 when none has one).
#[derive(Clone, Copy)]
struct Generations<'a> {
    epoch: Option<u64>,
    others: &'a [crate::generations::Other],
    key: u64,
}

impl Generations<'_> {
    /// Is the key certainly not in `o`, by its summary? (Only a sealed generation has one.)
    fn absent(&self, o: &crate::generations::Other) -> bool {
        o.summary.as_ref().is_some_and(|s| s.absent(self.key))
    }
}

/// The executor objects one call of [`insert_claims`] makes once for all its keys.
#[derive(Clone, Copy)]
struct Executor {
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    arbiters: *mut pg_sys::List,
}

/// Put one key's row into `slot`: scope, job_id, processed_at, fingerprint; no result and
/// no lease for a claim, the lease function's `row` otherwise.
///
/// # Safety
///
/// `slot` is [`insert_claims`]'s slot for `rel`, in es_query_cxt (the current memory
/// context), with layout.columns() values (the Leases layout when `row` is given); the
/// datums of `row` live as long as the call of [`insert_claims`].
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn store_key(
    slot: *mut pg_sys::TupleTableSlot,
    rel: pg_sys::Relation,
    layout: Layout,
    scope_datum: pg_sys::Datum,
    now: pg_sys::Datum,
    job_id: &str,
    fingerprint: Option<&str>,
    row: Option<LeaseRow>,
) {
    pg_sys::ExecClearTuple(slot);
    {
        let values = std::slice::from_raw_parts_mut((*slot).tts_values, layout.columns());
        let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, layout.columns());
        // scope, job_id, processed_at, fingerprint; no result, no lease.
        nulls.fill(true);
        // SAFETY: text_datum pallocs each text in es_query_cxt (it lives as long as the
        // slot that points to it); every length was checked against its limit
        // (check_key, check_fingerprint). unguarded::ExecStoreVirtualTuple only sets the
        // slot's flags and tts_nvalid = natts (all natts values and nulls are set
        // above): it cannot raise an ERROR, so it is called without pgrx's guard. The
        // two slices end before it.
        values[0] = scope_datum;
        values[1] = text_datum(job_id);
        values[2] = now;
        nulls[..3].fill(false);
        if let Some(fp) = fingerprint {
            values[3] = text_datum(fp);
            nulls[3] = false;
        }
        // A lease function's row (the insert_claims_from check made the layout Leases):
        // its own processed_at, result, lease_id and lease_expires_at.
        if let Some(row) = row {
            values[2] = row.processed_at;
            for (i, v) in [
                (4, row.result),
                (5, row.lease_id),
                (6, row.lease_expires_at),
            ] {
                if let Some(v) = v {
                    values[i] = v;
                    nulls[i] = false;
                }
            }
        }
    }
    unguarded::ExecStoreVirtualTuple(slot);
    (*slot).tts_tableOid = (*rel).rd_id;
}

/// Claim one key whose row is in `ex.slot`: look for a conflict first when `check_first`,
/// else insert at once; a speculative insertion that meets a conflict is killed and the
/// key looked at again, checking first. `ids` are the call's transaction and command ids
/// (taken at its first insert), `conflicts` whether a key of the call has met one.
///
/// # Safety
///
/// As for [`insert_claims`], with `ex` the live objects it made for `rel`.
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn speculative_claim(
    func: &str,
    rel: pg_sys::Relation,
    layout: Layout,
    ex: Executor,
    gens: Generations,
    fingerprint: Option<&str>,
    lease: bool,
    check_first: bool,
    ids: &mut Option<(pg_sys::TransactionId, pg_sys::CommandId)>,
    conflicts: &mut bool,
) -> Option<Outcome> {
    // SAFETY (the loop): `rri`, `slot`, `estate` and `arbiters` are the live objects made
    // above; `conflict_tid` is a local the check fills in. The calls that can raise an
    // ERROR, each through pgrx's guard: check_index_constraints (waits for an in-progress
    // inserter of the same key: deadlock, lock_timeout, cancel), inspect_conflict (see its
    // contract), GetCurrentTransactionId (assigns an xid: ERROR near wraparound),
    // SpeculativeInsertionLockAcquire (LockAcquire: out of shared lock memory; the lock is
    // held by CurrentResourceOwner until the release below, or the abort),
    // table_tuple_insert_speculative and insert_index_tuples (a heap or index insert:
    // out of disk, a unique violation in a non-arbiter index), and check_for_interrupts!
    // (ProcessInterrupts: cancel, timeouts). table_tuple_complete_speculative re-reads the
    // page (an I/O ERROR is possible there) and then finishes or kills the tuple inside a
    // critical section (where a failure is a PANIC, not an ERROR).
    // unguarded::SpeculativeInsertionLockRelease releases the lock the same resource owner
    // took a few calls before (see its declaration: no ERROR is reachable), and
    // unguarded::list_free pfrees the recheck list insert_index_tuples built in
    // es_query_cxt (NIL when empty), with no ERROR for a valid list.
    let mut check_first = check_first;
    let Executor {
        rri,
        slot,
        estate,
        arbiters,
    } = ex;
    // The key's datums, for the look-ups in the other generations: scope and job_id are
    // the slot's first two values (store_key), valid while the slot holds the row.
    let (scope_datum, job_datum) = (*(*slot).tts_values, *(*slot).tts_values.add(1));
    loop {
        // Whether this round looked in the other generations before its insert.
        let prechecked = check_first;
        if check_first {
            let mut conflict_tid = pg_sys::ItemPointerData::default();
            if !compat::check_index_constraints(rri, slot, estate, &mut conflict_tid, arbiters) {
                // A committed (or our own) claim exists.
                *conflicts = true;
                break Some(inspect_conflict(
                    func,
                    rel,
                    layout,
                    &mut conflict_tid,
                    fingerprint,
                    lease,
                ));
            }
            // And in the other generations: a duplicate of an older claim is answered
            // without inserting (no dead row in the current generation), after waiting,
            // holding no token, for a copy in flight there. Not conclusive, as the check
            // above: the cross-check after the insert is.
            if let Some(o) = precheck_others(func, gens, job_datum, scope_datum, fingerprint, lease)
            {
                *conflicts = true;
                break Some(o);
            }
        }
        let (xid, cid) = *ids.get_or_insert_with(|| {
            (
                pg_sys::GetCurrentTransactionId(),
                pg_sys::GetCurrentCommandId(true),
            )
        });
        let token = pg_sys::SpeculativeInsertionLockAcquire(xid);
        pg_sys::table_tuple_insert_speculative(rel, slot, cid, 0, std::ptr::null_mut(), token);
        let mut spec_conflict = false;
        let recheck = compat::insert_index_tuples(rri, slot, estate, &mut spec_conflict, arbiters);
        // The cross-check (design, "The claim protocol", step 2): between the index insert
        // and the confirmation, read the epoch again and look for the key in every other
        // generation. Every other generation is sealing or sealed (a claim looks in no other
        // series' current generation: `generations::List`), and this claimer always gives
        // way: it kills its row and releases its token before any wait.
        let mut crossed = None;
        if !spec_conflict {
            if let Some(epoch) = gens.epoch {
                if crate::generations::epoch::read_even() != epoch {
                    crossed = Some(Cross::Restart);
                } else {
                    // A sealed generation the check before the insert found clear is not
                    // looked at again: with the epoch unchanged since the list was read it
                    // was sealed all along, and no claim inserts into a sealed generation
                    // (the seal waited for every transaction that could), so the key cannot
                    // have appeared there since. (Also, a claimer that can still confirm a
                    // row there had it current, so it inserted before the publication that
                    // moved the epoch, before this list was loaded: the check before saw
                    // it.) One probe per sealed generation, not two; a batch's key that
                    // skipped the check before is looked up here. A generation still being
                    // sealed keeps both looks, the rule the model checks.
                    // A sealed generation whose summary says the key is not there is not
                    // looked at either (a batch's key that skipped the check before).
                    for o in gens
                        .others
                        .iter()
                        .filter(|o| !(prechecked && o.sealed || gens.absent(o)))
                    {
                        let found = crate::generations::probe(o, job_datum, scope_datum);
                        if !matches!(found, crate::generations::Found::Clear) {
                            crossed = Some(Cross::Found(o, found));
                            break;
                        }
                    }
                }
            }
        }
        let confirm = !spec_conflict && crossed.is_none();
        pg_sys::table_tuple_complete_speculative(rel, slot, token, confirm);
        unguarded::SpeculativeInsertionLockRelease(xid);
        unguarded::list_free(recheck);
        match crossed {
            None => {}
            Some(Cross::Restart) => {
                // The generations changed after our insert: start over with the new list
                // (its locks are taken before the next token).
                crate::generations::forget();
                break None;
            }
            Some(Cross::Found(o, crate::generations::Found::Committed(mut tid))) => {
                *conflicts = true;
                break Some(inspect_conflict(
                    func,
                    o.heap,
                    o.layout,
                    &mut tid,
                    fingerprint,
                    lease,
                ));
            }
            Some(Cross::Found(o, found)) => {
                // In flight there: wait for it, holding no token, then look again.
                crate::generations::wait_for(o, found);
                *conflicts = true;
                check_first = true;
                pg_sys::check_for_interrupts!();
                continue;
            }
        }
        if !spec_conflict {
            break Some(Outcome::Claimed);
        }
        // A concurrent inserter got its index entry in first, or (a batch that did not
        // check first) the key was claimed already: look again, this time checking
        // first (and waiting for an in-progress inserter).
        *conflicts = true;
        check_first = true;
        pg_sys::check_for_interrupts!();
    }
}

/// What the cross-check after an insert found.
enum Cross<'a> {
    /// The epoch moved: start over with the new list.
    Restart,
    /// The key in another generation.
    Found(&'a crate::generations::Other, crate::generations::Found),
}

/// The check before an insert in the other generations: a committed claim of the key is
/// the outcome (as inspect_conflict reports it); a copy in flight is waited for (no token is
/// held here) and looked at again; None: nothing found, insert.
///
/// # Safety
///
/// As for [`speculative_claim`]; the datums are the key's.
unsafe fn precheck_others(
    func: &str,
    gens: Generations,
    job_datum: pg_sys::Datum,
    scope_datum: pg_sys::Datum,
    fingerprint: Option<&str>,
    lease: bool,
) -> Option<Outcome> {
    for o in gens.others {
        // The summary of a sealed generation: a new key (the common case) skips its probe.
        if gens.absent(o) {
            continue;
        }
        loop {
            // SAFETY: the contract above: `o` is open, the datums live in the slot.
            match crate::generations::probe(o, job_datum, scope_datum) {
                crate::generations::Found::Clear => break,
                crate::generations::Found::Committed(mut tid) => {
                    return Some(inspect_conflict(
                        func,
                        o.heap,
                        o.layout,
                        &mut tid,
                        fingerprint,
                        lease,
                    ));
                }
                found => {
                    crate::generations::wait_for(o, found);
                    pg_sys::check_for_interrupts!();
                }
            }
        }
    }
    None
}

/// Look at the claim that conflicts with ours.
///
/// At REPEATABLE READ and SERIALIZABLE, a conflicting claim our snapshot cannot see (a
/// concurrent transaction committed it after our snapshot was taken) is a serialization
/// failure, exactly as for INSERT ... ON CONFLICT DO NOTHING (ExecCheckTIDVisible). A lease
/// (dedup.lease) is not a claim `try_claim` can report on. Otherwise it is a duplicate,
/// unless both claims carry a payload fingerprint and they differ. For a lease function's
/// row (`lease`) every committed row is a duplicate: the function locks it and looks.
///
/// # Safety
///
/// `rel` is the open claim table, checked by check_layout (a heap table: the slot below is
/// a buffer heap slot, which has the xmin system attribute); `tid` is the conflicting
/// tuple's TID that ExecCheckIndexConstraints reported. Call within insert_claim: in its
/// transaction, with a snapshot, CurrentMemoryContext = es_query_cxt, under the pgrx guard
/// of the #[pg_extern] caller, which re-raises this function's ERRORs (the Rust panics of
/// pgrx::error! and error::*, and those caught at the pg_sys calls).
///
/// Long because its steps (fetch, visibility, lease, fingerprint) all read the one tuple its
/// slot pins, from the fetch to the slot's drop on either return path, each step with the
/// contract that makes it sound.
unsafe fn inspect_conflict(
    func: &str,
    rel: pg_sys::Relation,
    layout: Layout,
    tid: &mut pg_sys::ItemPointerData,
    fingerprint: Option<&str>,
    lease: bool,
) -> Outcome {
    // SAFETY: table_slot_create makes a standalone slot in es_query_cxt, valid until the
    // ExecDropSingleTupleTableSlot on either return path (on an ERROR, es_query_cxt's
    // deletion with the caller's context and the abort's resource owner reclaim it and its
    // buffer pin). table_tuple_fetch_row_version reads `tid` with SnapshotAny (the global
    // SnapshotAnyData, taken by address without a Rust reference) and leaves the tuple in
    // the slot with its buffer pinned; it can raise an ERROR (I/O) through the guard.
    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    if !pg_sys::table_tuple_fetch_row_version(
        rel,
        tid,
        std::ptr::addr_of_mut!(pg_sys::SnapshotAnyData),
        slot,
    ) {
        pgrx::error!("dedup: failed to fetch the conflicting claim");
    }
    // Committed after our snapshot: a copy in flight at the same time as ours (we waited
    // for it), which REPEATABLE READ and SERIALIZABLE cannot accept.
    // SAFETY: the snapshot returned is snapmgr's (the statement's active snapshot, or the
    // static transaction snapshot), valid through this function, which takes no new one.
    // table_tuple_satisfies_snapshot share-locks the pinned buffer while it checks the
    // tuple; slot_getsysattr reads xmin from the heap slot; TransactionIdIsCurrentTransactionId
    // only reads this backend's transaction state; XactIsoLevel is a plain global read.
    // ERRORs (I/O, or our serialization failure) unwind through pgrx's guard.
    let snapshot = if pg_sys::ActiveSnapshotSet() {
        pg_sys::GetActiveSnapshot()
    } else {
        pg_sys::GetTransactionSnapshot()
    };
    let mut in_flight = false;
    if !pg_sys::table_tuple_satisfies_snapshot(rel, slot, snapshot) {
        let mut isnull = false;
        let xmin =
            pg_sys::slot_getsysattr(slot, pg_sys::MinTransactionIdAttributeNumber, &mut isnull);
        let xmin = pg_sys::TransactionId::from(xmin.value() as u32);
        // Our own claim from an earlier command of this transaction is not a conflict.
        if !pg_sys::TransactionIdIsCurrentTransactionId(xmin) {
            if pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 {
                error::serialization_failure(func);
            }
            in_flight = true;
        }
    }
    let mut isnull = false;
    // SAFETY: slot_getattr deforms the tuple held (and pinned) by the slot; processed_at
    // (attribute 3, NOT NULL) exists in every layout and is a by-value timestamptz.
    let claimed_at = pg_sys::slot_getattr(slot, PROCESSED_AT, &mut isnull).value() as i64;
    let duplicate = if in_flight {
        Outcome::Busy { claimed_at }
    } else {
        Outcome::Duplicate { claimed_at }
    };
    if layout == Layout::Claims || lease {
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        return duplicate;
    }
    // SAFETY: slot_getattr deforms the tuple held (and pinned) by the slot; attribute 7
    // and 4 exist in the Leases layout (check_layout). The fingerprint datum points into
    // the pinned buffer page (or, were it compressed or toasted, to the copy
    // pg_detoast_datum_packed pallocs in es_query_cxt): the &str from_datum borrows it only
    // for the comparison, before ExecDropSingleTupleTableSlot releases the pin.
    pg_sys::slot_getattr(slot, LEASE_EXPIRES_AT, &mut isnull);
    if !isnull {
        error::leased(func);
    }
    let stored = pg_sys::slot_getattr(slot, FINGERPRINT, &mut isnull);
    let outcome = match fingerprint {
        Some(ours) if !isnull && <&str>::from_datum(stored, false) != Some(ours) => {
            Outcome::FingerprintMismatch
        }
        _ => duplicate,
    };
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    outcome
}

/// A `text` datum of `s`, palloc'd in CurrentMemoryContext.
///
/// # Safety
///
/// Call on the backend's main thread with a valid CurrentMemoryContext: the text lives as
/// long as that context (es_query_cxt in insert_claim), and the datum must not be used
/// after it is reset or deleted. `s.len()` must fit an i32: callers pass job ids, scopes
/// and fingerprints checked against their limits (at most 1024 bytes).
unsafe fn text_datum(s: &str) -> pg_sys::Datum {
    // SAFETY: cstring_to_text_with_len copies `s.len()` bytes from the valid &str (no NUL
    // needed); its only ERROR, out of memory, goes through pgrx's guard to the caller's.
    pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
        s.as_ptr().cast(),
        s.len() as i32,
    ))
}

/// The arbiter list of a claim: the primary key of `dedup.processed`, and nothing else.
/// Built once per backend (and again when the key's OID changes: the extension dropped
/// and created again), in TopMemoryContext: the executor routines only read it, and the
/// claim path then allocates no list per claim.
static mut ARBITERS: (pg_sys::Oid, *mut pg_sys::List) = (pg_sys::InvalidOid, std::ptr::null_mut());

/// # Safety
///
/// `rel` is `dedup.processed`, open, and check_layout has found its primary key; under
/// pgrx's guard (RelationGetPrimaryKeyIndex may rebuild the index list by catalog scans).
unsafe fn arbiters(rel: pg_sys::Relation) -> *mut pg_sys::List {
    // SAFETY: the contract above. ARBITERS is backend-local (one thread); the list lives
    // in TopMemoryContext for the backend's life, or until replaced (the old one is freed
    // after the new one is made, so an ERROR in between leaves the old one valid).
    let cached = std::ptr::addr_of_mut!(ARBITERS);
    let pk = compat::primary_key(rel);
    if (*cached).0 != pk || (*cached).1.is_null() {
        let old = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
        let list = pg_sys::lappend_oid(std::ptr::null_mut(), pk);
        pg_sys::MemoryContextSwitchTo(old);
        if !(*cached).1.is_null() {
            pg_sys::list_free((*cached).1);
        }
        *cached = (pk, list);
    }
    (*cached).1
}

/// The OIDs of the schema `dedup` and of `dedup.processed`, looked up once per backend.
static mut PROCESSED: (pg_sys::Oid, pg_sys::Oid) = (pg_sys::InvalidOid, pg_sys::InvalidOid);

/// Open `dedup.processed` with RowExclusiveLock.
///
/// The cached OID is checked, not trusted: after the lock is taken, the relation must still
/// exist and still be `processed` in the schema `dedup` (the extension may have been
/// dropped and created again since). A TRUNCATE, VACUUM or ANALYZE of the table changes
/// nothing here: the OID stays.
///
/// # Safety
///
/// Call inside a transaction (syscache lookups; the lock is held by the transaction's
/// resource owner), on the backend's main thread, under pgrx's guard: try_table_open waits
/// for the lock and raises ERRORs (deadlock, lock_timeout, cancel, or a cached OID that now
/// names an index or a composite type), caught at the pg_sys call and re-raised by the
/// guarded caller (a #[pg_extern], or prune::in_transaction's PgTry). The relation returned
/// is open with RowExclusiveLock: its relcache entry is valid until the caller's
/// table_close (or the transaction's abort), and the caller must close it.
pub(crate) unsafe fn open_processed() -> pg_sys::Relation {
    // SAFETY: PROCESSED is backend-local (each backend has its own copy of the library's
    // statics) and only touched from the backend's main thread, through this raw pointer,
    // with no reference to it kept across a call.
    let cached = std::ptr::addr_of_mut!(PROCESSED);
    for _ in 0..2 {
        if (*cached).1 == pg_sys::InvalidOid {
            *cached = lookup_processed();
        }
        let (nsp, relid) = *cached;
        // SAFETY: try_table_open returns NULL, holding no lock, when `relid` no longer names
        // a relation; otherwise an open entry. rd_rel is read at once, before any call that
        // could accept invalidation messages and rebuild the entry (replacing rd_rel);
        // relname is a NUL-terminated NameData. table_close releases the lock before we
        // look the OIDs up again.
        let rel = pg_sys::try_table_open(relid, pg_sys::RowExclusiveLock as _);
        if !rel.is_null() {
            let form = (*rel).rd_rel;
            let name = std::ffi::CStr::from_ptr((*form).relname.data.as_ptr());
            if (*form).relnamespace == nsp && name.to_bytes() == b"processed" {
                return rel;
            }
            pg_sys::table_close(rel, pg_sys::RowExclusiveLock as _);
        }
        *cached = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    }
    error::table_missing()
}

/// The table `dedup.processed`, found by name and then checked to be the extension's own:
/// a member of the extension dedup. A look-alike in a look-alike schema (the real one
/// renamed by a role that owned it before 0.6.0 refused such a schema) is refused, never
/// written to (security::a_look_alike_claim_table_is_refused).
///
/// # Safety
///
/// Call inside a transaction (syscache lookups), under pgrx's guard: get_namespace_oid
/// (missing_ok), get_relname_relid and get_extension_oid (missing_ok) return InvalidOid for
/// a missing name, and getExtensionOfObject for an object of no extension; they raise an
/// ERROR only if the catalog cannot be read; error::* raise ours as panics.
unsafe fn lookup_processed() -> (pg_sys::Oid, pg_sys::Oid) {
    // SAFETY: the contract above; the names are 'static NUL-terminated C strings that the
    // lookups only read.
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    let relid = if nsp == pg_sys::InvalidOid {
        pg_sys::InvalidOid
    } else {
        pg_sys::get_relname_relid(c"processed".as_ptr(), nsp)
    };
    if relid == pg_sys::InvalidOid {
        error::table_missing();
    }
    let ext = pg_sys::get_extension_oid(c"dedup".as_ptr(), true);
    if ext == pg_sys::InvalidOid
        || pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, relid) != ext
    {
        error::not_the_extensions_table();
    }
    (nsp, relid)
}

/// The claim row is written column by column into a heap table, through its primary key:
/// refuse a table whose columns are not the ones some version of the extension made
/// (altered by hand), a table that is not a plain heap table (partitioned, or of another
/// access method), and one without its primary key.
///
/// # Safety
///
/// `rel` must be an open relation (open_processed) that stays open for the call, in a
/// transaction, under pgrx's guard (RelationGetPrimaryKeyIndex can raise catalog ERRORs;
/// error::* raise ours as panics). Callers rely on the result: Layout::columns() is the
/// relation's natts, and the relation is a heap table (heap_setscanlimits and the heap
/// slot's system attributes depend on it).
pub(crate) unsafe fn check_layout(rel: pg_sys::Relation, func: &str) -> Layout {
    // SAFETY: rd_rel is read before RelationGetPrimaryKeyIndex, which may build the index
    // list by catalog scans whose lock acquisition accepts invalidation messages, and a
    // rebuild of the entry replaces rd_rel (not rd_att while the descriptor is unchanged,
    // as it is under our RowExclusiveLock). rd_att is read after it, and the attribute
    // slice of natts entries is used before any further call.
    let form = (*rel).rd_rel;
    if (*form).relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
        || (*form).relam != pg_sys::HEAP_TABLE_AM_OID
    {
        error::not_a_heap_table(func);
    }
    if compat::primary_key(rel) == pg_sys::InvalidOid {
        error::unexpected_layout(func);
    }
    let desc = (*rel).rd_att;
    let natts = (*desc).natts as usize;
    let prefix_ok = (0..natts).zip(COLUMNS).all(|(i, oid)| {
        // SAFETY: i < natts; `desc` is the open relation's, valid until it is closed.
        let a = compat::attribute(desc, i);
        !a.attisdropped && a.atttypid == oid
    });
    match natts {
        3 if prefix_ok => Layout::Claims,
        7 if prefix_ok => Layout::Leases,
        _ => error::unexpected_layout(func),
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION dedup.try_claim(pg_catalog.text, pg_catalog.text) IS
'Claim job_id in scope for the current transaction. true: do the job''s effect in this transaction; the claim commits or rolls back with it. false: a committed claim exists; skip the job. Waits while a concurrent transaction holds the claim.';
COMMENT ON FUNCTION dedup.try_claim(pg_catalog.int8, pg_catalog.text) IS
'dedup.try_claim for a bigint job id: the same job as its decimal text, try_claim(42) = try_claim(''42'').';
COMMENT ON FUNCTION dedup.try_claim(pg_catalog.uuid, pg_catalog.text) IS
'dedup.try_claim for a uuid job id: the same job as its canonical text (lowercase, hyphenated).';
"#,
    name = "try_claim_comments",
    requires = [try_claim_text, try_claim_bigint, try_claim_uuid]
);

/// PostgreSQL functions that cannot raise an error, called without pgrx's error guard (a
/// sigsetjmp and a thread check per call, about 90 instructions, several times per claim).
/// Only functions that never reach `ereport(ERROR)` belong here: a longjmp through Rust
/// frames that pgrx did not guard would be undefined behaviour.
mod unguarded {
    use pgrx::pg_sys;
    // SAFETY: each declaration matches the prototype pgrx binds for PostgreSQL 13 to 18
    // (pgrx-pg-sys's bindings) and is called only from the backend's main thread, inside a
    // #[pg_extern] function and a transaction. None of these functions reaches
    // ereport(ERROR) or elog(ERROR) on the paths we use (see each one), so no longjmp can
    // cross the Rust frames that pgrx's per-call guard would otherwise protect.
    extern "C" {
        /// Reads `CurrentTransactionState->parallelModeLevel`.
        // SAFETY: a read of backend-local transaction state; no allocation, no ERROR.
        pub fn IsInParallelMode() -> bool;
        /// Reads `CurrentTransactionState->blockState`.
        // SAFETY: a read of backend-local transaction state; no allocation, no ERROR.
        pub fn IsTransactionBlock() -> bool;
        /// Returns `xactStartTimestamp`.
        // SAFETY: a read of a backend-local global; no allocation, no ERROR.
        pub fn GetCurrentTransactionStartTimestamp() -> pg_sys::TimestampTz;
        /// Sets the slot's flags (assertions only).
        // SAFETY: `slot` must be a live, empty slot whose values and nulls are all set: it
        // only clears TTS_FLAG_EMPTY and sets tts_nvalid = natts; no ERROR.
        pub fn ExecStoreVirtualTuple(
            slot: *mut pg_sys::TupleTableSlot,
        ) -> *mut pg_sys::TupleTableSlot;
        /// pfree of a list we built (NIL is fine).
        // SAFETY: list_free returns at once for NIL, else pfrees the cell array and the
        // header; pfree raises an ERROR only for a pointer that is not a valid chunk,
        // which a list ExecInsertIndexTuples built in es_query_cxt is.
        pub fn list_free(list: *mut pg_sys::List);
        /// LockRelease of our own speculative-insertion lock: a WARNING at most, never an
        /// ERROR.
        // SAFETY: LockRelease's elog(ERROR)s are consistency checks unreachable here: an
        // invalid lock method or mode (constants), re-finding a fast-path lock (only
        // relation locks take the fast path), ResourceOwnerForgetLock not finding the lock
        // (CurrentResourceOwner took it in SpeculativeInsertionLockAcquire a few calls
        // before and has not changed), LWLockAcquire's "too many LWLocks taken" (none is
        // held here). Not holding the lock is a WARNING; lock table corruption a PANIC.
        pub fn SpeculativeInsertionLockRelease(xid: pg_sys::TransactionId);
    }
}
