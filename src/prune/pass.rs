//! The pass: the claim tables it sweeps, its batches (a block range read, its expired claims
//! deleted by TID), its transactions, and the prune lock.
use super::forgotten::prune_forgotten;
use super::horizons::{mark_horizon, timestamp, Cutoffs};
use super::{BLOCKS_PER_BATCH, FUNC};
use crate::{citus, claim, guc};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The lock that keeps two prunes of one database apart: an advisory lock tag (database,
/// 'dedu', 1) whose fourth field is 3. `pg_advisory_lock` and its kin only ever make tags
/// with 1 (one bigint key) or 2 (two integer keys) there, so no SQL can take this lock or
/// wait for it: only the worker and `dedup.prune()` (whose callers are privileged) do.
/// `pg_locks` shows it as `advisory` with classid 1684366453, objid 1, objsubid 3.
fn lock_tag() -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once the backend is connected, before any caller.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field2: 0x6465_6475,
        locktag_field3: 1,
        locktag_field4: 3,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        // The user lock method, as every advisory lock: a session lock of it is released
        // when its session ends (ShutdownPostgres), a transaction lock at the end of the
        // transaction; a session lock of the default method would outlive the worker.
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// The worker's try for the prune lock, held for the session (until the worker exits).
pub fn try_lock_for_session() -> bool {
    let tag = lock_tag();
    // SAFETY: LockAcquire with dontWait raises no error for a lock it cannot get; it can
    // raise one for an out-of-memory lock table, which the caller's PgTry (in_transaction)
    // catches. The tag is copied by the lock manager.
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, true, true)
            != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
    }
}

/// `dedup.prune()`'s wait for the prune lock, held until the caller's transaction ends.
/// Waits as any lock does: `lock_timeout`, deadlock detection, cancellation.
pub(super) fn lock_for_transaction() {
    let tag = lock_tag();
    // SAFETY: a wait for a heavyweight lock, inside the caller's transaction (its resource
    // owner holds the lock); errors (timeout, deadlock, cancel) are raised through pgrx's
    // guard on the frame of the #[pg_extern] dedup.prune(), our only caller. The tag is a
    // local the lock manager copies (into its local and shared lock tables).
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, false);
    }
}

/// What a pass did.
#[derive(Default)]
pub struct Pass {
    pub deleted: i64,
    pub per_scope: BTreeMap<String, i64>,
    pub elapsed: Duration,
    /// Where a pass that `stop` ended early stopped: the target's name and the first block
    /// of the range it had not finished (the worker's next visit goes on from there).
    pub stopped_at: Option<(String, u32)>,
}

/// Who runs the batches' transactions.
pub enum Transactions<'a> {
    /// All batches run in the caller's transaction (`dedup.prune()`).
    Caller,
    /// Each batch is a transaction of its own, started and committed here (the worker);
    /// `pause` is called after each batch that deleted claims, and `stop` is asked before
    /// each batch whether to stop early.
    PerBatch {
        stop: &'a dyn Fn() -> bool,
        pause: &'a dyn Fn(),
    },
}

/// What a pass deletes from: `dedup.processed`, or on Citus each of its shard placements
/// on this node (the distributed table's own local relation is an empty shell there).
pub struct Target {
    /// None: `dedup.processed`, found by name (claim::open_processed).
    relid: Option<pg_sys::Oid>,
    /// The qualified name, for the DELETE.
    name: String,
}

/// The relations a pass of this node prunes (inside a transaction).
fn targets() -> Vec<Target> {
    if citus::routes_claims() {
        citus::local_shards()
            .into_iter()
            .map(|(oid, name)| Target {
                relid: Some(oid),
                name,
            })
            .collect()
    } else {
        vec![Target {
            relid: None,
            name: "dedup.processed".to_string(),
        }]
    }
}

