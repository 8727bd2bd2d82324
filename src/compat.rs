//! The calls whose signatures differ between the PostgreSQL majors dedup supports (15, 16,
//! 17, 18), each written from that major's own headers (`include/server` of its tree) and
//! compiled and tested on it by `make test` (one `cfg` branch per difference, none left
//! untested). Everything else dedup calls has the same signature on every supported major.
use pgrx::pg_sys;

/// ExecCheckIndexConstraints: 18 added `tupleid` (the TID of a tuple already inserted,
/// to skip itself: WITHOUT OVERLAPS); before an insertion there is none, and an invalid
/// TID is what 15 to 17 passed internally (`invalidItemPtr` in execIndexing.c).
///
/// # Safety
///
/// `rri` is a live ResultRelInfo with its indexes open (ExecOpenIndices, speculative),
/// `slot` holds the row to insert, `estate` is the executor state whose es_query_cxt they
/// live in, `arbiters` a list of index OIDs of `rri`'s relation. Call under pgrx's guard, in
/// the transaction: the check can wait for a concurrent inserter of the same key (lock
/// waits raise ERRORs on deadlock, lock_timeout or cancel), caught at the pg_sys call.
pub(crate) unsafe fn check_index_constraints(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    conflict_tid: &mut pg_sys::ItemPointerData,
    arbiters: *mut pg_sys::List,
) -> bool {
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
    {
        // SAFETY: the contract above; conflict_tid is a valid &mut the check fills.
        pg_sys::ExecCheckIndexConstraints(rri, slot, estate, conflict_tid, arbiters)
    }
    #[cfg(feature = "pg18")]
    {
        // An all-zero ItemPointerData is invalid (offset 0): nothing to skip.
        let mut none = pg_sys::ItemPointerData::default();
        // SAFETY: the contract above; both TIDs are valid for the call, which only reads
        // `none` and fills conflict_tid.
        pg_sys::ExecCheckIndexConstraints(rri, slot, estate, conflict_tid, &mut none, arbiters)
    }
}

/// ExecInsertIndexTuples: 16 added `onlySummarizing` (false: every index, as an INSERT
/// updates them all).
///
/// # Safety
///
/// As for [`check_index_constraints`], with the heap tuple of `slot` already inserted
/// (speculatively) into `rri`'s relation. Index inserts raise ERRORs (a unique violation
/// in a non-arbiter index, out of disk) through pgrx's guard; a conflict in an arbiter
/// index sets `spec_conflict` instead. The list returned (indexes to recheck, usually NIL)
/// is palloc'd in CurrentMemoryContext, es_query_cxt in insert_claim.
pub(crate) unsafe fn insert_index_tuples(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    spec_conflict: &mut bool,
    arbiters: *mut pg_sys::List,
) -> *mut pg_sys::List {
    #[cfg(feature = "pg15")]
    {
        // SAFETY: the contract above (update = false, noDupErr = true: arbiter conflicts
        // are reported in spec_conflict, a valid &mut bool).
        pg_sys::ExecInsertIndexTuples(rri, slot, estate, false, true, spec_conflict, arbiters)
    }
    #[cfg(any(feature = "pg16", feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: the contract above (update = false, noDupErr = true, onlySummarizing =
        // false: arbiter conflicts are reported in spec_conflict, a valid &mut bool).
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
}

/// Attribute `i` (0-based) of a tuple descriptor. 18 moved the attributes behind an array
/// of CompactAttribute (TupleDescAttr() computes their address); 15 to 17 keep them in
/// `attrs`. No allocation: the claim path calls it for every column of every claim.
///
/// # Safety
///
/// `desc` is a live tuple descriptor (a relcache entry's `rd_att`, valid while the relation
/// is open) and `i < natts`; the reference borrows it and must not outlive it.
pub(crate) unsafe fn attribute<'a>(
    desc: pg_sys::TupleDesc,
    i: usize,
) -> &'a pg_sys::FormData_pg_attribute {
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
    {
        // SAFETY: `attrs` is a flexible array of natts entries, i < natts (the contract).
        &(*desc).attrs.as_slice(i + 1)[i]
    }
    #[cfg(feature = "pg18")]
    {
        // SAFETY: TupleDescAttr (a static inline of tupdesc.h, compiled into pgrx's shim)
        // only computes the address of attribute i inside `desc` (i < natts: the contract).
        &*pg_sys::TupleDescAttr(desc, i as std::ffi::c_int)
    }
}

/// The OID of the relation's primary key index (InvalidOid if none, or if it is
/// deferrable: a deferrable key could not decide a claim at once; the extension's is not).
/// Read from the relcache entry when its index list is valid, as RelationGetPrimaryKeyIndex
/// itself does, without a guarded call on the claim path; otherwise that function builds
/// the list. 17 added `rd_ispkdeferrable`, 18 the function's `deferrable_ok` (false here).
///
/// # Safety
///
/// `rel` is an open relation; under pgrx's guard (building the index list scans catalogs).
pub(crate) unsafe fn primary_key(rel: pg_sys::Relation) -> pg_sys::Oid {
    // SAFETY: `rel` is open (the contract): its relcache entry is valid, and rd_pkindex is
    // valid whenever rd_indexvalid is (rel.h).
    if (*rel).rd_indexvalid {
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        if (*rel).rd_ispkdeferrable {
            return pg_sys::InvalidOid;
        }
        return (*rel).rd_pkindex;
    }
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
    {
        // SAFETY: the contract above.
        pg_sys::RelationGetPrimaryKeyIndex(rel)
    }
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the contract above.
        pg_sys::RelationGetPrimaryKeyIndex(rel, false)
    }
}

/// index_beginscan: 18 added `instrument` (NULL: no EXPLAIN ANALYZE counts).
///
/// # Safety
///
/// `heap` and `index` are open (the index on the heap), `snapshot` lives until the scan's
/// index_endscan; under pgrx's guard, in a transaction.
pub(crate) unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
) -> pg_sys::IndexScanDesc {
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
    {
        // SAFETY: the contract above; no order-by keys.
        pg_sys::index_beginscan(heap, index, snapshot, nkeys, 0)
    }
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the contract above; no instrumentation, no order-by keys.
        pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), nkeys, 0)
    }
}
