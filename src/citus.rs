//! Citus: `dedup.processed` distributed over the nodes of a cluster (0.6.0, issue 13).
//!
//! On plain PostgreSQL a claim is written by the executor's insertion routines, without a
//! statement (claim.rs). On Citus that row would land in the node's empty local shell of
//! the distributed table, unseen by the other nodes. So once `dedup.processed` is a Citus
//! table (`dedup.distribute()`), a claim is a statement Citus routes to the job's shard:
//! `INSERT ... ON CONFLICT DO NOTHING`, run as the caller, so it shares the caller's
//! connection to that shard with the job's effect (one-node commit when both are
//! colocated, Citus's two-phase commit otherwise). Pruning then deletes from the shard
//! placements on each node (prune.rs asks [`local_shards`]).
//!
//! On a server without Citus nothing here costs a claim more than one read of a cached
//! flag: [`routes_claims`] answers false without a lookup.
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

/// Whether Citus distributes `relid` (a hash-distributed or reference table).
fn is_citus_table(relid: pg_sys::Oid) -> bool {
    // SAFETY: as in processed_oid: a syscache lookup that returns InvalidOid when Citus's
    // catalog is absent (the citus extension is not created in this database).
    let catalog = unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_partition".as_ptr(),
            pg_sys::PG_CATALOG_NAMESPACE.into(),
        )
    };
    if catalog == pg_sys::InvalidOid {
        return false;
    }
    Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS d \
                         WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1)",
        &[DatumWithOid::from(relid)],
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// Whether claims must go through Citus: the library is loaded and `dedup.processed` is a
/// Citus table. Cached per backend until the table's relcache entry is invalidated.
pub(crate) fn routes_claims() -> bool {
    if !citus_loaded() {
        return false;
    }
    let relid = processed_oid();
    if relid == pg_sys::InvalidOid {
        return false;
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
        let cached = std::ptr::addr_of_mut!(DISTRIBUTED);
        if (*cached).0 != relid || (*cached).1 < 0 {
            let d = is_citus_table(relid);
            *cached = (relid, i8::from(d));
        }
        (*cached).1 == 1
    }
}

/// The statements of a routed claim, prepared once per backend (the plan cache re-plans
/// them when the table changes).
static mut PLANS: Option<(OwnedPreparedStatement, OwnedPreparedStatement)> = None;

const INSERT: &str = "INSERT INTO dedup.processed AS p (scope, job_id, fingerprint) \
                      VALUES ($1, $2, $3) ON CONFLICT (job_id, scope) DO NOTHING RETURNING true";
const INSPECT: &str = "SELECT p.fingerprint, p.lease_expires_at IS NOT NULL FROM dedup.processed AS p \
                       WHERE p.job_id OPERATOR(pg_catalog.=) $2 AND p.scope OPERATOR(pg_catalog.=) $1";

/// A claim through Citus: the INSERT is routed to the shard of `job_id` and run as the
/// caller (who needs the grants of the docs, "Scaling out with Citus"). Waiting and
/// isolation are those of `INSERT ... ON CONFLICT DO NOTHING` on the shard. A duplicate
/// that was in flight cannot be told from one committed earlier: both are duplicates.
pub(crate) fn claim(func: &str, scope: &str, job_id: &str, fingerprint: Option<&str>) -> Outcome {
    let args = [
        DatumWithOid::from(scope),
        DatumWithOid::from(job_id),
        DatumWithOid::from(fingerprint),
    ];
    let outcome = Spi::connect_mut(|c| {
        // SAFETY: PLANS is backend-local, main thread only; the plans are kept (SPI_keepplan)
        // and live for the backend.
        let plans = unsafe { &mut *std::ptr::addr_of_mut!(PLANS) };
        if plans.is_none() {
            let types = [pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID].map(pgrx::PgOid::from);
            let insert = c.prepare_mut(INSERT, &types)?.keep();
            let inspect = c.prepare(INSPECT, &types[..2])?.keep();
            *plans = Some((insert, inspect));
        }
        let (insert, inspect) = plans.as_ref().expect("prepared above");
        for _ in 0..3 {
            if !c.update(insert, None, &args)?.is_empty() {
                return Ok(Outcome::Claimed);
            }
            let found = c.select(inspect, None, &args[..2])?;
            if let Some(row) = found.into_iter().next() {
                let stored: Option<String> = row.get(1)?;
                let leased: bool = row.get(2)?.unwrap_or(false);
                if leased {
                    crate::error::leased(func);
                }
                return Ok(match (stored, fingerprint) {
                    (Some(s), Some(f)) if s != f => Outcome::FingerprintMismatch,
                    _ => Outcome::Duplicate,
                });
            }
            // The row that stopped our INSERT is gone (pruned, or a lease released in
            // between): try again.
        }
        Ok::<_, pgrx::spi::Error>(Outcome::Duplicate)
    })
    .unwrap_or_else(|e| pgrx::error!("{func}: the claim through Citus failed: {e}"));
    if outcome == Outcome::Claimed {
        remember_claim(scope, job_id);
    }
    outcome
}

/// The jobs this transaction claimed through Citus, for `dedup.set_result`: the row's xmin
/// says nothing on a shard of another node. Cleared at the end of every transaction.
static mut CLAIMED_HERE: Vec<(String, String)> = Vec::new();
static mut XACT_CALLBACK_REGISTERED: bool = false;

#[pg_guard]
unsafe extern "C-unwind" fn forget_claims(
    _event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    // SAFETY: main thread; every transaction event ends or prepares the transaction the
    // list belongs to, after which no set_result of it can run. (The Vec keeps its buffer:
    // no allocation or free happens in the callback.)
    (*std::ptr::addr_of_mut!(CLAIMED_HERE)).clear();
}

fn remember_claim(scope: &str, job_id: &str) {
    // SAFETY: backend-local statics, main thread only. RegisterXactCallback pallocs in
    // TopMemoryContext (out of memory raises through the caller's guard); once per backend.
    unsafe {
        if !XACT_CALLBACK_REGISTERED {
            pg_sys::RegisterXactCallback(Some(forget_claims), std::ptr::null_mut());
            XACT_CALLBACK_REGISTERED = true;
        }
        (*std::ptr::addr_of_mut!(CLAIMED_HERE)).push((scope.to_string(), job_id.to_string()));
    }
}

/// Whether this transaction claimed `job_id` in `scope` through Citus.
pub(crate) fn claimed_here(scope: &str, job_id: &str) -> bool {
    // SAFETY: backend-local, main thread only; a shared read.
    unsafe {
        (*std::ptr::addr_of!(CLAIMED_HERE))
            .iter()
            .any(|(s, j)| s == scope && j == job_id)
    }
}

/// Run `f` as the role that called the SECURITY DEFINER function we are in (the session's
/// current role), so that Citus opens, or reuses, that role's connections: the ones the
/// caller's claim and effect used. Only lowers privileges; the previous user and security
/// context come back afterwards (and at an abort, from the transaction's saved state).
pub(crate) fn as_caller<R>(f: impl FnOnce() -> R) -> R {
    let mut user = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: GetUserIdAndSecContext writes two locals; GetOuterUserId reads a global;
    // SetUserIdAndSecContext sets two globals. None raises an ERROR. On an ERROR in `f`,
    // (sub)transaction abort restores the user and context saved when it began.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            pg_sys::GetOuterUserId(),
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
    }
    let r = f();
    // SAFETY: as above.
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    r
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