/// Open `target` with RowExclusiveLock; None for a shard that is gone (moved away since
/// the pass listed it).
///
/// # Safety
///
/// As claim::open_processed: in a transaction, under pgrx's guard; the caller closes the
/// relation returned.
unsafe fn open_target(target: &Target) -> Option<pg_sys::Relation> {
    let Some(relid) = target.relid else {
        return Some(claim::open_processed());
    };
    // SAFETY: try_table_open returns NULL, holding no lock, for a relation that no longer
    // exists; rd_rel is read at once; the name checks keep us to dedup's shard placements
    // (a later relation with the recycled OID is closed again and skipped).
    let rel = pg_sys::try_table_open(relid, pg_sys::RowExclusiveLock as _);
    if rel.is_null() {
        return None;
    }
    let form = (*rel).rd_rel;
    let name = std::ffi::CStr::from_ptr((*form).relname.data.as_ptr());
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    if (*form).relnamespace != nsp || !name.to_bytes().starts_with(b"processed_") {
        pg_sys::table_close(rel, pg_sys::RowExclusiveLock as _);
        return None;
    }
    Some(rel)
}

/// The target's size in blocks now (0 when it is gone).
fn table_blocks(target: &Target) -> u32 {
    // SAFETY: called inside a transaction, under pgrx's guard (the #[pg_extern]
    // dedup.prune(), or in_transaction's PgTry in the worker), as open_target and
    // check_layout require; their ERRORs and RelationGetNumberOfBlocksInFork's (an smgr
    // I/O error) unwind to that guard. `rel` is open from open_target to table_close;
    // NoLock keeps the RowExclusiveLock until the transaction ends.
    unsafe {
        let Some(rel) = open_target(target) else {
            return 0;
        };
        claim::check_layout(rel, FUNC);
        let n = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        n
    }
}

