//! dedup with [sqlx](https://docs.rs/sqlx) 0.8 and PostgreSQL (feature `sqlx`).
//!
//! ```no_run
//! use dedup_client::{sqlx::run_once, Outcome, RunOptions};
//! # async fn handle(pool: &sqlx::PgPool, job_id: &str) -> Result<(), dedup_client::Error> {
//! let outcome = run_once(pool, job_id, "emails", &RunOptions::default(), |tx| {
//!     Box::pin(async move {
//!         sqlx::query("INSERT INTO receipts (job_id) VALUES ($1)")
//!             .bind(job_id)
//!             .execute(&mut **tx)
//!             .await?;
//!         Ok(())
//!     })
//! })
//! .await?;
//! // Committed: acknowledge the message, whether the effect ran now (Outcome::Ran) or
//! // before (Outcome::Duplicate). On an error, do not acknowledge.
//! # let _ = outcome; Ok(())
//! # }
//! ```
use crate::{
    drive_lease, lease_status, validate_scope, BoxFuture, Error, JobId, Lease, LeaseOptions,
    LeaseOutcome, LeaseStatus, Outcome, RunOptions,
};
use ::sqlx::{Executor, PgPool, Postgres, Transaction};
use std::future::Future;
use std::time::{Duration, SystemTime};

/// The sqlx crate this module was built with.
pub use ::sqlx as driver;

const CLAIM_TEXT: &str = "SELECT dedup.try_claim($1::text, $2::text)";
const CLAIM_BIGINT: &str = "SELECT dedup.try_claim($1::bigint, $2::text)";
#[cfg(feature = "uuid")]
const CLAIM_UUID: &str = "SELECT dedup.try_claim($1::text::uuid, $2::text)";
// The last column of LEASE and EXTEND: the duration the server used, the one passed or its
// dedup.lease_duration (read after the call, in the FROM clause, has loaded the extension's
// library, which defines the setting).
const LEASE: &str = "SELECT l.status, l.lease_id::text, extract(epoch FROM l.expires_at)::float8, \
     l.result::text, extract(epoch FROM l.claimed_at)::float8, \
     extract(epoch FROM coalesce(make_interval(secs => $3::float8), \
                                 current_setting('dedup.lease_duration')::interval))::float8 \
     FROM dedup.lease($1::text, $2::text, make_interval(secs => $3::float8), $4::text) AS l";
const EXTEND: &str = "SELECT extract(epoch FROM e.expires_at)::float8, \
     extract(epoch FROM coalesce(make_interval(secs => $3::float8), \
                                 current_setting('dedup.lease_duration')::interval))::float8 \
     FROM dedup.extend_lease($1::text, $2::text::uuid, make_interval(secs => $3::float8), $4::text) \
     AS e(expires_at)";
const COMPLETE: &str = "SELECT dedup.complete($1::text, $2::text::uuid, $3::text::jsonb, $4::text)";
const RELEASE: &str = "SELECT dedup.release_lease($1::text, $2::text::uuid, $3::text)";

/// Claims `job_id` in `scope` in the transaction `tx`: `true` if this transaction now holds
/// the claim (do the effect in `tx`, then commit), `false` if a committed claim exists (or
/// `tx` claimed it already): skip the job, and after the commit acknowledge the message.
///
/// It takes a [`Transaction`], so it cannot be called in autocommit, where the claim would
/// commit on its own before the effect. A `Transaction` begun on another one
/// (`tx.begin()`) is a savepoint: rolling it back releases the claim with the effects made
/// in it; the claim commits only with the outermost transaction. (Sending `COMMIT` or
/// `ROLLBACK` as SQL through `tx` defeats the type: don't.)
///
/// A claim held by a concurrent transaction makes the call wait for it. Under REPEATABLE
/// READ or SERIALIZABLE a claim committed after the snapshot is `40001`: retry the whole
/// transaction ([`run_once`] does).
pub async fn claim<'j>(
    tx: &mut Transaction<'_, Postgres>,
    job_id: impl Into<JobId<'j>>,
    scope: &str,
) -> Result<bool, Error> {
    let job = job_id.into();
    job.validate()?;
    validate_scope(scope)?;
    claim_checked(tx, job, scope).await
}

