//! Batch consumers and partitioned logs: `dedup.try_claim_many` claims a batch of jobs in
//! one call; `dedup.advance` and `dedup.position` keep one position per partition of an
//! ordered log (sql/offsets.sql).
//!
//! A batch is claimed key by key through the claim path of `try_claim` (claim.rs), in one
//! canonical order (the keys' bytes, the order of the primary key), so two transactions
//! claiming overlapping batches wait for each other in the same order and never deadlock
//! each other: the first to reach a shared key holds it, the other waits there, holding
//! only keys that sort before it.
use crate::{citus, claim, error};
use pgrx::prelude::*;

const FUNC: &str = "dedup.try_claim_many";

/// The most job ids one call takes: the claims of a call are one transaction's, each
/// holding its key until the commit; larger batches belong in several calls.
pub const MAX_BATCH: usize = 10_000;

/// Claim the checked, canonical keys of `ids` (index in the input, key) in `scope`, each
/// with its fingerprint if `fingerprints` (parallel to the input) has one; the indices of
/// the jobs this call claimed and of those claimed before with another fingerprint, in
/// input order (an id repeated in the array is claimed once, at its first position; a
/// repetition with another fingerprint is a mismatch).
///
/// Long because the batch's steps share its checks and its one pass over the keys: check,
/// route, order, claim, then map the outcomes back to the input's order.
fn claim_many(
    ids: &[(usize, String)],
    scope: Option<&str>,
    fingerprints: Option<&[Option<String>]>,
) -> (Vec<usize>, Vec<usize>) {
    let scope = scope.unwrap_or_else(|| error::null_argument(FUNC, "scope"));
    claim::check_scope(FUNC, scope);
    if ids.is_empty() {
        return (Vec::new(), Vec::new());
    }
    claim::check_transaction(FUNC);
    let route = claim::claim_route(FUNC);
    crate::stats::count(scope, crate::stats::Event::Batch);
    let fp = |i: usize| fingerprints.and_then(|f| f[i].as_deref());
    // Canonical order (the keys' bytes), each key once, at the first position it appears at
    // (a stable sort keeps equal keys in input order).
    let mut keys: Vec<(&str, usize)> = ids.iter().map(|(i, k)| (k.as_str(), *i)).collect();
    keys.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut mismatched = Vec::new();
    // With fingerprints: each key is claimed with its first that is not NULL; a repetition
    // with another one is a mismatch.
    let mut first_fp: Vec<Option<&str>> = Vec::new();
    if fingerprints.is_some() {
        let mut run = 0;
        while run < keys.len() {
            let end = run
                + keys[run..]
                    .iter()
                    .take_while(|k| k.0 == keys[run].0)
                    .count();
            let mut with = None;
            for &(_, i) in &keys[run..end] {
                match (with, fp(i)) {
                    (_, None) => {}
                    (None, Some(f)) => with = Some(f),
                    (Some(w), Some(f)) if w != f => mismatched.push(i),
                    _ => {}
                }
            }
            first_fp.push(with);
            run = end;
        }
    }
    keys.dedup_by(|a, b| a.0 == b.0);
    let fp_of = |n: usize| first_fp.get(n).copied().flatten();
    let mut claimed = Vec::new();
    if route == citus::Route::Citus {
        for (n, &(key, i)) in keys.iter().enumerate() {
            match claim::claim_checked(FUNC, scope, key, fp_of(n), route) {
                claim::Outcome::Claimed => claimed.push(i),
                claim::Outcome::FingerprintMismatch => mismatched.push(i),
                _ => {}
            }
        }
    } else {
        // One executor state and one open table for the whole batch; the outcomes are
        // counted afterwards (counting may run SQL, which must not run while the claim
        // table is open).
        let mut previous = crate::stats::clock_if_counting();
        let mut outcomes = Vec::with_capacity(keys.len());
        let pairs: Vec<(&str, Option<&str>)> = keys
            .iter()
            .enumerate()
            .map(|(n, &(k, _))| (k, fp_of(n)))
            .collect();
        // SAFETY: insert_claims' contract (that of insert_claim): in a transaction that
        // may write (check_transaction refused a standby, a read-only transaction and
        // parallel mode), on the backend's main thread, under the pgrx guard of the
        // #[pg_extern] try_claim_many that called us.
        unsafe {
            claim::insert_claims(FUNC, scope, &pairs, true, None, |_, outcome| {
                // A key's claim began when the one before it ended: the wait of a busy key
                // is its own.
                let now = crate::stats::clock_if_counting();
                outcomes.push((outcome, previous, now));
                previous = now;
            });
        }
        crate::stats::count_probes(scope, crate::generations::take_probes());
        let mut claimed_keys = Vec::new();
        for ((outcome, started, ended), &(key, i)) in outcomes.into_iter().zip(&keys) {
            match outcome {
                // Counted together below.
                claim::Outcome::Claimed => {
                    claimed.push(i);
                    claimed_keys.push(key);
                    continue;
                }
                claim::Outcome::FingerprintMismatch => mismatched.push(i),
                _ => {}
            }
            claim::count_at(scope, &outcome, started, ended, Default::default());
        }
        if !claimed.is_empty() {
            let mut looked = crate::expired::Looked::default();
            if let Some(lookup) = crate::expired::Lookup::new(scope) {
                looked = lookup.find_all(&claimed_keys);
            }
            crate::stats::count(
                scope,
                crate::stats::Event::Claims {
                    n: claimed.len() as u64,
                    looked,
                },
            );
        }
    }
    claimed.sort_unstable();
    mismatched.sort_unstable();
    (claimed, mismatched)
}