/// Collect the TIDs of at most `limit` expired claims in blocks `[start, start + count)`
/// that come after `after` (a full batch's last TID, None from the range's start), and the
/// claim table's layout. The range is cut to the table's size now: VACUUM may have
/// truncated it since the pass began (None: the range starts past the end).
///
/// # Safety
///
/// Call inside a transaction, on the backend's main thread, under pgrx's guard (the
/// #[pg_extern] dedup.prune(), or in_transaction's PgTry): ERRORs of the calls below (the
/// lock wait in open_processed, I/O while scanning, out of memory) and the Rust panics of
/// check_layout and `expect` unwind to it, and the abort then releases what this function
/// did not (the relation reference, the scan's buffer pins and the registered snapshot,
/// through the resource owner).
///
/// Long because the scan it makes (the open relation, the registered snapshot, the
/// bulk-read scan, the slot) is made and torn down here, around the loop that reads it, each
/// step with the contract that makes it sound.
unsafe fn expired_in_range(
    target: &Target,
    start: u32,
    count: u32,
    after: Option<pg_sys::ItemPointerData>,
    scope: Option<&str>,
    cutoffs: &Cutoffs,
    limit: usize,
) -> Option<(Vec<pg_sys::ItemPointerData>, claim::Layout)> {
    // SAFETY: `rel` is open (RowExclusiveLock) from open_target until one of the
    // table_close calls below; check_layout verified it is a heap table, which
    // heap_setscanlimits below requires (it casts the scan to a HeapScanDesc).
    let rel = open_target(target)?;
    let layout = claim::check_layout(rel, FUNC);
    let blocks = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
    if start >= blocks {
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        return None;
    }
    let end = start + count.min(blocks - start);
    // A batch after a full one goes on after its last TID, in that TID's block: the rows
    // before it were collected already (and may be locked, so not deleted:
    // retention::claims_locked_by_another_role_do_not_stop_a_prune), and every batch moves
    // forward, so a pass ends.
    let after = after.map(pgrx::itemptr::item_pointer_get_both);
    let from = after.map_or(start, |(block, _)| block);
    if from >= end {
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        return Some((Vec::new(), layout));
    }
    let leases = layout == claim::Layout::Leases;
    // SAFETY: RegisterSnapshot copies the transaction snapshot (if it is the static one)
    // and registers it with CurrentResourceOwner, so it stays valid until the
    // UnregisterSnapshot below, whatever GetTransactionSnapshot is called for meanwhile.
    // The scan (allocated in CurrentMemoryContext) uses it until table_endscan;
    // heap_setscanlimits is called before the first fetch, as it must be; the slot is a
    // standalone slot in CurrentMemoryContext, valid until ExecDropSingleTupleTableSlot.
    let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
    // allow_strat: a bulk-read ring when the table is larger than a quarter of
    // shared_buffers; allow_sync: no, we scan a fixed range.
    let scan = pg_sys::table_beginscan_strat(rel, snapshot, 0, std::ptr::null_mut(), true, false);
    pg_sys::heap_setscanlimits(scan, from, end - from);
    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    let mut tids = Vec::new();
    // SAFETY (the loop): each table_scan_getnextslot stores the next visible tuple in the
    // slot with its buffer pinned, until the next fetch. slot_getattr deforms it: the
    // attribute numbers exist in both layouts (LEASE_EXPIRES_AT read only for Leases);
    // processed_at and lease_expires_at are by-value timestamps; the scope &str borrows the
    // pinned page (or a detoasted copy in CurrentMemoryContext) and is dropped before the
    // next fetch. tts_tid is a plain copy.
    while tids.len() < limit
        && pg_sys::table_scan_getnextslot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot)
    {
        if after.is_some_and(|a| pgrx::itemptr::item_pointer_get_both((*slot).tts_tid) <= a) {
            continue;
        }
        let mut isnull = false;
        let at = pg_sys::slot_getattr(slot, claim::PROCESSED_AT, &mut isnull).value() as i64;
        let row_scope =
            <&str>::from_datum(pg_sys::slot_getattr(slot, claim::SCOPE, &mut isnull), false)
                .expect("scope is NOT NULL");
        let cutoff = cutoffs.of(row_scope);
        // A claim's xmin is checked against its retention's horizon by the DELETE.
        if scope.is_some_and(|s| s != row_scope) || at >= cutoff.at || cutoff.blocked() {
            continue;
        }
        // A lease still running is never pruned, however old its claim.
        if leases {
            let until = pg_sys::slot_getattr(slot, claim::LEASE_EXPIRES_AT, &mut isnull);
            if !isnull && until.value() as i64 >= cutoffs.now {
                continue;
            }
        }
        tids.push((*slot).tts_tid);
    }
    // SAFETY: teardown of what was made above, each still valid and used no more: the slot
    // (releasing its pin), the scan, the snapshot registration, and the relcache reference
    // (NoLock: the RowExclusiveLock stays until the transaction ends).
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::table_endscan(scan);
    pg_sys::UnregisterSnapshot(snapshot);
    pg_sys::table_close(rel, pg_sys::NoLock as _);
    Some((tids, layout))
}

