//! Citus: `dedup.processed` distributed over the nodes of a cluster (0.6.0).
//!
//! On plain PostgreSQL a claim is written by the executor's insertion routines, without a
//! statement (claim.rs). On Citus that row would land in the node's empty local shell of
//! the distributed table, unseen by the other nodes. So once `dedup.processed` is a Citus
//! table (`dedup.distribute()`), a claim is a statement Citus routes to the job's shard:
//! `INSERT ... ON CONFLICT DO NOTHING`, run as the caller, so it shares the caller's
//! connection to that shard with the job's effect (one-node commit when both are
//! colocated, Citus's two-phase commit otherwise). Pruning then deletes from the shard
//! placements on each node (prune/pass.rs asks [`local_shards`]).
//!
//! On a server without Citus nothing here costs a claim more than one read of a cached
//! flag: [`route`] answers Local without a lookup.
use crate::claim::Outcome;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;

/// Whether the Citus library is loaded in this backend: -1 not known yet, 0 no, 1 yes.
/// Citus works only from shared_preload_libraries, so the answer cannot change later.
static mut LOADED: i8 = -1;

/// The claim table's OID and whether Citus distributes it (-1: not known). Reset by the
/// relcache callback below when the table's entry is invalidated: Citus invalidates it
/// when it distributes or undistributes the table (on every node that has its metadata).
static mut DISTRIBUTED: (pg_sys::Oid, i8) = (pg_sys::InvalidOid, -1);
static mut CALLBACK_REGISTERED: bool = false;

fn citus_loaded() -> bool {
    // SAFETY: LOADED is backend-local and touched only on the main thread, through a raw
    // pointer with no reference kept. GetConfigOption(missing_ok) returns NULL for an
    // unknown setting and raises no ERROR for a known one (restrict_privileged false).
    unsafe {
        let cached = std::ptr::addr_of_mut!(LOADED);
        if *cached < 0 {
            let v = pg_sys::GetConfigOption(c"citus.version".as_ptr(), true, false);
            *cached = i8::from(!v.is_null());
        }
        *cached == 1
    }
}

/// Relcache invalidation of `relid` (InvalidOid: of every relation): forget the answer.
#[pg_guard]
unsafe extern "C-unwind" fn forget_distribution(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    // SAFETY: a callback runs on the backend's main thread; a plain store.
    let cached = std::ptr::addr_of_mut!(DISTRIBUTED);
    if relid == pg_sys::InvalidOid || relid == (*cached).0 {
        *cached = (pg_sys::InvalidOid, -1);
    }
}

/// The OID of `dedup.processed`, or InvalidOid without one (the caller's own path raises
/// the error then).
fn processed_oid() -> pg_sys::Oid {
    // SAFETY: syscache lookups inside a transaction, under the caller's pgrx guard; both
    // return InvalidOid for a missing name.
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(c"processed".as_ptr(), nsp)
    }
}

/// Where claims of this database go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Route {
    /// Into the local `dedup.processed`: no Citus, or a coordinator (or single node) whose
    /// claim table is not distributed.
    Local = 0,
    /// Through Citus, to the job's shard: `dedup.processed` is distributed by job_id.
    Citus = 1,
    /// Nowhere: a Citus worker whose claim table is not distributed (not yet, or no more).
    /// A claim there would stay on this worker, unseen by the other nodes, which could claim
    /// the job again (two effects for one job), so claims are refused; pruning the local
    /// table is fine (citus::distribute_refuses_claims_it_cannot_move_and_keeps_the_others).
    WorkerLocal = 2,
}

/// Whether Citus's catalog is in this database (the citus extension is created here).
fn catalog_here() -> bool {
    // SAFETY: as in processed_oid: a syscache lookup that returns InvalidOid when Citus's
    // catalog is absent.
    unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_partition".as_ptr(),
            pg_sys::PG_CATALOG_NAMESPACE.into(),
        ) != pg_sys::InvalidOid
    }
}

/// Whether this database uses Citus: the library loaded and the citus extension created
/// here, whether `dedup.processed` is distributed yet or not. Generations refuse such a
/// database (and `dedup.distribute()` one that uses generations): claims routed by Citus
/// go to the distributed `dedup.processed` and never look in a generation, so a copy of a
/// job claimed in one before the distribution would be claimed again after it.
pub(crate) fn in_database() -> bool {
    citus_loaded() && catalog_here()
}