/// Check an array's elements as job ids: not NULL (22004), not empty (22023), at most
/// 1024 bytes (22001), each error naming the element's position (1-based); at most
/// [`MAX_BATCH`] of them (54000).
fn checked_keys<T>(
    len: usize,
    ids: impl Iterator<Item = Option<T>>,
    key: impl Fn(&T) -> String,
) -> (Vec<T>, Vec<(usize, String)>) {
    if len > MAX_BATCH {
        error::batch_too_large(FUNC, len, MAX_BATCH);
    }
    let mut values = Vec::with_capacity(len);
    let mut keys = Vec::with_capacity(len);
    for (i, id) in ids.enumerate() {
        let arg = || format!("job_ids[{}]", i + 1);
        let Some(id) = id else {
            error::null_argument(FUNC, &arg());
        };
        let k = key(&id);
        error::check_length(FUNC, arg, &k, error::MAX_JOB_ID_BYTES);
        keys.push((i, k));
        values.push(id);
    }
    (values, keys)
}

/// `dedup.try_claim_many(job_ids text[], scope)`: the job ids this call claimed, in the
/// order of the array, each once. SETOF, so that it composes in SQL: `SELECT ... FROM
/// jobs WHERE id IN (SELECT dedup.try_claim_many($1))`, `INSERT ... SELECT`, or `=
/// ANY(ARRAY(...))`.
#[pg_extern(name = "try_claim_many", volatile, parallel_unsafe)]
fn try_claim_many_text(
    job_ids: Option<Array<&str>>,
    scope: default!(Option<&str>, "'default'"),
) -> SetOfIterator<'static, String> {
    let job_ids = job_ids.unwrap_or_else(|| error::null_argument(FUNC, "job_ids"));
    let (values, keys) = checked_keys(job_ids.len(), job_ids.iter(), |s: &&str| s.to_string());
    let (claimed, _) = claim_many(&keys, scope, None);
    SetOfIterator::new(
        claimed
            .into_iter()
            .map(move |i| values[i].to_string())
            .collect::<Vec<_>>(),
    )
}

/// The same for bigint job ids (each the job of its decimal text, as `try_claim(bigint)`).
#[pg_extern(name = "try_claim_many", volatile, parallel_unsafe)]
fn try_claim_many_bigint(
    job_ids: Option<Array<i64>>,
    scope: default!(Option<&str>, "'default'"),
) -> SetOfIterator<'static, i64> {
    let job_ids = job_ids.unwrap_or_else(|| error::null_argument(FUNC, "job_ids"));
    let (values, keys) = checked_keys(job_ids.len(), job_ids.iter(), |n: &i64| n.to_string());
    let (claimed, _) = claim_many(&keys, scope, None);
    SetOfIterator::new(claimed.into_iter().map(|i| values[i]).collect::<Vec<_>>())
}

/// The same for uuid job ids (each the job of its canonical text, as `try_claim(uuid)`).
#[pg_extern(name = "try_claim_many", volatile, parallel_unsafe)]
fn try_claim_many_uuid(
    job_ids: Option<Array<pgrx::Uuid>>,
    scope: default!(Option<&str>, "'default'"),
) -> SetOfIterator<'static, pgrx::Uuid> {
    let job_ids = job_ids.unwrap_or_else(|| error::null_argument(FUNC, "job_ids"));
    let (values, keys) = checked_keys(job_ids.len(), job_ids.iter(), |u: &pgrx::Uuid| {
        u.to_string()
    });
    let (claimed, _) = claim_many(&keys, scope, None);
    SetOfIterator::new(claimed.into_iter().map(|i| values[i]).collect::<Vec<_>>())
}