/// Delete the claims at `tids` that are still expired; count them per scope.
///
/// A row another transaction has locked (a lease being taken over, extended or completed
/// in a transaction still open) is skipped, not waited for: the next pass gets it, and no
/// open transaction anywhere holds up a pass (worker::no_role_can_stop_pruning).
fn delete_expired(
    target: &Target,
    tids: Vec<pg_sys::ItemPointerData>,
    layout: claim::Layout,
    horizons: bool,
    per_scope: &mut BTreeMap<String, i64>,
) -> i64 {
    // A lease still running is never pruned (the lease columns exist from 0.3.0 on).
    let leases = match layout {
        claim::Layout::Claims => "",
        claim::Layout::Leases => {
            "AND (p.lease_expires_at IS NULL \
                  OR p.lease_expires_at OPERATOR(pg_catalog.<) pg_catalog.now())"
        }
    };
    // The age is checked again at DELETE time, against the retentions in force then, read
    // again just before it and passed in (a Citus shard placement cannot join
    // dedup.scope_retention, a reference table). A claim is deleted only if it is older
    // than its cutoff and, when its retention has a horizon, its row's xmin is older than
    // the horizon: it was visible a whole retention ago, so a claim whose transaction lasted
    // longer than its retention is still kept that long from its commit
    // (retention::a_claim_is_kept_its_retention_from_commit). The ages of both are taken
    // from the same transaction ID, so the comparison is exact for rows less than two
    // billion transactions old; an older row's age comes out negative (its 32-bit
    // xmin looks ahead of the counter), and it is older than any horizon.
    let cutoffs = Cutoffs::load(horizons);
    let query = format!(
        "WITH c AS ( \
             SELECT * FROM ROWS FROM (pg_catalog.unnest($3::pg_catalog.text[]), \
                                      pg_catalog.unnest($4::pg_catalog.timestamptz[]), \
                                      pg_catalog.unnest($5::pg_catalog.text[])) AS c(scope, cutoff, horizon)), \
         expired AS ( \
             SELECT p.ctid FROM {table} AS p \
               LEFT JOIN c ON c.scope OPERATOR(pg_catalog.=) p.scope \
              CROSS JOIN LATERAL ( \
                    SELECT CASE WHEN c.scope IS NULL THEN $2::pg_catalog.timestamptz ELSE c.cutoff END AS cutoff, \
                           CASE WHEN c.scope IS NULL THEN $6::pg_catalog.text ELSE c.horizon END::pg_catalog.xid AS horizon \
                    ) AS l \
              WHERE p.ctid OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.tid[]) \
                AND p.processed_at OPERATOR(pg_catalog.<) l.cutoff \
                AND (l.horizon IS NULL \
                     OR pg_catalog.age(p.xmin) OPERATOR(pg_catalog.>) pg_catalog.age(l.horizon) \
                     OR pg_catalog.age(p.xmin) OPERATOR(pg_catalog.<) 0) \
                {leases} \
              FOR UPDATE OF p SKIP LOCKED) \
         DELETE FROM {table} AS p \
          WHERE p.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT e.ctid FROM expired AS e)) \
         RETURNING p.scope, p.job_id, p.processed_at",
        table = target.name
    );
    let (scopes, ats, scope_horizons) = cutoffs.arrays();
    let args = vec![
        DatumWithOid::from(tids),
        DatumWithOid::from(timestamp(cutoffs.global.at)),
        DatumWithOid::from(scopes),
        DatumWithOid::from(ats),
        DatumWithOid::from(scope_horizons),
        DatumWithOid::from(cutoffs.global.horizon.clone()),
    ];
    Spi::connect_mut(|c| {
        if target.relid.is_some() {
            // A shard placement: Citus refuses changes made to it by name unless told.
            c.update(
                "SELECT pg_catalog.set_config('citus.enable_manual_changes_to_shards', 'on', true)",
                None,
                &[],
            )?;
        }
        let rows = with_tid_plans(|| c.update(query.as_str(), None, &args))?;
        let mut n = 0;
        // What was pruned, for the summaries that count copies arriving after their claim
        // expired (src/expired/): not a shard placement's claims, which are claimed through
        // Citus and not checked.
        let mut pruned = Vec::new();
        let remembering = target.relid.is_none() && crate::expired::enabled();
        for row in rows {
            let scope: String = row.get(1)?.unwrap_or_default();
            if remembering {
                let job_id: String = row.get(2)?.unwrap_or_default();
                let at = row
                    .get::<pgrx::datum::TimestampWithTimeZone>(3)?
                    .map_or(0, pg_sys::TimestampTz::from);
                // It expired when it became older than its scope's retention.
                let expiry = at + (cutoffs.now - cutoffs.of(&scope).at);
                pruned.push((scope.clone(), job_id, expiry));
            }
            *per_scope.entry(scope).or_default() += 1;
            n += 1;
        }
        if remembering {
            let _ = crate::expired::remember(&pruned, cutoffs.longest_retention());
        }
        Ok::<_, pgrx::spi::Error>(n)
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: deleting expired claims failed: {e}"))
}

/// Run `f` (one batch's DELETE) with the planner held to TID scans: `enable_seqscan` off and
/// `enable_tidscan` on for its duration, as a function's `SET` clause would set them (a GUC
/// nest level, undone after `f`, and by the abort of the (sub)transaction on an error).
/// The DELETE finds its rows by TID; on a small table, or with many TIDs, the planner
/// could otherwise read the whole table for every batch
/// (worker::a_database_owners_settings_do_not_change_a_pass counts the rows a pass reads).
fn with_tid_plans<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: NewGUCNestLevel only increments a counter; set_config_option with
    // GUC_ACTION_SAVE saves the old values at that level (the names and values are
    // 'static NUL-terminated strings it copies; both settings exist and accept them, so
    // no ERROR); AtEOXact_GUC(true, level) restores them, as fmgr does after a function
    // with SET clauses. An ERROR in `f` unwinds past the restore; the (sub)transaction's
    // abort then restores every setting saved at a deeper level.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for (name, value) in [(c"enable_seqscan", c"off"), (c"enable_tidscan", c"on")] {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let result = f();
        pg_sys::AtEOXact_GUC(true, level);
        result
    }
}

