//! External effects: leases, stored results and payload fingerprints.
//!
//! The lease functions themselves are PL/pgSQL in `sql/leases.sql` (an `INSERT ... ON
//! CONFLICT DO UPDATE` takes a job or an expired lease over atomically, and PL/pgSQL can
//! raise dedup's own SQLSTATEs). This file holds what they share with `try_claim`: the
//! argument checks, and the result of a job claimed with `try_claim`.
use crate::{citus, claim, error};
use pgrx::datum::{DatumWithOid, JsonB};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// `dedup._check_claim(func, job_id, scope, fingerprint)`: the checks every claim and lease
/// makes, with errors that name `func` (the lease functions of 0.3.0 to 0.6.0 call it; those
/// of 0.7.0 call `dedup._lease_tables`, which makes the same checks first).
#[pg_extern(name = "_check_claim", volatile, parallel_unsafe)]
fn check_claim(
    func: Option<&str>,
    job_id: Option<&str>,
    scope: Option<&str>,
    fingerprint: Option<&str>,
) {
    let func = func.unwrap_or_else(|| error::null_argument("dedup._check_claim", "func"));
    check_args(func, job_id, scope, fingerprint);
    // Those lease functions read and write dedup.processed alone: held off from
    // use_generations() as _lease_tables holds them off, and refused where generations are
    // on (their SQL is older than the library: an ALTER EXTENSION UPDATE is due).
    // SAFETY: in this #[pg_extern] function's transaction, under its guard.
    if unsafe { crate::generations::lease_tables(func, scope.unwrap_or_default()) }.is_some() {
        error::needs_update(func, "a lease in a database that uses generations", "0.7.0");
    }
}

/// `dedup._claim_tables(func, job_id, scope)`: the checks of `dedup._check_claim`, then the
/// tables a claim of the job may be in, the current generation of the scope's series first
/// (each locked in share mode to the end of the transaction), or
/// `{dedup.processed}` where generations are not used: `dedup.forget`'s.
#[pg_extern(name = "_claim_tables", volatile, parallel_unsafe)]
fn claim_tables_sql(func: Option<&str>, job_id: Option<&str>, scope: Option<&str>) -> Vec<String> {
    let func = func.unwrap_or_else(|| error::null_argument("dedup._claim_tables", "func"));
    check_args(func, job_id, scope, None);
    claim_tables(func, scope.unwrap_or_default())
}

/// `dedup._lease_tables(func, job_id, scope, fingerprint)`: the checks of
/// `dedup._check_claim`, then the tables a lease function looks for the job in: NULL where
/// the database does not use generations (the function uses `dedup.processed`, and
/// `use_generations()` waits for this transaction), otherwise the current generation of the
/// scope's series and every sealing and sealed one (not another series' current one: a
/// claim of the scope is never there, `generations::List`), newest first, each locked to the end of the transaction: the first, the one claims go to, as a
/// claim locks it (`ROW EXCLUSIVE`, which the seal waits for), the others in share mode
/// (`generations::lease_tables`).
#[pg_extern(name = "_lease_tables", volatile, parallel_unsafe)]
fn lease_tables(
    func: Option<&str>,
    job_id: Option<&str>,
    scope: Option<&str>,
    fingerprint: Option<&str>,
) -> Option<Vec<String>> {
    let func = func.unwrap_or_else(|| error::null_argument("dedup._lease_tables", "func"));
    check_args(func, job_id, scope, fingerprint);
    // SAFETY: in this #[pg_extern] function's transaction, under its guard.
    unsafe { crate::generations::lease_tables(func, scope.unwrap_or_default()) }
}