async fn claim_checked(
    tx: &mut Transaction<'_, Postgres>,
    job: JobId<'_>,
    scope: &str,
) -> Result<bool, Error> {
    let query = match job {
        JobId::Text(s) => ::sqlx::query_scalar(CLAIM_TEXT).bind(s),
        JobId::Int(n) => ::sqlx::query_scalar(CLAIM_BIGINT).bind(n),
        #[cfg(feature = "uuid")]
        JobId::Uuid(u) => ::sqlx::query_scalar(CLAIM_UUID).bind(u.hyphenated().to_string()),
    };
    Ok(query.bind(scope).fetch_one(&mut **tx).await?)
}

/// Does job `job_id` of `scope` exactly once: begins a transaction on `pool`, claims the
/// job, runs `effect` in the transaction only if the claim is fresh, and commits. The whole
/// transaction is retried on `40001` and `40P01` (from the claim, the effect or the
/// commit), up to `options`' attempts, with a bounded, jittered backoff.
///
/// `Ok(Outcome::Ran(t))`: the effect ran and committed with the claim. `Ok(Duplicate)`: a
/// committed claim exists, the effect did not run. Both mean: acknowledge the message.
/// `Err(_)`: nothing committed (or, after an error from the COMMIT itself, maybe it did:
/// then the claim committed too and the redelivered copy is a `Duplicate`): do **not**
/// acknowledge, the queue delivers the message again.
///
/// The effect gets the transaction (run queries with `.execute(&mut **tx)`; its lifetime
/// parameter is the pool's `'static` seen as `'env`) and returns a boxed future that may
/// borrow it and what the closure captured:
/// `|tx| Box::pin(async move { ... })`. It may run several times (once per attempt): only
/// its database writes through `tx` are undone by a retry, so keep other side effects out
/// (use a lease for those). Its error is returned as is, retried only if
/// [`Error::is_retryable`]; wrap your own errors with [`Error::effect`].
///
/// An effect that returns `Ok` after one of its statements failed (it ignored the error:
/// `let _ = query.execute(&mut **tx).await`) leaves the transaction aborted, and the server
/// would answer its COMMIT with a ROLLBACK that [`Transaction::commit`] reports as `Ok`.
/// `run_once` checks the transaction before committing: if it is aborted it rolls back and
/// returns [`Error::TransactionAborted`] (not retried), never `Ran`. Return the error
/// instead, or run a statement that may fail in a savepoint (`tx.begin()`).
pub async fn run_once<'env, 'j, T, F>(
    pool: &PgPool,
    job_id: impl Into<JobId<'j>>,
    scope: &str,
    options: &RunOptions,
    mut effect: F,
) -> Result<Outcome<T>, Error>
where
    F: for<'a> FnMut(&'a mut Transaction<'env, Postgres>) -> BoxFuture<'env, 'a, Result<T, Error>>,
{
    let job = job_id.into();
    job.validate()?;
    validate_scope(scope)?;
    let mut attempt = 1;
    loop {
        match run_attempt(pool, job, scope, options, &mut effect).await {
            Err(e) if options.retry_after(&e, attempt).await => attempt += 1,
            result => return result,
        }
    }
}