/// What a batch found.
enum Batch {
    /// It stopped at its row limit: the block range may hold more expired claims after
    /// the last one it collected (whether or not the DELETE could take them: a row another
    /// transaction has locked is left for the next pass).
    Full(pg_sys::ItemPointerData),
    /// It read the whole range.
    Done,
    /// The range starts past the table's end (VACUUM truncated it): the pass is over.
    PastTheEnd,
}

/// One batch, inside a transaction; adds what it deleted to `pass`.
#[allow(clippy::too_many_arguments)]
fn batch(
    target: &Target,
    start: u32,
    count: u32,
    after: Option<pg_sys::ItemPointerData>,
    scope: Option<&str>,
    limit: usize,
    horizons: bool,
    pass: &mut Pass,
) -> Batch {
    let cutoffs = Cutoffs::load(horizons);
    // SAFETY: inside a transaction with a snapshot (in_transaction, or the caller's); the
    // function's errors are raised through the guard of the #[pg_extern] or in_transaction.
    let Some((tids, layout)) =
        (unsafe { expired_in_range(target, start, count, after, scope, &cutoffs, limit) })
    else {
        return Batch::PastTheEnd;
    };
    let last = (tids.len() == limit).then(|| tids[limit - 1]);
    if !tids.is_empty() {
        pass.deleted += delete_expired(target, tids, layout, horizons, &mut pass.per_scope);
    }
    match last {
        Some(tid) => Batch::Full(tid),
        None => Batch::Done,
    }
}

