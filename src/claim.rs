//! The claim path: `dedup.try_claim(job_id, scope)`.
use crate::{error, guc, stats};
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

fn check_key<'a>(scope: Option<&'a str>, job_id: &str) -> &'a str {
    let scope = scope.unwrap_or_else(|| error::null_argument(FUNC, "scope"));
    if job_id.is_empty() {
        error::empty_argument(FUNC, "job_id");
    }
    if job_id.len() > error::MAX_JOB_ID_BYTES {
        error::too_long(FUNC, "job_id", job_id.len(), error::MAX_JOB_ID_BYTES);
    }
    check_scope(FUNC, scope);
    scope
}

/// A scope is 1 to [`error::MAX_SCOPE_BYTES`] bytes.
pub(crate) fn check_scope(func: &str, scope: &str) {
    if scope.is_empty() {
        error::empty_argument(func, "scope");
    }
    if scope.len() > error::MAX_SCOPE_BYTES {
        error::too_long(func, "scope", scope.len(), error::MAX_SCOPE_BYTES);
    }
}

fn check_transaction() {
    check_writable(FUNC);
    unsafe {
        if !unguarded::IsTransactionBlock() && guc::WARN_OUTSIDE_TRANSACTION.get() {
            error::warn_outside_transaction(FUNC);
        }
    }
}

/// Refuse to write on a standby, in a read-only transaction or in parallel mode.
pub(crate) fn check_writable(func: &str) {
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
        Outcome::Duplicate | Outcome::Busy => Some(false),
        Outcome::FingerprintMismatch => None,
    }
}

/// What a claim found.
#[derive(PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    /// This transaction now holds the claim.
    Claimed,
    /// A claim exists (committed before this call looked, or taken earlier by this
    /// transaction).
    Duplicate,
    /// A claim exists that a concurrent transaction committed while this call waited for
    /// it (or after the call's snapshot): a copy that was in flight at the same time.
    Busy,
    /// A claim exists, made with another payload fingerprint.
    FingerprintMismatch,
}

/// A fingerprint is 1 to [`error::MAX_FINGERPRINT_BYTES`] bytes.
pub(crate) fn check_fingerprint(func: &str, fingerprint: &str) {
    if fingerprint.is_empty() {
        error::empty_argument(func, "fingerprint");
    }
    if fingerprint.len() > error::MAX_FINGERPRINT_BYTES {
        error::too_long(
            func,
            "fingerprint",
            fingerprint.len(),
            error::MAX_FINGERPRINT_BYTES,
        );
    }
}

fn claim(job_id: &str, scope: Option<&str>, fingerprint: Option<&str>) -> Outcome {
    let scope = check_key(scope, job_id);
    check_transaction();
    let outcome = unsafe { insert_claim(scope, job_id, fingerprint) };
    stats::count(
        scope,
        match outcome {
            Outcome::Claimed => stats::Event::Claim,
            Outcome::Duplicate => stats::Event::Duplicate,
            Outcome::Busy => stats::Event::Busy,
            Outcome::FingerprintMismatch => stats::Event::FingerprintMismatch,
        },
    );
    outcome
}