async fn run_attempt<'env, T, F>(
    pool: &PgPool,
    job: JobId<'_>,
    scope: &str,
    options: &RunOptions,
    effect: &mut F,
) -> Result<Outcome<T>, Error>
where
    F: for<'a> FnMut(&'a mut Transaction<'env, Postgres>) -> BoxFuture<'env, 'a, Result<T, Error>>,
{
    // Transaction<'static> as Transaction<'env>: with 'static in the closure's argument
    // type, the compiler would require the closure's captures to be 'static.
    let mut tx: Transaction<'env, Postgres> = pool.begin().await?;
    let result = async {
        if let Some(level) = options.isolation {
            (&mut *tx).execute(level.set_transaction()).await?;
        }
        Ok(if claim_checked(&mut tx, job, scope).await? {
            let value = effect(&mut tx).await?;
            check_not_aborted(&mut tx).await?;
            Outcome::Ran(value)
        } else {
            Outcome::Duplicate
        })
    }
    .await;
    match result {
        Ok(outcome) => {
            tx.commit().await?; // an error here, too, means: do not acknowledge
            Ok(outcome)
        }
        Err(e) => {
            // Roll back now rather than when the pool next hands the connection out.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// [`Error::TransactionAborted`] if a statement of `tx` failed: the transaction is then
/// aborted, every statement but ROLLBACK fails with `25P02`, and a COMMIT ends in ROLLBACK
/// (with the command tag `ROLLBACK`, not an error: sqlx's [`Transaction::commit`] returns
/// `Ok`).
async fn check_not_aborted(tx: &mut Transaction<'_, Postgres>) -> Result<(), Error> {
    match (&mut **tx).execute("SELECT 1").await {
        Ok(_) => Ok(()),
        Err(e) => match Error::from(e) {
            e if e.sqlstate() == Some("25P02") => Err(Error::TransactionAborted),
            e => Err(e),
        },
    }
}

type LeaseRow = (
    String,
    Option<String>,
    Option<f64>,
    Option<String>,
    Option<f64>,
    f64,
);

/// `dedup.lease`: takes `job_id` for an external effect, in a statement of its own on a
/// connection of `pool`, in autocommit: the lease commits before the effect starts.
/// [`LeaseStatus::Acquired`] holds the [`Lease`] to pass to [`complete`] after the effect,
/// or to [`release`] if it failed. A `bigint` or `uuid` job id is leased as its text, which
/// is the same job as `try_claim`'s.
///
/// It takes the pool, not a [`Transaction`] or a connection (a `&mut PgConnection` may be
/// one in a transaction: `&mut *tx`): a lease taken in a transaction (in the effect of
/// [`run_once`], say) would be invisible to other callers until the COMMIT and undone by a
/// rollback or a retry, whose next attempt would lease and call again. This does not
/// compile:
///
/// ```compile_fail
/// # use dedup_client::{sqlx::lease, LeaseOptions};
/// # async fn f(pool: &sqlx::PgPool) -> Result<(), dedup_client::Error> {
/// let mut tx = pool.begin().await?;
/// lease(&mut *tx, "job-1", "payments", &LeaseOptions::default()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn lease<'j>(
    pool: &PgPool,
    job_id: impl Into<JobId<'j>>,
    scope: &str,
    options: &LeaseOptions<'_>,
) -> Result<LeaseStatus, Error> {
    let job = job_id.into();
    job.validate()?;
    validate_scope(scope)?;
    options.validate()?;
    let job = job.to_string();
    let (status, lease_id, expires_at, result, claimed_at, duration): LeaseRow =
        ::sqlx::query_as(LEASE)
            .bind(&job)
            .bind(scope)
            .bind(options.duration.map(|d| d.as_secs_f64()))
            .bind(options.fingerprint)
            .fetch_one(pool)
            .await?;
    lease_status(
        job, scope, &status, lease_id, expires_at, result, claimed_at, duration,
    )
}

/// `dedup.extend_lease`: the lease now expires `duration` from now (`None`: the server's
/// `dedup.lease_duration`). A heartbeat for an effect that takes longer than leased.
/// `YD002` ([`Error::is_lease_lost`]): the lease expired and another caller took the job
/// over.
///
/// It takes the pool, not a [`Transaction`]: an extension in an open transaction counts
/// only from its COMMIT, and meanwhile the lease may expire and be taken over. This does
/// not compile:
///
/// ```compile_fail
/// # use dedup_client::{sqlx::extend, Lease};
/// # async fn f(pool: &sqlx::PgPool, mut lease: Lease) -> Result<(), dedup_client::Error> {
/// let mut tx = pool.begin().await?;
/// extend(&mut *tx, &mut lease, None).await?;
/// # Ok(())
/// # }
/// ```
pub async fn extend(
    pool: &PgPool,
    lease: &mut Lease,
    duration: Option<Duration>,
) -> Result<SystemTime, Error> {
    crate::check_duration("duration", duration)?;
    let (expires_at, duration) = extend_held(pool, lease, duration).await?;
    lease.expires_at = expires_at;
    lease.duration = duration;
    Ok(expires_at)
}

/// The new expiry, and the duration the server extended by.
async fn extend_held(
    pool: &PgPool,
    lease: &Lease,
    duration: Option<Duration>,
) -> Result<(SystemTime, Duration), Error> {
    let (expires_at, duration): (f64, f64) = ::sqlx::query_as(EXTEND)
        .bind(&lease.job_id)
        .bind(&lease.lease_id)
        .bind(duration.map(|d| d.as_secs_f64()))
        .bind(&lease.scope)
        .fetch_one(pool)
        .await?;
    Ok((crate::epoch_to_time(expires_at), crate::seconds(duration)?))
}

/// `dedup.complete`: marks the leased job done with `result` (JSON text, for later copies
/// and `dedup.claim_result`). Alone (the pool), or in the transaction of a database write
/// that goes with the effect (`&mut *tx`; the lease is done when it commits). Then
/// acknowledge the message (after that COMMIT). `YD002` ([`Error::is_lease_lost`]): the
/// lease was taken over; do not acknowledge.
pub async fn complete<'c, E>(db: E, lease: Lease, result: Option<&str>) -> Result<(), Error>
where
    E: Executor<'c, Database = Postgres>,
{
    ::sqlx::query(COMPLETE)
        .bind(&lease.job_id)
        .bind(&lease.lease_id)
        .bind(result)
        .bind(&lease.scope)
        .execute(db)
        .await?;
    Ok(())
}

/// `dedup.release_lease`: gives the job back after a failed effect, so the redelivered copy
/// can lease it at once. Do not acknowledge the message.
///
/// It takes the pool, not a [`Transaction`] (a release rolled back would keep the job until
/// the lease expires). This does not compile:
///
/// ```compile_fail
/// # use dedup_client::{sqlx::release, Lease};
/// # async fn f(pool: &sqlx::PgPool, lease: Lease) -> Result<(), dedup_client::Error> {
/// let mut tx = pool.begin().await?;
/// release(&mut *tx, lease).await?;
/// # Ok(())
/// # }
/// ```
pub async fn release(pool: &PgPool, lease: Lease) -> Result<(), Error> {
    ::sqlx::query(RELEASE)
        .bind(&lease.job_id)
        .bind(&lease.lease_id)
        .bind(&lease.scope)
        .execute(pool)
        .await?;
    Ok(())
}

/// Leases `job_id`, runs `effect` while extending the lease every third of its duration,
/// then completes the lease with the effect's result (JSON text), or releases it if the
/// effect failed. Give the external call the job id as its idempotency key: a caller
/// killed between the call and `complete` makes the next holder call again.
///
/// [`LeaseOutcome::Ran`] and [`LeaseOutcome::Done`]: acknowledge the message.
/// [`LeaseOutcome::Busy`] and `Err(_)`: do not. The heartbeat's period is a third of the
/// lease's duration (the one in `options`, or the server's `dedup.lease_duration`), not
/// derived from the clocks. A heartbeat that fails with `YD002` (the lease expired and
/// another caller took the job over) drops the effect's future and returns that error. Any
/// other heartbeat error (a lost connection, a lock timeout) is tried again at the next
/// tick; if the lease would expire before an extension succeeds, the effect's future is
/// dropped, the lease released if possible, and the last heartbeat error returned.
pub async fn run_leased<'j, F, Fut>(
    pool: &PgPool,
    job_id: impl Into<JobId<'j>>,
    scope: &str,
    options: &LeaseOptions<'_>,
    effect: F,
) -> Result<LeaseOutcome, Error>
where
    F: FnOnce(&Lease) -> Fut,
    Fut: Future<Output = Result<Option<String>, Error>>,
{
    let leased_at = tokio::time::Instant::now();
    let lease = match lease(pool, job_id, scope, options).await? {
        LeaseStatus::Acquired(lease) => lease,
        LeaseStatus::Done { result, .. } => return Ok(LeaseOutcome::Done { result }),
        LeaseStatus::Busy { expires_at } => return Ok(LeaseOutcome::Busy { expires_at }),
    };
    let duration = options.duration;
    drive_lease(
        lease,
        leased_at,
        effect,
        |l| {
            let held = l.duplicate();
            async move { extend_held(pool, &held, duration).await.map(drop) }
        },
        |l| release(pool, l),
        |l, result| async move { complete(pool, l, result.as_deref()).await },
    )
    .await
}