/// `dedup._write_lease(func, job_id, scope, fingerprint, result, lease_id, lease_expires_at,
/// processed_at)`: a lease function's row for a job, in a database that uses generations,
/// inserted into the generation claims go to by the claim protocol (`try_claim`'s: unique
/// across every generation, waiting for a copy in flight in any of them): true; false when
/// a row of the job exists (in any generation, committed or this transaction's), which the
/// caller then finds and locks. A lease taken over, extended or completed in an older
/// generation is moved here: the caller deletes the old row first, in this transaction, so
/// a concurrent claimer that finds it waits for this one.
#[pg_extern(name = "_write_lease", volatile, parallel_unsafe)]
#[allow(clippy::too_many_arguments)]
fn write_lease(
    func: Option<&str>,
    job_id: Option<&str>,
    scope: Option<&str>,
    fingerprint: Option<&str>,
    result: Option<JsonB>,
    lease_id: Option<pgrx::Uuid>,
    lease_expires_at: Option<pgrx::datum::TimestampWithTimeZone>,
    processed_at: Option<pgrx::datum::TimestampWithTimeZone>,
) -> bool {
    let func = func.unwrap_or_else(|| error::null_argument("dedup._write_lease", "func"));
    check_args(func, job_id, scope, fingerprint);
    let (job_id, scope) = (job_id.unwrap_or_default(), scope.unwrap_or_default());
    // The datums are made in this call's memory context, which outlives insert_claims.
    let processed_at = processed_at
        .and_then(IntoDatum::into_datum)
        .unwrap_or_else(|| error::null_argument(func, "processed_at"));
    let row = claim::LeaseRow {
        processed_at,
        result: result.and_then(IntoDatum::into_datum),
        lease_id: lease_id.and_then(IntoDatum::into_datum),
        lease_expires_at: lease_expires_at.and_then(IntoDatum::into_datum),
    };
    let mut written = false;
    // SAFETY: insert_claims' contract: in a transaction that may write (check_args refused
    // a standby, a read-only transaction and parallel mode), on the backend's main thread,
    // under this #[pg_extern] function's guard; the row's datums live in this call's
    // memory context.
    unsafe {
        claim::insert_claims(
            func,
            scope,
            &[(job_id, fingerprint)],
            false,
            Some(row),
            |_, o| {
                written = o == claim::Outcome::Claimed;
            },
        );
    }
    // A lease moved here (taken over, extended or completed in an older generation) had its
    // old row deleted by this transaction, which the probe of that generation then does not
    // see: not a false positive of its summary. So a lease function counts only the probes
    // made for want of a summary.
    let probes = crate::generations::take_probes();
    crate::stats::count_probes(
        scope,
        crate::generations::Probes {
            false_positives: 0,
            ..probes
        },
    );
    written
}

/// The checks of [`check_claim`], `_lease_tables`, `_write_lease`, `set_result` and
/// `_claim_tables`.
fn check_args(func: &str, job_id: Option<&str>, scope: Option<&str>, fingerprint: Option<&str>) {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(func, "job_id"));
    error::check_length(func, || "job_id", job_id, error::MAX_JOB_ID_BYTES);
    let scope = scope.unwrap_or_else(|| error::null_argument(func, "scope"));
    claim::check_scope(func, scope);
    if let Some(fp) = fingerprint {
        claim::check_fingerprint(func, fp);
    }
    claim::check_writable(func);
    if citus::route() == citus::Route::WorkerLocal {
        error::worker_not_distributed(func);
    }
}

/// The tables a claim of `scope` may be in: each generation's (the current one of the
/// scope's series first, then the others, `generations::tables`; each opened and locked in
/// share mode to the end of the transaction, so none is dropped under the read), or
/// `dedup.processed` alone where generations are not used.
fn claim_tables(func: &str, scope: &str) -> Vec<String> {
    // SAFETY: called from #[pg_extern] functions, in their transaction, under their guard.
    unsafe { crate::generations::tables(func, scope, pg_sys::AccessShareLock as _) }
        .unwrap_or_else(|| vec!["dedup.processed".into()])
}