/// Where claims of `relid` go (see [`Route`]). A Citus table that is not hash-distributed
/// (a reference or Citus-managed local table) is refused: each node would prune its own
/// replica on its own schedule.
fn route_of(relid: pg_sys::Oid) -> Route {
    if !catalog_here() {
        return Route::Local;
    }
    // Read-only statements (no transaction id is assigned: this works on a standby).
    let found = Spi::connect(|c| {
        let kind = c
            .select(
                "SELECT d.partmethod::pg_catalog.text FROM pg_catalog.pg_dist_partition AS d \
                  WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1",
                Some(1),
                &[DatumWithOid::from(relid)],
            )?
            .first()
            .get_one::<String>()
            .or_else(|e| match e {
                pgrx::spi::SpiError::InvalidPosition => Ok(None),
                e => Err(e),
            })?;
        let worker = c
            .select(
                "SELECT g.groupid OPERATOR(pg_catalog.>) 0 FROM pg_catalog.pg_dist_local_group AS g",
                Some(1),
                &[],
            )?
            .first()
            .get_one::<bool>()
            .or_else(|e| match e {
                pgrx::spi::SpiError::InvalidPosition => Ok(None),
                e => Err(e),
            })?;
        Ok::<_, pgrx::spi::Error>((kind, worker.unwrap_or(false)))
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: reading Citus's catalog failed: {e}"));
    match found {
        (Some(k), _) if k == "h" => Route::Citus,
        (Some(k), _) => crate::error::not_hash_distributed(&k),
        (None, true) => Route::WorkerLocal,
        (None, false) => Route::Local,
    }
}

/// Where claims go: Local without a lookup when the Citus library is not loaded; otherwise
/// cached per backend until the claim table's relcache entry is invalidated (Citus
/// invalidates it when it distributes or undistributes the table, on every node).
pub(crate) fn route() -> Route {
    if !citus_loaded() {
        return Route::Local;
    }
    let relid = processed_oid();
    if relid == pg_sys::InvalidOid {
        return Route::Local;
    }
    // SAFETY: DISTRIBUTED and CALLBACK_REGISTERED are backend-local, main thread only.
    // CacheRegisterRelcacheCallback can raise an ERROR (too many callbacks) through the
    // caller's guard; it is registered once per backend.
    unsafe {
        if !CALLBACK_REGISTERED {
            pg_sys::CacheRegisterRelcacheCallback(
                Some(forget_distribution),
                pg_sys::Datum::from(0),
            );
            CALLBACK_REGISTERED = true;
        }
        // Under REPEATABLE READ or SERIALIZABLE the lookup sees the transaction's snapshot,
        // which may predate a distribution committed since: such an answer is not kept.
        if pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 {
            return route_of(relid);
        }
        let cached = std::ptr::addr_of_mut!(DISTRIBUTED);
        if (*cached).0 != relid || (*cached).1 < 0 {
            let r = route_of(relid);
            *cached = (relid, r as i8);
        }
        match (*cached).1 {
            1 => Route::Citus,
            2 => Route::WorkerLocal,
            _ => Route::Local,
        }
    }
}

/// Whether this node is a Citus worker (Citus loaded, its catalog here, and a group id
/// other than the coordinator's 0). Not cached: asked only by dedup.advance and position.
pub(crate) fn on_worker() -> bool {
    if !citus_loaded() {
        return false;
    }
    // SAFETY: a syscache lookup; InvalidOid when Citus's catalog is absent.
    let catalog = unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_local_group".as_ptr(),
            pg_sys::PG_CATALOG_NAMESPACE.into(),
        )
    };
    if catalog == pg_sys::InvalidOid {
        return false;
    }
    Spi::connect(|c| {
        c.select(
            "SELECT g.groupid OPERATOR(pg_catalog.>) 0 FROM pg_catalog.pg_dist_local_group AS g",
            Some(1),
            &[],
        )?
        .first()
        .get_one::<bool>()
        .or_else(|e| match e {
            pgrx::spi::SpiError::InvalidPosition => Ok(None),
            e => Err(e),
        })
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: reading Citus's pg_dist_local_group failed: {e}"))
    .unwrap_or(false)
}

/// Whether claims go through Citus.
pub(crate) fn routes_claims() -> bool {
    route() == Route::Citus
}

/// `dedup._distributed()`: whether claims go through Citus in this database (the lease
/// functions of sql/citus.sql choose their statement's form by it).
#[pg_extern(name = "_distributed", volatile, parallel_safe)]
pub(crate) fn distributed() -> bool {
    routes_claims()
}

/// The statements of a routed claim, prepared once per backend (the plan cache re-plans
/// them when the table changes).
static mut PLANS: Option<(OwnedPreparedStatement, OwnedPreparedStatement)> = None;

const INSERT: &str = "INSERT INTO dedup.processed AS p (scope, job_id, fingerprint) \
                      VALUES ($1, $2, $3) ON CONFLICT (job_id, scope) DO NOTHING RETURNING true";
const INSPECT: &str = "SELECT p.fingerprint, p.lease_expires_at IS NOT NULL, p.processed_at FROM dedup.processed AS p \
                       WHERE p.job_id OPERATOR(pg_catalog.=) $2 AND p.scope OPERATOR(pg_catalog.=) $1";

/// How many times a routed claim runs its INSERT while, each time, the row that stopped it
/// is gone by the time the claim reads it (deleted and committed in between: a lease
/// released, a job forgotten or pruned).
const TRIES: u32 = 3;

/// A claim through Citus: the INSERT is routed to the shard of `job_id` and run as the
/// caller (who needs the grants of the docs, "Scaling out with Citus"). Waiting and
/// isolation are those of `INSERT ... ON CONFLICT DO NOTHING` on the shard. A duplicate
/// that was in flight cannot be told from one committed earlier: both are duplicates.
/// When every one of the [`TRIES`] met a conflict that was gone when read, no claim exists
/// and `false` would say the job was done: 40001 instead, counted nowhere
/// (citus::a_claim_whose_conflict_vanishes_is_an_error_not_false).
pub(crate) fn claim(func: &str, scope: &str, job_id: &str, fingerprint: Option<&str>) -> Outcome {
    let args = [
        DatumWithOid::from(scope),
        DatumWithOid::from(job_id),
        DatumWithOid::from(fingerprint),
    ];
    let outcome = Spi::connect_mut(|c| {
        // SAFETY: PLANS is backend-local, main thread only; the plans are kept (SPI_keepplan)
        // and live for the backend. It is written once, through the raw pointer, before any
        // reference to it exists; after that only shared references are taken, so a claim
        // made from inside one of these statements (a trigger) aliases nothing mutably.
        unsafe {
            let slot = std::ptr::addr_of_mut!(PLANS);
            if (*slot).is_none() {
                let types =
                    [pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID].map(pgrx::PgOid::from);
                let insert = c.prepare_mut(INSERT, &types)?.keep();
                let inspect = c.prepare(INSPECT, &types[..2])?.keep();
                if (*slot).is_none() {
                    slot.write(Some((insert, inspect)));
                }
            }
        }
        // SAFETY: initialised above; only shared references from here on.
        let (insert, inspect) =
            unsafe { (*std::ptr::addr_of!(PLANS)).as_ref() }.expect("prepared above");
        for _ in 0..TRIES {
            // A session caught in a cycle of claims made and removed can be cancelled.
            pg_sys::check_for_interrupts!();
            if !c.update(insert, None, &args)?.is_empty() {
                return Ok(Some(Outcome::Claimed));
            }
            let found = c.select(inspect, None, &args[..2])?;
            if let Some(row) = found.into_iter().next() {
                let stored: Option<String> = row.get(1)?;
                let leased: bool = row.get(2)?.unwrap_or(false);
                let claimed_at: Option<pgrx::datum::TimestampWithTimeZone> = row.get(3)?;
                let claimed_at = claimed_at.map_or(0, pg_sys::TimestampTz::from);
                if leased {
                    crate::error::leased(func);
                }
                return Ok(Some(match (stored, fingerprint) {
                    (Some(s), Some(f)) if s != f => Outcome::FingerprintMismatch,
                    _ => Outcome::Duplicate { claimed_at },
                }));
            }
            // The row that stopped our INSERT is gone (pruned, forgotten, or a lease
            // released in between): try again.
        }
        // No claim exists, ours or another's: neither true nor false is the answer.
        Ok::<_, pgrx::spi::Error>(None)
    })
    .unwrap_or_else(|e| pgrx::error!("{func}: the claim through Citus failed: {e}"));
    let Some(outcome) = outcome else {
        crate::error::claim_kept_changing(func, scope, job_id, TRIES);
    };
    if outcome == Outcome::Claimed {
        remember_claim(scope, job_id);
    }
    outcome
}

/// A job this transaction claimed through Citus: scope, job id, the subtransaction that
/// claimed it (moved to the parent when it commits, dropped when it aborts) and the role
/// that claimed it (whose Citus connections hold the row).
struct ClaimedHere {
    scope: String,
    job_id: String,
    subxact: pg_sys::SubTransactionId,
    user: pg_sys::Oid,
}

/// The jobs this transaction claimed through Citus, for `dedup.set_result` and
/// `dedup.claim_result`: the row's xmin says nothing on a shard of another node.
static mut CLAIMED_HERE: Vec<ClaimedHere> = Vec::new();
static mut CALLBACKS_REGISTERED: bool = false;

#[pg_guard]
unsafe extern "C-unwind" fn forget_claims(
    _event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    // SAFETY: main thread. Every transaction event (commit, abort, prepare, and their
    // pre-events) ends the transaction the list belongs to, or comes just before its end
    // with no SQL of the caller's left to run. The list is emptied with its memory kept
    // (dropping the Strings frees Rust heap memory only; no PostgreSQL call, no ERROR).
    (*std::ptr::addr_of_mut!(CLAIMED_HERE)).clear();
}

#[pg_guard]
unsafe extern "C-unwind" fn forget_subtransaction(
    event: pg_sys::SubXactEvent::Type,
    mine: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    // SAFETY: main thread; plain Rust on the backend-local list, no PostgreSQL call.
    let list = &mut *std::ptr::addr_of_mut!(CLAIMED_HERE);
    match event {
        // ROLLBACK TO SAVEPOINT, or an exception block: its claims are gone.
        pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => list.retain(|c| c.subxact != mine),
        // RELEASE, or a block that ended well: its claims now belong to the parent.
        pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => list
            .iter_mut()
            .filter(|c| c.subxact == mine)
            .for_each(|c| c.subxact = parent),
        _ => {}
    }
}

fn remember_claim(scope: &str, job_id: &str) {
    // SAFETY: backend-local statics, main thread only. The Register calls palloc in
    // TopMemoryContext (out of memory raises through the caller's guard); once per backend.
    // GetCurrentSubTransactionId and GetUserId read backend-local state, no ERROR.
    unsafe {
        if !CALLBACKS_REGISTERED {
            pg_sys::RegisterXactCallback(Some(forget_claims), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(forget_subtransaction), std::ptr::null_mut());
            CALLBACKS_REGISTERED = true;
        }
        (*std::ptr::addr_of_mut!(CLAIMED_HERE)).push(ClaimedHere {
            scope: scope.to_string(),
            job_id: job_id.to_string(),
            subxact: pg_sys::GetCurrentSubTransactionId(),
            user: pg_sys::GetUserId(),
        });
    }
}

/// The role that claimed `job_id` in `scope` through Citus in this transaction (and whose
/// claim is still in force: not rolled back to a savepoint), if any.
pub(crate) fn claimed_here(scope: &str, job_id: &str) -> Option<pg_sys::Oid> {
    // SAFETY: backend-local, main thread only; a shared read.
    unsafe {
        (*std::ptr::addr_of!(CLAIMED_HERE))
            .iter()
            .rev()
            .find(|c| c.scope == scope && c.job_id == job_id)
            .map(|c| c.user)
    }
}

/// Run `f` as `user` (None: the role that called the SECURITY DEFINER function we are in,
/// the session's current role), so that Citus opens, or reuses, that role's connections:
/// the ones the caller's claim and effect used. Called from our SECURITY DEFINER functions,
/// where it only lowers privileges to the caller's. The previous user and security context
/// come back afterwards, and at an abort from the (sub)transaction's saved state.
pub(crate) fn as_caller<R>(user: Option<pg_sys::Oid>, f: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::Oid, i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: sets two backend globals back; no ERROR. (On a PostgreSQL ERROR the
            // unwind also passes here; the abort then restores the same values.)
            unsafe { pg_sys::SetUserIdAndSecContext(self.0, self.1) };
        }
    }
    let mut previous = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: GetUserIdAndSecContext writes two locals; GetOuterUserId reads a global;
    // SetUserIdAndSecContext sets two globals. None raises an ERROR.
    let _restore = unsafe {
        pg_sys::GetUserIdAndSecContext(&mut previous, &mut context);
        let to = user.unwrap_or_else(|| pg_sys::GetOuterUserId());
        pg_sys::SetUserIdAndSecContext(to, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
        Restore(previous, context)
    };
    f()
}

/// The claim table's shard placements on this node, as qualified names: what a prune of
/// this node deletes from. (Not joined with pg_class: Citus hides shards from its scans.) Empty on a node that holds none (the coordinator, usually).
pub(crate) fn local_shards() -> Vec<(pg_sys::Oid, String)> {
    Spi::connect(|c| {
        let rows = c.select(
            "SELECT x.rel::pg_catalog.oid, x.name \
               FROM pg_catalog.pg_dist_shard AS s \
               JOIN pg_catalog.pg_dist_placement AS pl ON pl.shardid OPERATOR(pg_catalog.=) s.shardid \
              CROSS JOIN LATERAL (SELECT pg_catalog.format('dedup.%I', pg_catalog.concat('processed_', s.shardid))) AS n(name) \
              CROSS JOIN LATERAL (SELECT pg_catalog.to_regclass(n.name), n.name) AS x(rel, name) \
              WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1 \
                AND pl.groupid OPERATOR(pg_catalog.=) (SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g) \
                AND x.rel IS NOT NULL \
              ORDER BY s.shardid",
            None,
            &[DatumWithOid::from(processed_oid())],
        )?;
        let mut shards = Vec::new();
        for row in rows {
            if let (Some(oid), Some(name)) = (row.get::<pg_sys::Oid>(1)?, row.get::<String>(2)?) {
                shards.push((oid, name));
            }
        }
        Ok::<_, pgrx::spi::Error>(shards)
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: listing the claim table's shards failed: {e}"))
}

/// `dedup._written_here(rel, row)`: whether the row at `row` of `rel` (a table of dedup's
/// schema) was written by this transaction, a subtransaction of it included. The policy
/// `claims_update` that `dedup.distribute()` puts on `dedup.processed` asks it, so that a
/// consumer's `UPDATE (result)` (set_result's, run as the caller on Citus) reaches only
/// the claims its own transaction made (citus::consumer_grant_is_what_its_own_claims_need).
/// It reads the tuple's header, not the `xmin` column: a row frozen an epoch ago keeps its
/// 32-bit xmin, which can be this transaction's again, but is marked committed.
#[pg_extern(name = "_written_here", stable, strict, parallel_safe)]
pub(crate) fn written_here(rel: pg_sys::Oid, row: pg_sys::ItemPointerData) -> bool {
    // SAFETY: inside the calling statement's transaction, under pgrx's guard (every call
    // below raises an ERROR, never returns garbage, for a catalog or buffer failure).
    // try_relation_open returns NULL for a relation that is gone; the relation is closed
    // before returning. heap_fetch with SnapshotAny (not an MVCC snapshot, so no predicate
    // lock or serialization check) returns false, with no pin, for a line pointer that is
    // not a normal tuple; on true it leaves `buf` pinned and `tuple.t_data` pointing into
    // it, read under the buffer's share lock and released before the pin.
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
        if nsp == pg_sys::InvalidOid || pg_sys::get_rel_namespace(rel) != nsp {
            return false;
        }
        let relation = pg_sys::try_relation_open(rel, pg_sys::AccessShareLock as _);
        if relation.is_null() {
            return false;
        }
        let form = (*relation).rd_rel;
        let mut mine = false;
        // A block past the table's end would be an ERROR from the read: not a row of ours.
        let block = (u32::from(row.ip_blkid.bi_hi) << 16) | u32::from(row.ip_blkid.bi_lo);
        if (*form).relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char
            && (*form).relam == pg_sys::HEAP_TABLE_AM_OID
            && block
                < pg_sys::RelationGetNumberOfBlocksInFork(
                    relation,
                    pg_sys::ForkNumber::MAIN_FORKNUM,
                )
        {
            let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
            tuple.t_self = row;
            let mut buf: pg_sys::Buffer = pg_sys::InvalidBuffer as _;
            if pg_sys::heap_fetch(
                relation,
                std::ptr::addr_of_mut!(pg_sys::SnapshotAnyData),
                &mut tuple,
                &mut buf,
                false,
            ) {
                pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_SHARE as _);
                let header = tuple.t_data;
                let hinted = (*header).t_infomask as u32
                    & (pg_sys::HEAP_XMIN_COMMITTED | pg_sys::HEAP_XMIN_INVALID)
                    != 0;
                // The raw xmin: a frozen row is hinted (both bits), and so refused above.
                let xmin = (*header).t_choice.t_heap.t_xmin;
                pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_UNLOCK as _);
                pg_sys::ReleaseBuffer(buf);
                mine = !hinted && pg_sys::TransactionIdIsCurrentTransactionId(xmin);
            }
        }
        pg_sys::relation_close(relation, pg_sys::AccessShareLock as _);
        mine
    }
}