/// Insert the claim row the way `INSERT ... ON CONFLICT DO NOTHING` does, without the
/// planner and executor around it: check the unique index for a conflict (waiting for an
/// in-progress inserter), insert the heap tuple speculatively, insert the index entries and
/// confirm the tuple, or kill it and start over if a concurrent inserter won the race.
/// The same executor routines as nodeModifyTable.c's ExecInsert are used, so the locking,
/// waiting and isolation behaviour are those of the SQL statement.
///
/// Returns whether this call inserted the row, and if not, what it found.
unsafe fn insert_claim(scope: &str, job_id: &str, fingerprint: Option<&str>) -> Outcome {
    let rel = open_processed();
    let layout = check_layout(rel);
    if fingerprint.is_some() && layout == Layout::Claims {
        error::needs_update(FUNC, "a payload fingerprint", "0.3.0");
    }

    let estate = pg_sys::CreateExecutorState();
    let old_cxt = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);

    let rri = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
        .cast::<pg_sys::ResultRelInfo>();
    (*rri).type_ = pg_sys::NodeTag::T_ResultRelInfo;
    pg_sys::InitResultRelInfo(rri, rel, 1, std::ptr::null_mut(), 0);
    pg_sys::ExecOpenIndices(rri, true);

    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    pg_sys::ExecClearTuple(slot);
    let values = std::slice::from_raw_parts_mut((*slot).tts_values, layout.columns());
    let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, layout.columns());
    // scope, job_id, processed_at, fingerprint; no result, no lease.
    nulls.fill(true);
    values[0] = text_datum(scope);
    values[1] = text_datum(job_id);
    values[2] = pg_sys::Datum::from(unguarded::GetCurrentTransactionStartTimestamp());
    nulls[..3].fill(false);
    if let Some(fp) = fingerprint {
        values[3] = text_datum(fp);
        nulls[3] = false;
    }
    unguarded::ExecStoreVirtualTuple(slot);
    (*slot).tts_tableOid = (*rel).rd_id;

    // An empty arbiter list means "every unique index", as in ON CONFLICT DO NOTHING
    // without a target; the primary key is the table's only unique index.
    let arbiters: *mut pg_sys::List = std::ptr::null_mut();
    let inserted = loop {
        let mut conflict_tid = pg_sys::ItemPointerData::default();
        if !check_index_constraints(rri, slot, estate, &mut conflict_tid, arbiters) {
            // A committed (or our own) claim exists.
            break inspect_conflict(rel, layout, &mut conflict_tid, fingerprint);
        }
        let xid = pg_sys::GetCurrentTransactionId();
        let token = pg_sys::SpeculativeInsertionLockAcquire(xid);
        pg_sys::table_tuple_insert_speculative(
            rel,
            slot,
            pg_sys::GetCurrentCommandId(true),
            0,
            std::ptr::null_mut(),
            token,
        );
        let mut spec_conflict = false;
        let recheck = insert_index_tuples(rri, slot, estate, &mut spec_conflict, arbiters);
        pg_sys::table_tuple_complete_speculative(rel, slot, token, !spec_conflict);
        unguarded::SpeculativeInsertionLockRelease(xid);
        unguarded::list_free(recheck);
        if !spec_conflict {
            break Outcome::Claimed;
        }
        // A concurrent inserter got its index entry in first: look again (and wait for it).
        pg_sys::check_for_interrupts!();
    };

    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::ExecCloseIndices(rri);
    pg_sys::MemoryContextSwitchTo(old_cxt);
    pg_sys::FreeExecutorState(estate);
    pg_sys::table_close(rel, pg_sys::NoLock as _);
    inserted
}

/// Look at the claim that conflicts with ours.
///
/// At REPEATABLE READ and SERIALIZABLE, a conflicting claim our snapshot cannot see (a
/// concurrent transaction committed it after our snapshot was taken) is a serialization
/// failure, exactly as for INSERT ... ON CONFLICT DO NOTHING (ExecCheckTIDVisible). A lease
/// (dedup.lease) is not a claim `try_claim` can report on. Otherwise it is a duplicate,
/// unless both claims carry a payload fingerprint and they differ.
unsafe fn inspect_conflict(
    rel: pg_sys::Relation,
    layout: Layout,
    tid: &mut pg_sys::ItemPointerData,
    fingerprint: Option<&str>,
) -> Outcome {
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
                error::serialization_failure(FUNC);
            }
            in_flight = true;
        }
    }
    let duplicate = if in_flight {
        Outcome::Busy
    } else {
        Outcome::Duplicate
    };
    if layout == Layout::Claims {
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        return duplicate;
    }
    let mut isnull = false;
    pg_sys::slot_getattr(slot, LEASE_EXPIRES_AT, &mut isnull);
    if !isnull {
        error::leased(FUNC);
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

#[cfg(feature = "pg13")]
unsafe fn check_index_constraints(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    conflict_tid: &mut pg_sys::ItemPointerData,
    arbiters: *mut pg_sys::List,
) -> bool {
    (*estate).es_result_relation_info = rri;
    pg_sys::ExecCheckIndexConstraints(slot, estate, conflict_tid, arbiters)
}

#[cfg(not(feature = "pg13"))]
unsafe fn check_index_constraints(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    conflict_tid: &mut pg_sys::ItemPointerData,
    arbiters: *mut pg_sys::List,
) -> bool {
    pg_sys::ExecCheckIndexConstraints(rri, slot, estate, conflict_tid, arbiters)
}

#[cfg(feature = "pg13")]
unsafe fn insert_index_tuples(
    _rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    spec_conflict: &mut bool,
    arbiters: *mut pg_sys::List,
) -> *mut pg_sys::List {
    pg_sys::ExecInsertIndexTuples(slot, estate, true, spec_conflict, arbiters)
}

#[cfg(any(feature = "pg14", feature = "pg15"))]
unsafe fn insert_index_tuples(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    spec_conflict: &mut bool,
    arbiters: *mut pg_sys::List,
) -> *mut pg_sys::List {
    pg_sys::ExecInsertIndexTuples(rri, slot, estate, false, true, spec_conflict, arbiters)
}

#[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
unsafe fn insert_index_tuples(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    spec_conflict: &mut bool,
    arbiters: *mut pg_sys::List,
) -> *mut pg_sys::List {
    pg_sys::ExecInsertIndexTuples(
        rri,
        slot,
        estate,
        false,
        true,
        spec_conflict,
        arbiters,
        false,
    )
}

unsafe fn text_datum(s: &str) -> pg_sys::Datum {
    pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
        s.as_ptr().cast(),
        s.len() as i32,
    ))
}