/// Run `f` in a transaction of its own; on an error, abort the transaction and return the
/// error's message (the worker's way of carrying on after an error).
pub fn in_transaction<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    // SAFETY: called by the worker and the launcher outside any transaction, on their main
    // thread, from their #[pg_guard] main functions. StartTransactionCommand starts one;
    // PushActiveSnapshot copies the static transaction snapshot into TopTransactionContext
    // and keeps it active until PopActiveSnapshot below (or the abort). An ERROR here
    // (out of memory) is outside the PgTry below: it unwinds to the main function's
    // #[pg_guard], which raises it, ending the worker (proc_exit aborts the transaction).
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let f = std::panic::AssertUnwindSafe(f);
    let result = PgTryBuilder::new(move || Ok(f()))
        .catch_others(|e| {
            Err(match e {
                pg_sys::panic::CaughtError::PostgresError(r)
                | pg_sys::panic::CaughtError::ErrorReport(r)
                | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => {
                    r.message().to_string()
                }
            })
        })
        .execute();
    // SAFETY: on success, the snapshot pushed above is still the active one (f() leaves
    // the stack as it found it) and is popped before CommitTransactionCommand, which can
    // raise an ERROR (a deferred trigger or constraint, a WAL write failure) that,
    // outside the PgTry, unwinds to the main function's #[pg_guard] and ends the worker.
    // On an error, the PgTry has already turned it into Err (pgrx flushed PostgreSQL's
    // error state), and AbortCurrentTransaction releases everything f() held: locks,
    // buffer pins, relcache references, snapshots, LWLocks and the transaction's memory.
    unsafe {
        if result.is_ok() {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
    result
}

/// Sweep the claim table once, deleting expired claims of `scope` (all scopes when None),
/// at most `max_rows` (no limit when None).
///
/// Long because a pass's steps share its transaction handling (one, or one per batch):
/// the horizon, the tables to sweep, the batches over each block range, the forgotten rows.
pub fn run_pass(
    scope: Option<&str>,
    max_rows: Option<i64>,
    transactions: &Transactions,
    resume: Option<&(String, u32)>,
) -> Result<Pass, String> {
    let started = Instant::now();
    let mut pass = Pass::default();
    let batch_size = guc::PRUNE_BATCH_SIZE.get() as i64;
    let (targets, horizons) = match transactions {
        Transactions::Caller => (targets(), mark_horizon(scope)),
        Transactions::PerBatch { .. } => in_transaction(|| (targets(), mark_horizon(scope)))?,
    };
    // Going on from where an earlier pass stopped: the targets before its target are done
    // (a target that is gone since, a moved shard, means starting over).
    let skip = resume
        .and_then(|(name, _)| targets.iter().position(|t| &t.name == name))
        .unwrap_or(0);
    'targets: for (i, target) in targets.iter().enumerate().skip(skip) {
        let blocks = match transactions {
            Transactions::Caller => table_blocks(target),
            Transactions::PerBatch { .. } => in_transaction(|| table_blocks(target))?,
        };
        debug1!("dedup: pruning {} ({blocks} blocks)", target.name);
        let mut start = match resume {
            Some((name, block)) if i == skip && &target.name == name => *block,
            _ => 0,
        };
        // Where a full batch stopped in the range that starts at `start`.
        let mut after = None;
        while start < blocks {
            let limit = match max_rows {
                Some(max) if max - pass.deleted <= 0 => break 'targets,
                Some(max) => (max - pass.deleted).min(batch_size),
                None => batch_size,
            } as usize;
            let count = BLOCKS_PER_BATCH.min(blocks - start);
            let found = match transactions {
                Transactions::Caller => {
                    pg_sys::check_for_interrupts!();
                    batch(
                        target, start, count, after, scope, limit, horizons, &mut pass,
                    )
                }
                Transactions::PerBatch { stop, pause } => {
                    if stop() {
                        pass.elapsed = started.elapsed();
                        pass.stopped_at = Some((target.name.clone(), start));
                        return Ok(pass);
                    }
                    let before = pass.deleted;
                    let found = in_transaction(|| {
                        batch(
                            target, start, count, after, scope, limit, horizons, &mut pass,
                        )
                    })?;
                    if pass.deleted > before {
                        pause();
                    }
                    found
                }
            };
            match found {
                Batch::Full(last) => after = Some(last),
                Batch::Done => {
                    start += count;
                    after = None;
                }
                Batch::PastTheEnd => break,
            }
        }
    }
    // The audit rows of dedup.forget, once their scope's retention is over (not in a call
    // bounded by max_rows, which is about claims). In the worker a failure here is logged
    // and the pass, whose claims are pruned and committed, still counts.
    if max_rows.is_none() {
        match transactions {
            Transactions::Caller => {
                prune_forgotten(scope);
            }
            Transactions::PerBatch { .. } => {
                if let Err(e) = in_transaction(|| prune_forgotten(scope)) {
                    warning!("dedup: pruning dedup.forgotten failed: {e}");
                }
            }
        }
    }
    pass.elapsed = started.elapsed();
    Ok(pass)
}