/// `dedup._try_claim_many_fp(job_ids, scope, fingerprints)`: the batch behind
/// `dedup.try_claim_many(job_ids, scope, fingerprints)`, each job with the fingerprint at
/// its position (NULL: none). The ids claimed, and the ids claimed before (or repeated in
/// the array) with another fingerprint (`mismatch`), in array order. The PL/pgSQL wrapper
/// raises YD001 for a mismatch before it returns any row (pgrx cannot raise dedup's own
/// SQLSTATEs: it would make them XX000).
#[pg_extern(name = "_try_claim_many_fp", volatile, parallel_unsafe)]
pub(crate) fn try_claim_many_fingerprint(
    job_ids: Option<Array<&str>>,
    scope: Option<&str>,
    fingerprints: Option<Array<&str>>,
) -> TableIterator<'static, (name!(job_id, String), name!(mismatch, bool))> {
    let job_ids = job_ids.unwrap_or_else(|| error::null_argument(FUNC, "job_ids"));
    let fingerprints = fingerprints.unwrap_or_else(|| error::null_argument(FUNC, "fingerprints"));
    if fingerprints.len() != job_ids.len() {
        error::lengths_differ(FUNC, job_ids.len(), fingerprints.len());
    }
    let (values, keys) = checked_keys(job_ids.len(), job_ids.iter(), |s: &&str| s.to_string());
    let fps: Vec<Option<String>> = fingerprints
        .iter()
        .enumerate()
        .map(|(i, fp)| {
            fp.map(|fp| {
                let arg = || format!("fingerprints[{}]", i + 1);
                error::check_length(FUNC, arg, fp, error::MAX_FINGERPRINT_BYTES);
                fp.to_string()
            })
        })
        .collect();
    let (claimed, mismatched) = claim_many(&keys, scope, Some(&fps));
    let mut rows: Vec<(usize, bool)> = claimed
        .into_iter()
        .map(|i| (i, false))
        .chain(mismatched.into_iter().map(|i| (i, true)))
        .collect();
    rows.sort_unstable();
    TableIterator::new(
        rows.into_iter()
            .map(move |(i, m)| (values[i].to_string(), m))
            .collect::<Vec<_>>(),
    )
}

/// `dedup._check_offset(func, stream, partition, position)`: the checks of
/// `dedup.advance` and `dedup.position`, with errors that name `func`.
#[pg_extern(name = "_check_offset", volatile, parallel_safe)]
pub(crate) fn check_offset(
    func: Option<&str>,
    stream: Option<&str>,
    partition: Option<i32>,
    position: Option<i64>,
) {
    let func = func.unwrap_or_else(|| error::null_argument("dedup._check_offset", "func"));
    let stream = stream.unwrap_or_else(|| error::null_argument(func, "stream"));
    let partition = partition.unwrap_or_else(|| error::null_argument(func, "partition"));
    let position = position.unwrap_or_else(|| error::null_argument(func, "position"));
    error::check_length(func, || "stream", stream, error::MAX_SCOPE_BYTES);
    if partition < 0 {
        error::negative(func, "partition", i64::from(partition));
    }
    if position < 0 {
        error::negative(func, "position", position);
    }
    if func == "dedup.advance" {
        claim::check_writable(func);
    }
    // dedup.offsets is a table of each node: on Citus the positions live on the
    // coordinator (a worker's would be seen by no other node).
    if crate::citus::on_worker() {
        error::offsets_on_worker(func);
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.text[], pg_catalog.text) IS
'Claim a batch of jobs for the current transaction: the ids claimed now (each once, in array order); the others were done or claimed before. Claims in key order, so overlapping batches never deadlock each other. At most 10000 ids.';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.int8[], pg_catalog.text) IS
'dedup.try_claim_many for bigint job ids (the same jobs as their decimal text).';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.uuid[], pg_catalog.text) IS
'dedup.try_claim_many for uuid job ids (the same jobs as their canonical text).';
"#,
    name = "try_claim_many_comments",
    requires = [
        try_claim_many_text,
        try_claim_many_bigint,
        try_claim_many_uuid
    ]
);