/// `dedup.set_result(job_id, result, scope)`: store the result of a job this transaction
/// claimed with `try_claim`, for `dedup.claim_result` to return to later copies.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn set_result(
    job_id: Option<&str>,
    result: Option<JsonB>,
    scope: default!(Option<&str>, "'default'"),
) {
    const F: &str = "dedup.set_result";
    check_args(F, job_id, scope, None);
    let args = [
        DatumWithOid::from(job_id),
        DatumWithOid::from(scope),
        DatumWithOid::from(result),
    ];
    if citus::routes_claims() {
        // On Citus: the claim was a routed INSERT this transaction made as the caller (a
        // shard row's xmin is another node's); the UPDATE goes the same way, as the caller,
        // over the connection that wrote the claim.
        let (job_id, scope) = (job_id.unwrap_or_default(), scope.unwrap_or_default());
        let Some(claimer) = citus::claimed_here(scope, job_id) else {
            error::not_claimed_here(F);
        };
        let updated = citus::as_caller(Some(claimer), || {
            Spi::connect_mut(|c| {
                c.update(
                    "UPDATE dedup.processed AS p SET result = $3 \
                      WHERE p.job_id OPERATOR(pg_catalog.=) $1 AND p.scope OPERATOR(pg_catalog.=) $2 \
                        AND p.lease_expires_at IS NULL",
                    None,
                    &args,
                )
                .map(|t| t.len())
            })
        })
        .unwrap_or_else(|e| pgrx::error!("{F}: storing the result in dedup.processed failed: {e}"));
        if updated == 0 {
            // Claimed in a savepoint since rolled back.
            error::not_claimed_here(F);
        }
        return;
    }
    // A row this transaction wrote is stamped with this transaction's start or later: a
    // claim older than that whose 32-bit xmin is ours (a claim kept for 2^32 transactions,
    // an epoch ago) is not this transaction's, which must not store a result for a job it
    // never claimed (crash::set_result_refuses_a_claim_of_an_earlier_epoch).
    // Where generations are on, the claim is in the generation that was current when this
    // transaction claimed the job: the current one, or one published away from since
    // (sealing until this transaction ends). A key is in one generation only.
    let mut found = None;
    for table in claim_tables(F, scope.unwrap_or_default()) {
        let row = Spi::get_three_with_args::<String, bool, bool>(
            &format!(
                "SELECT p.xmin::pg_catalog.text, p.lease_expires_at IS NOT NULL, \
                        p.processed_at OPERATOR(pg_catalog.>=) pg_catalog.now() \
                   FROM {table} AS p \
                  WHERE p.job_id OPERATOR(pg_catalog.=) $1 AND p.scope OPERATOR(pg_catalog.=) $2"
            ),
            &args[..2],
        );
        if let Ok((Some(xmin), Some(leased), Some(recent))) = row {
            found = Some((table, xmin, leased, recent));
            break;
        }
    }
    let Some((table, xmin, leased, recent)) = found else {
        error::not_claimed_here(F);
    };
    if leased {
        error::leased(F);
    }
    if !recent {
        error::not_claimed_here(F);
    }
    let xmin = pg_sys::TransactionId::from(xmin.parse::<u32>().unwrap_or(0));
    // SAFETY: TransactionIdIsCurrentTransactionId (xact.c) only reads this backend's
    // transaction-state stack (or the parallel-xid array); it takes no pointer, allocates
    // nothing and raises no ERROR, and returns false for InvalidTransactionId (an
    // unparsable xmin). Called inside a transaction, in this #[pg_extern] function, whose
    // pgrx wrapper would turn an ERROR into a PostgreSQL error all the same.
    if !unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin) } {
        error::not_claimed_here(F);
    }
    Spi::run_with_args(
        &format!(
            "UPDATE {table} AS p SET result = $3 \
             WHERE p.job_id OPERATOR(pg_catalog.=) $1 AND p.scope OPERATOR(pg_catalog.=) $2"
        ),
        &args,
    )
    .unwrap_or_else(|e| pgrx::error!("{F}: storing the result in {table} failed: {e}"));
}

const FUNC_RESULT: &str = "dedup.claim_result";

/// `dedup._claim_result(job_id, scope)`: the row behind `dedup.claim_result`, which calls it
/// as the extension's owner (SECURITY DEFINER). On Citus the SELECT runs as the caller
/// instead, over the connection the caller's claim used (Citus refuses to read a shard
/// placement this transaction wrote as another role).
#[pg_extern(name = "_claim_result", stable, parallel_restricted)]
pub(crate) fn claim_result_row(
    job_id: Option<&str>,
    scope: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(result, Option<JsonB>),
        name!(claimed_at, Option<pgrx::datum::TimestampWithTimeZone>),
    ),
> {
    // NULL is an error, not "no result": a caller reading no row as "not done" would do the
    // job again.
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC_RESULT, "job_id"));
    let scope = scope.unwrap_or_else(|| error::null_argument(FUNC_RESULT, "scope"));
    // Every generation's table where generations are on (Citus has none). The list is as
    // new as the caller's snapshot or newer (it is read now, with the epoch of now), so a
    // claim this snapshot sees is in one of these tables.
    let tables = if citus::routes_claims() {
        vec!["dedup.processed".to_string()]
    } else {
        claim_tables(FUNC_RESULT, scope)
    };
    let args = [DatumWithOid::from(job_id), DatumWithOid::from(scope)];
    let read = || {
        Spi::connect(|c| {
            let mut rows = Vec::new();
            for table in &tables {
                let query = format!(
                    "SELECT p.result, p.processed_at FROM {table} AS p \
                      WHERE p.job_id OPERATOR(pg_catalog.=) $1 AND p.scope OPERATOR(pg_catalog.=) $2 \
                        AND p.lease_expires_at IS NULL"
                );
                for row in c.select(&query, None, &args)? {
                    rows.push((row.get::<JsonB>(1)?, row.get(2)?));
                }
            }
            Ok::<_, pgrx::spi::Error>(rows)
        })
    };
    let rows = if citus::routes_claims() {
        // As the role that claimed the job in this transaction, if one did; else the caller.
        let claimer = citus::claimed_here(scope, job_id);
        citus::as_caller(claimer, read)
    } else {
        read()
    }
    .unwrap_or_else(|e| pgrx::error!("dedup.claim_result: reading the claim tables failed: {e}"));
    TableIterator::new(rows)
}