/// The OIDs of the schema `dedup` and of `dedup.processed`, looked up once per backend.
static mut PROCESSED: (pg_sys::Oid, pg_sys::Oid) = (pg_sys::InvalidOid, pg_sys::InvalidOid);

/// Open `dedup.processed` with RowExclusiveLock.
///
/// The cached OID is checked, not trusted: after the lock is taken, the relation must still
/// exist and still be `processed` in the schema `dedup` (the extension may have been
/// dropped and created again since). A TRUNCATE, VACUUM or ANALYZE of the table changes
/// nothing here: the OID stays.
pub(crate) unsafe fn open_processed() -> pg_sys::Relation {
    let cached = std::ptr::addr_of_mut!(PROCESSED);
    for _ in 0..2 {
        if (*cached).1 == pg_sys::InvalidOid {
            *cached = lookup_processed();
        }
        let (nsp, relid) = *cached;
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

unsafe fn lookup_processed() -> (pg_sys::Oid, pg_sys::Oid) {
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    let relid = if nsp == pg_sys::InvalidOid {
        pg_sys::InvalidOid
    } else {
        pg_sys::get_relname_relid(c"processed".as_ptr(), nsp)
    };
    if relid == pg_sys::InvalidOid {
        error::table_missing();
    }
    (nsp, relid)
}

/// The claim row is written column by column: refuse a table whose columns are not the
/// ones some version of the extension made (altered by hand).
pub(crate) unsafe fn check_layout(rel: pg_sys::Relation) -> Layout {
    let desc = (*rel).rd_att;
    let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
    let prefix_ok = attrs
        .iter()
        .zip(COLUMNS)
        .all(|(a, oid)| !a.attisdropped && a.atttypid == oid);
    match attrs.len() {
        3 if prefix_ok => Layout::Claims,
        7 if prefix_ok => Layout::Leases,
        _ => error::unexpected_layout(FUNC),
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
    extern "C" {
        /// Reads `CurrentTransactionState->parallelModeLevel`.
        pub fn IsInParallelMode() -> bool;
        /// Reads `CurrentTransactionState->blockState`.
        pub fn IsTransactionBlock() -> bool;
        /// Returns `xactStartTimestamp`.
        pub fn GetCurrentTransactionStartTimestamp() -> pg_sys::TimestampTz;
        /// Sets the slot's flags (assertions only).
        pub fn ExecStoreVirtualTuple(
            slot: *mut pg_sys::TupleTableSlot,
        ) -> *mut pg_sys::TupleTableSlot;
        /// pfree of a list we built (NIL is fine).
        pub fn list_free(list: *mut pg_sys::List);
        /// LockRelease of our own speculative-insertion lock: a WARNING at most, never an
        /// ERROR.
        pub fn SpeculativeInsertionLockRelease(xid: pg_sys::TransactionId);
    }
}
