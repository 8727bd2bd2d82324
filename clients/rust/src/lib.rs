//! Client for dedup, the PostgreSQL extension for exactly-once effects
//! over at-least-once delivery.
//!
//! A queue consumer claims each job with `dedup.try_claim` **inside the transaction of its
//! effect**: the claim and the effect commit together or not at all, so a redelivered copy
//! of the message finds the claim and skips the job. This crate makes that hard to get
//! wrong:
//!
//! * [`tokio_postgres::claim`] and [`sqlx::claim`] take a *transaction* (a
//!   `tokio_postgres::Transaction` or a `sqlx::Transaction<'_, Postgres>`), so a claim
//!   outside a transaction block, which would commit on its own before the effect, does not
//!   compile.
//! * [`tokio_postgres::run_once`] and [`sqlx::run_once`] open the transaction, claim, run the
//!   effect only when the claim is fresh, commit, and retry the whole transaction on
//!   `40001` (serialization_failure) and `40P01` (deadlock_detected) with a bounded
//!   backoff. They return [`Outcome::Ran`] or [`Outcome::Duplicate`]; either way the
//!   transaction committed and the message can be acknowledged. On an error it did not
//!   commit: do not acknowledge, the queue delivers the message again. An effect that
//!   ignored a failed statement left the transaction aborted, and its COMMIT would roll
//!   back without an error from the driver: `run_once` checks, rolls back and returns
//!   [`Error::TransactionAborted`] instead of reporting the job done.
//! * The lease functions ([`tokio_postgres::lease`], [`tokio_postgres::run_leased`] and their
//!   [`sqlx`] twins) are for effects outside the database (an email, a payment): a
//!   [`Lease`] is consumed by `complete` or `release`, so it cannot be completed twice or
//!   after it was given back. `lease`, `extend` and `release` take a client in autocommit
//!   (a tokio-postgres `&Client`, a sqlx `&PgPool`), not a transaction: a lease taken or
//!   extended in a transaction would not count until its COMMIT, and would vanish with a
//!   rollback.
//!
//! Features: `tokio-postgres`, `sqlx` (sqlx 0.8 with `postgres` and `runtime-tokio`, no
//! TLS of its own: enable one on your `sqlx` dependency), `uuid` (job ids of type
//! `uuid::Uuid`). None is on by default.
//!
//! Bad input (an empty or too long job id or scope, a NUL byte, a zero lease) is refused
//! before any query with [`Error::InvalidArgument`], which carries the SQLSTATE the server
//! would have raised (`22023`, `22001`, `22021`); every other error is the driver's,
//! passed through with its SQLSTATE ([`Error::sqlstate`]).
#![warn(missing_docs)]
#![cfg_attr(
    not(any(feature = "tokio-postgres", feature = "sqlx")),
    allow(dead_code)
)]

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "sqlx")]
pub mod sqlx;
#[cfg(feature = "tokio-postgres")]
pub mod tokio_postgres;

/// The version of this crate, which is the version of the extension it was written for
/// (`SELECT extversion FROM pg_extension WHERE extname = 'dedup'`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The scope of claims made without one, as in SQL.
pub const DEFAULT_SCOPE: &str = "default";

/// The longest job id, in bytes.
pub const MAX_JOB_ID_BYTES: usize = 1024;
/// The longest scope, in bytes.
pub const MAX_SCOPE_BYTES: usize = 128;
/// The longest payload fingerprint, in bytes.
pub const MAX_FINGERPRINT_BYTES: usize = 256;

/// The boxed future an effect closure of `run_once` returns: `|tx| Box::pin(async move {
/// ... })`. It may borrow the transaction (`'a`) and whatever the caller of `run_once` lent
/// the closure (`'env`): a job id, a payload.
///
/// (A plain `Pin<Box<dyn Future + 'a>>` under `for<'a>` would require the captures to be
/// `'static`; the bound `'env: 'a` carried by [`ScopedFuture`] is what lets the future
/// borrow from the caller.)
pub type BoxFuture<'env, 'a, T> = Pin<Box<dyn ScopedFuture<'env, 'a, Output = T> + Send + 'a>>;

/// A future that lives for `'a` inside a scope `'env` (`'env: 'a`): the trait behind
/// [`BoxFuture`]. Every `Future + 'a` is one; there is nothing to implement.
pub trait ScopedFuture<'env, 'a, Bound = ImpliedBound<'env, 'a>>: Future
where
    Bound: sealed::Sealed,
{
}

/// The type that states `'env: 'a` (as the default type parameter of [`ScopedFuture`]).
pub type ImpliedBound<'env, 'a> = PhantomData<&'a &'env ()>;

impl<'env: 'a, 'a, F: Future + 'a> ScopedFuture<'env, 'a> for F {}

mod sealed {
    pub trait Sealed {}
    impl<'env, 'a> Sealed for super::ImpliedBound<'env, 'a> {}
}

/// A job id, as the SQL overloads of `dedup.try_claim` take it: `text`, `bigint` or `uuid`.
///
/// A `bigint` is the job of its decimal text (`42` and `"42"` are one job, `"042"` another);
/// a `uuid` is the job of its canonical text, lowercase and hyphenated. Text is compared
/// byte for byte. Build one with `.into()` from `&str`, `&String`, `i64` or (feature `uuid`)
/// `uuid::Uuid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobId<'a> {
    /// `try_claim(job_id text, ...)`: 1 to 1024 bytes, no NUL byte.
    Text(&'a str),
    /// `try_claim(job_id bigint, ...)`.
    Int(i64),
    /// `try_claim(job_id uuid, ...)`.
    #[cfg(feature = "uuid")]
    Uuid(uuid::Uuid),
}

impl<'a> From<&'a str> for JobId<'a> {
    fn from(s: &'a str) -> Self {
        JobId::Text(s)
    }
}

impl<'a> From<&'a String> for JobId<'a> {
    fn from(s: &'a String) -> Self {
        JobId::Text(s)
    }
}

impl From<i64> for JobId<'_> {
    fn from(n: i64) -> Self {
        JobId::Int(n)
    }
}

#[cfg(feature = "uuid")]
impl From<uuid::Uuid> for JobId<'_> {
    fn from(u: uuid::Uuid) -> Self {
        JobId::Uuid(u)
    }
}

impl fmt::Display for JobId<'_> {
    /// The job's text: what `dedup.processed.job_id` holds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobId::Text(s) => f.write_str(s),
            JobId::Int(n) => write!(f, "{n}"),
            #[cfg(feature = "uuid")]
            JobId::Uuid(u) => write!(f, "{}", u.hyphenated()),
        }
    }
}

impl JobId<'_> {
    /// Checks what the server would refuse, without a query.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            JobId::Text(s) => check_text("job_id", s, MAX_JOB_ID_BYTES),
            _ => Ok(()),
        }
    }
}

/// Checks a scope as the server would, without a query.
pub fn validate_scope(scope: &str) -> Result<(), Error> {
    check_text("scope", scope, MAX_SCOPE_BYTES)
}

fn check_text(argument: &'static str, value: &str, max: usize) -> Result<(), Error> {
    let invalid = |sqlstate, message| {
        Err(Error::InvalidArgument {
            argument,
            sqlstate,
            message,
        })
    };
    if value.is_empty() {
        return invalid("22023", format!("{argument} must not be empty"));
    }
    if value.len() > max {
        return invalid(
            "22001",
            format!(
                "{argument} is {} bytes long, longer than the limit of {max} bytes",
                value.len()
            ),
        );
    }
    if value.contains('\0') {
        return invalid(
            "22021",
            format!("{argument} contains a NUL byte, which PostgreSQL text cannot hold"),
        );
    }
    Ok(())
}

/// What [`tokio_postgres::run_once`] or [`sqlx::run_once`] did. Either way its transaction
/// committed: acknowledge the message.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The claim was fresh: the effect ran and committed with it; `T` is what it returned.
    Ran(T),
    /// A committed claim exists: the job was done before; the effect did not run.
    Duplicate,
}

impl<T> Outcome<T> {
    /// `true` for [`Outcome::Ran`].
    pub fn ran(&self) -> bool {
        matches!(self, Outcome::Ran(_))
    }
    /// `true` for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }
    /// The effect's value, if it ran.
    pub fn into_ran(self) -> Option<T> {
        match self {
            Outcome::Ran(t) => Some(t),
            Outcome::Duplicate => None,
        }
    }
}

/// The isolation level of the transaction `run_once` opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// READ COMMITTED (PostgreSQL's default).
    ReadCommitted,
    /// REPEATABLE READ: a claim committed after the snapshot raises `40001`, and the retry
    /// finds it (`Duplicate`).
    RepeatableRead,
    /// SERIALIZABLE.
    Serializable,
}

impl Isolation {
    fn set_transaction(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            Isolation::Serializable => "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

type RetryHook = Arc<dyn Fn(&Error, u32) + Send + Sync>;

/// How `run_once` retries: at most `max_attempts` transactions (default 5), waiting between
/// two a random time between half and all of `first_backoff` (default 10 ms) doubled per
/// attempt, at most `max_backoff` (default 1 s).
#[derive(Clone)]
pub struct RunOptions {
    max_attempts: u32,
    first_backoff: Duration,
    max_backoff: Duration,
    isolation: Option<Isolation>,
    on_retry: Option<RetryHook>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            max_attempts: 5,
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            isolation: None,
            on_retry: None,
        }
    }
}

impl fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOptions")
            .field("max_attempts", &self.max_attempts)
            .field("first_backoff", &self.first_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("isolation", &self.isolation)
            .field("on_retry", &self.on_retry.as_ref().map(|_| "Fn"))
            .finish()
    }
}

impl RunOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// At most this many transactions (1: no retry). 0 counts as 1.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }
    /// The wait before the second attempt, and the longest wait.
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = max.max(first);
        self
    }
    /// Run the transaction at this isolation level (default: the session's).
    pub fn isolation(mut self, level: Isolation) -> Self {
        self.isolation = Some(level);
        self
    }
    /// Called before each retry with the error of the failed attempt and its number (from
    /// 1): a counter for your metrics (a steady rise means contention), or a log line.
    pub fn on_retry(mut self, f: impl Fn(&Error, u32) + Send + Sync + 'static) -> Self {
        self.on_retry = Some(Arc::new(f));
        self
    }
    /// The number of attempts.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// After failed attempt `attempt`: `true` (having waited) if the transaction is to be
    /// tried again.
    async fn retry_after(&self, e: &Error, attempt: u32) -> bool {
        if !e.is_retryable() || attempt >= self.max_attempts {
            return false;
        }
        if let Some(f) = &self.on_retry {
            f(e, attempt);
        }
        tokio::time::sleep(self.delay(attempt)).await;
        true
    }

    /// The wait after failed attempt `attempt` (1-based).
    fn delay(&self, attempt: u32) -> Duration {
        let doubled = self
            .first_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let full = doubled.min(self.max_backoff);
        full / 2 + full.mul_f64(random_unit() / 2.0)
    }
}

/// A number in [0, 1) from the standard library's per-process random hash keys.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Options of `lease` and `run_leased`.
#[derive(Clone, Debug, Default)]
pub struct LeaseOptions<'a> {
    /// How long the lease holds the job; `None`: the server's `dedup.lease_duration` (30 s).
    /// `run_leased` extends it by as much every third of this duration while the effect
    /// runs.
    pub duration: Option<Duration>,
    /// A hash of the payload, 1 to 256 bytes: the same job id with another fingerprint is
    /// `YD001` instead of a duplicate.
    pub fingerprint: Option<&'a str>,
}

impl<'a> LeaseOptions<'a> {
    /// A lease of `duration`.
    pub fn duration(duration: Duration) -> Self {
        LeaseOptions {
            duration: Some(duration),
            fingerprint: None,
        }
    }
    /// With a payload fingerprint.
    pub fn fingerprint(mut self, fingerprint: &'a str) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }
    fn validate(&self) -> Result<(), Error> {
        check_duration("duration", self.duration)?;
        if let Some(f) = self.fingerprint {
            check_text("fingerprint", f, MAX_FINGERPRINT_BYTES)?;
        }
        Ok(())
    }
}

fn check_duration(argument: &'static str, d: Option<Duration>) -> Result<(), Error> {
    match d {
        Some(d) if d.is_zero() => Err(Error::InvalidArgument {
            argument,
            sqlstate: "22023",
            message: format!("{argument} must be positive"),
        }),
        _ => Ok(()),
    }
}

/// A lease held on a job: the proof needed to extend, complete or release it. `complete`
/// and `release` consume it.
#[derive(Debug)]
pub struct Lease {
    job_id: String,
    scope: String,
    lease_id: String,
    expires_at: SystemTime,
    duration: Duration,
}

impl Lease {
    /// A copy for the heartbeat of `run_leased` (not public: a `Lease` is completed or
    /// released once).
    fn duplicate(&self) -> Lease {
        Lease {
            job_id: self.job_id.clone(),
            scope: self.scope.clone(),
            lease_id: self.lease_id.clone(),
            expires_at: self.expires_at,
            duration: self.duration,
        }
    }
    /// The job leased (its text).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
    /// The job's scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }
    /// The `lease_id` the server returned (a uuid, as text).
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }
    /// When the lease expires, unless extended; another caller may then take the job over.
    /// The server's clock: compare it with the local clock only if the two agree.
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }
    /// How long the lease was taken or last extended for: the duration asked for, or the
    /// server's `dedup.lease_duration`. Unlike `expires_at`, it does not depend on the
    /// clocks: a heartbeat every third of it keeps the lease whatever their skew.
    pub fn duration(&self) -> Duration {
        self.duration
    }
}

/// What `dedup.lease` answered.
#[derive(Debug)]
pub enum LeaseStatus {
    /// This caller holds the job: do the effect (with the job id as its idempotency key),
    /// then `complete`; on failure `release`. Do not acknowledge before `complete`.
    Acquired(Lease),
    /// The job is done: acknowledge the message. `result` is what `complete` stored (JSON).
    Done {
        /// The stored result, as JSON text, or `None`.
        result: Option<String>,
        /// When the job was done.
        done_at: SystemTime,
    },
    /// Another caller holds the job: leave the message unacknowledged (if the holder dies,
    /// this copy comes back and takes the expired lease over).
    Busy {
        /// When the holder's lease expires.
        expires_at: SystemTime,
    },
}

/// What `run_leased` did.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The effect ran and the lease was completed with its result: acknowledge the message.
    Ran {
        /// The result stored, as JSON text.
        result: Option<String>,
    },
    /// The job was done before: acknowledge the message.
    Done {
        /// The result stored by whoever did it, as JSON text.
        result: Option<String>,
    },
    /// Another caller holds the job: do not acknowledge.
    Busy {
        /// When the holder's lease expires.
        expires_at: SystemTime,
    },
}

impl LeaseOutcome {
    /// `Ran` or `Done`: the job is done and the message can be acknowledged.
    pub fn is_done(&self) -> bool {
        !matches!(self, LeaseOutcome::Busy { .. })
    }
}

/// A duration the server gave, in seconds.
fn seconds(secs: f64) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| Error::Protocol(format!("a duration of {secs} seconds")))
}

fn epoch_to_time(secs: f64) -> SystemTime {
    if secs >= 0.0 {
        UNIX_EPOCH + Duration::from_secs_f64(secs)
    } else {
        UNIX_EPOCH - Duration::from_secs_f64(-secs)
    }
}

/// The row of `dedup.lease`, and `duration`: the one asked for or the server's
/// `dedup.lease_duration`, in seconds.
#[allow(clippy::too_many_arguments)]
fn lease_status(
    job: String,
    scope: &str,
    status: &str,
    lease_id: Option<String>,
    expires_at: Option<f64>,
    result: Option<String>,
    claimed_at: Option<f64>,
    duration: f64,
) -> Result<LeaseStatus, Error> {
    let unexpected = || Error::Protocol(format!("dedup.lease returned status {status:?}"));
    Ok(match status {
        "acquired" => LeaseStatus::Acquired(Lease {
            job_id: job,
            scope: scope.to_owned(),
            lease_id: lease_id.ok_or_else(unexpected)?,
            expires_at: epoch_to_time(expires_at.ok_or_else(unexpected)?),
            duration: seconds(duration)?,
        }),
        "done" => LeaseStatus::Done {
            result,
            done_at: epoch_to_time(claimed_at.unwrap_or_default()),
        },
        "busy" => LeaseStatus::Busy {
            expires_at: epoch_to_time(expires_at.unwrap_or_default()),
        },
        _ => return Err(unexpected()),
    })
}

/// The heartbeat's period for a lease of `duration`: a third of it. Derived from the
/// duration, not from the server's `expires_at` and the local clock, which may disagree.
fn heartbeat_period(duration: Duration) -> Duration {
    (duration / 3).max(Duration::from_millis(1))
}

/// How the effect of `run_leased` ended.
enum Ending {
    /// The effect returned.
    Returned(Result<Option<String>, Error>),
    /// A heartbeat failed and the lease is not (or may no longer be) this caller's.
    Heartbeat(Error),
}

/// `run_leased`'s common part: a heartbeat beside the effect, then complete or release.
/// `leased_at` is when the lease was asked for (the local monotonic clock).
async fn drive_lease<Ef, Fut, Ext, ExtF, Rel, RelF, Com, ComF>(
    lease: Lease,
    leased_at: tokio::time::Instant,
    effect: Ef,
    mut extend: Ext,
    release: Rel,
    complete: Com,
) -> Result<LeaseOutcome, Error>
where
    Ef: FnOnce(&Lease) -> Fut,
    Fut: Future<Output = Result<Option<String>, Error>>,
    Ext: FnMut(&Lease) -> ExtF,
    ExtF: Future<Output = Result<(), Error>>,
    Rel: FnOnce(Lease) -> RelF,
    RelF: Future<Output = Result<(), Error>>,
    Com: FnOnce(Lease, Option<String>) -> ComF,
    ComF: Future<Output = Result<(), Error>>,
{
    // An extension every third of the lease's duration, each by the same duration.
    let every = heartbeat_period(lease.duration);
    // The server's expiry is its clock when it took (or extended) the lease plus the
    // duration, which is no earlier than the local clock when it was asked for plus the
    // duration: by the monotonic clock, the lease is held until `held_until` at least.
    let mut held_until = leased_at + lease.duration;
    let ending = {
        let mut call = pin!(effect(&lease));
        let start = tokio::time::Instant::now() + every;
        let mut heartbeat = tokio::time::interval_at(start, every);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = std::future::poll_fn(|cx| {
                if let Poll::Ready(out) = call.as_mut().poll(cx) {
                    return Poll::Ready(Some(out));
                }
                heartbeat.poll_tick(cx).map(|_| None)
            })
            .await;
            let Some(out) = next else {
                let sent = tokio::time::Instant::now();
                match extend(&lease).await {
                    Ok(()) => held_until = sent + lease.duration,
                    // YD002: the lease expired and another caller took the job over; the
                    // job is theirs now: drop the effect.
                    Err(e) if e.is_lease_lost() => break Ending::Heartbeat(e),
                    // Another error (a lost connection, a lock timeout): the lease is held
                    // until `held_until` still; try again at the next tick.
                    Err(_) if tokio::time::Instant::now() < held_until => {}
                    // Until the lease would expire: then give up and drop the effect.
                    Err(e) => break Ending::Heartbeat(e),
                }
                continue;
            };
            break Ending::Returned(out);
        }
    };
    match ending {
        Ending::Returned(Ok(result)) => {
            complete(lease, result.clone()).await?;
            Ok(LeaseOutcome::Ran { result })
        }
        Ending::Heartbeat(e) if e.is_lease_lost() => Err(e),
        Ending::Returned(Err(e)) | Ending::Heartbeat(e) => {
            // Give the job back so the redelivered copy need not wait for the lease to
            // expire; the effect's (or the heartbeat's) error is the one reported.
            let _ = release(lease).await;
            Err(e)
        }
    }
}

/// An error of this crate: bad input caught before any query, the driver's error (with the
/// server's SQLSTATE), or an effect's own error.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An argument the server would refuse, caught before any query was sent (the
    /// transaction is untouched). `sqlstate` is the server's for the same input: `22023`
    /// (empty, or a zero duration), `22001` (too long), `22021` (a NUL byte).
    InvalidArgument {
        /// `job_id`, `scope`, `fingerprint` or `duration`.
        argument: &'static str,
        /// The SQLSTATE the server would raise.
        sqlstate: &'static str,
        /// What is wrong.
        message: String,
    },
    /// An error of tokio-postgres, e.g. the server's (see [`Error::sqlstate`]).
    #[cfg(feature = "tokio-postgres")]
    Postgres(::tokio_postgres::Error),
    /// An error of sqlx, e.g. the server's (see [`Error::sqlstate`]).
    #[cfg(feature = "sqlx")]
    Sqlx(::sqlx::Error),
    /// The effect's own error ([`Error::effect`]): not retried.
    Effect(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The effect of `run_once` returned `Ok`, but a statement of its transaction had
    /// failed (an error the effect ignored, e.g. `let _ = tx.execute(..)`): the transaction
    /// was aborted, and its COMMIT would have rolled back without an error from the driver.
    /// `run_once` rolled it back: nothing committed, do not acknowledge the message. Not
    /// retried (the effect would likely do the same again): fix the effect, which must
    /// return the error, or run the statement that may fail in a savepoint. `sqlstate()` is
    /// `25P02` (in_failed_sql_transaction).
    TransactionAborted,
    /// The server answered something this crate does not understand (another version of
    /// the extension?).
    Protocol(String),
}

impl Error {
    /// Wraps an effect's own error (an HTTP call's, a parse error): `run_once` does not
    /// retry it, and the transaction rolls back.
    pub fn effect(e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::Effect(e.into())
    }

    /// The SQLSTATE: the server's for a database error, the one the server would have
    /// raised for [`Error::InvalidArgument`], `25P02` for [`Error::TransactionAborted`],
    /// `None` otherwise (a connection error, an effect's own error).
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::InvalidArgument { sqlstate, .. } => Some(sqlstate),
            Error::TransactionAborted => Some("25P02"),
            #[cfg(feature = "tokio-postgres")]
            Error::Postgres(e) => e.code().map(|c| c.code()),
            #[cfg(feature = "sqlx")]
            Error::Sqlx(::sqlx::Error::Database(db)) => db
                .try_downcast_ref::<::sqlx::postgres::PgDatabaseError>()
                .map(|pg| pg.code()),
            _ => None,
        }
    }

    /// The server's hint, if any.
    pub fn hint(&self) -> Option<&str> {
        match self {
            #[cfg(feature = "tokio-postgres")]
            Error::Postgres(e) => e.as_db_error().and_then(|db| db.hint()),
            #[cfg(feature = "sqlx")]
            Error::Sqlx(::sqlx::Error::Database(db)) => db
                .try_downcast_ref::<::sqlx::postgres::PgDatabaseError>()
                .and_then(|pg| pg.hint()),
            _ => None,
        }
    }

    /// `40001` (serialization_failure) or `40P01` (deadlock_detected): retrying the whole
    /// transaction is the remedy (`run_once` does, up to its `max_attempts`).
    pub fn is_retryable(&self) -> bool {
        matches!(self.sqlstate(), Some("40001" | "40P01"))
    }

    /// `YD002`: the lease is no longer this caller's (it expired and another caller took
    /// the job over, or it was released or completed). Do not acknowledge the message.
    pub fn is_lease_lost(&self) -> bool {
        self.sqlstate() == Some("YD002")
    }

    /// `YD001`: the job was claimed with another payload fingerprint.
    pub fn is_fingerprint_mismatch(&self) -> bool {
        self.sqlstate() == Some("YD001")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument {
                sqlstate, message, ..
            } => write!(f, "invalid argument ({sqlstate}): {message}"),
            #[cfg(feature = "tokio-postgres")]
            Error::Postgres(e) => match e.as_db_error() {
                Some(db) => {
                    write!(
                        f,
                        "{} {}: {}",
                        db.severity(),
                        db.code().code(),
                        db.message()
                    )?;
                    if let Some(hint) = db.hint() {
                        write!(f, " (hint: {hint})")?;
                    }
                    Ok(())
                }
                None => write!(f, "{e}"),
            },
            #[cfg(feature = "sqlx")]
            Error::Sqlx(e) => match e {
                ::sqlx::Error::Database(db) => {
                    write!(
                        f,
                        "ERROR {}: {}",
                        self.sqlstate().unwrap_or("?"),
                        db.message()
                    )?;
                    if let Some(hint) = self.hint() {
                        write!(f, " (hint: {hint})")?;
                    }
                    Ok(())
                }
                e => write!(f, "{e}"),
            },
            Error::Effect(e) => write!(f, "effect failed: {e}"),
            Error::TransactionAborted => f.write_str(
                "transaction aborted (25P02): a statement of the effect failed and the effect \
                 went on; rolled back, nothing committed",
            ),
            Error::Protocol(m) => write!(f, "unexpected answer from the server: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "tokio-postgres")]
            Error::Postgres(e) => Some(e),
            #[cfg(feature = "sqlx")]
            Error::Sqlx(e) => Some(e),
            Error::Effect(e) => Some(&**e),
            _ => None,
        }
    }
}

#[cfg(feature = "tokio-postgres")]
impl From<::tokio_postgres::Error> for Error {
    fn from(e: ::tokio_postgres::Error) -> Self {
        Error::Postgres(e)
    }
}

#[cfg(feature = "sqlx")]
impl From<::sqlx::Error> for Error {
    fn from(e: ::sqlx::Error) -> Self {
        Error::Sqlx(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_matches_the_server() {
        assert!(JobId::from("x").validate().is_ok());
        let e = JobId::from("").validate().unwrap_err();
        assert_eq!(e.sqlstate(), Some("22023"));
        let long = "x".repeat(1025);
        assert_eq!(
            JobId::from(&long).validate().unwrap_err().sqlstate(),
            Some("22001")
        );
        assert!(JobId::from(&long[..1024]).validate().is_ok());
        assert_eq!(
            validate_scope(&"s".repeat(129)).unwrap_err().sqlstate(),
            Some("22001")
        );
        assert_eq!(
            validate_scope("a\0b").unwrap_err().sqlstate(),
            Some("22021")
        );
        assert!(JobId::from(i64::MIN).validate().is_ok());
    }

    #[test]
    fn backoff_is_bounded() {
        let o = RunOptions::new().backoff(Duration::from_millis(10), Duration::from_millis(50));
        for attempt in 1..40 {
            let d = o.delay(attempt);
            assert!(d <= Duration::from_millis(50), "{attempt}: {d:?}");
            assert!(d >= Duration::from_millis(5), "{attempt}: {d:?}");
        }
    }

    /// A lease of `duration` as `lease` returns it to a client whose clock is `skew` ahead
    /// of the server's (or behind it).
    fn skewed_lease(duration: Duration, skew_ahead: bool, skew: Duration) -> Lease {
        let server_now = if skew_ahead {
            SystemTime::now() - skew
        } else {
            SystemTime::now() + skew
        };
        let expires_at = server_now + duration;
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        match lease_status(
            "j".into(),
            "s",
            "acquired",
            Some("00000000-0000-0000-0000-000000000000".into()),
            Some(secs(expires_at)),
            None,
            Some(secs(server_now)),
            duration.as_secs_f64(),
        ) {
            Ok(LeaseStatus::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        }
    }

    /// run_leased's heartbeat on a fake lease, with an effect of `work` and an extension
    /// that fails as `fails(n)` says for its `n`th call (from 0): the outcome and the number
    /// of extensions.
    async fn heartbeats(
        lease: Lease,
        work: Duration,
        fails: impl Fn(u32) -> Option<Error>,
    ) -> (Result<LeaseOutcome, Error>, u32, bool) {
        let extends = std::sync::atomic::AtomicU32::new(0);
        let released = std::sync::atomic::AtomicBool::new(false);
        let out = drive_lease(
            lease,
            tokio::time::Instant::now(),
            |_| async move {
                tokio::time::sleep(work).await;
                Ok(None)
            },
            |_| {
                let n = extends.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let r = fails(n).map_or(Ok(()), Err);
                async move { r }
            },
            |_| {
                released.store(true, std::sync::atomic::Ordering::Relaxed);
                async { Ok(()) }
            },
            |_, _| async { Ok(()) },
        )
        .await;
        (out, extends.into_inner(), released.into_inner())
    }

    #[test]
    fn heartbeat_period_is_a_third_of_the_duration() {
        assert_eq!(
            heartbeat_period(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            heartbeat_period(Duration::from_millis(1500)),
            Duration::from_millis(500)
        );
        assert_eq!(
            heartbeat_period(Duration::from_micros(1)),
            Duration::from_millis(1)
        );
        for skew in [Duration::ZERO, Duration::from_secs(3600)] {
            for ahead in [true, false] {
                let lease = skewed_lease(Duration::from_secs(30), ahead, skew);
                assert_eq!(lease.duration(), Duration::from_secs(30));
                assert_eq!(heartbeat_period(lease.duration()), Duration::from_secs(10));
            }
        }
    }

    #[tokio::test]
    async fn heartbeat_period_ignores_the_clocks() {
        // A client clock an hour ahead: the server's expiry looks past. A 3 s lease needs no
        // heartbeat in 300 ms (not one every 10 ms).
        let lease = skewed_lease(Duration::from_secs(3), true, Duration::from_secs(3600));
        let (out, n, _) = heartbeats(lease, Duration::from_millis(300), |_| None).await;
        assert!(matches!(out, Ok(LeaseOutcome::Ran { .. })), "{out:?}");
        assert_eq!(n, 0, "a 3 s lease extended {n} times in 300 ms");
        // A client clock an hour behind: the expiry looks an hour away. A 300 ms lease is
        // extended every 100 ms (not after 20 minutes).
        let lease = skewed_lease(Duration::from_millis(300), false, Duration::from_secs(3600));
        let (out, n, _) = heartbeats(lease, Duration::from_millis(550), |_| None).await;
        assert!(matches!(out, Ok(LeaseOutcome::Ran { .. })), "{out:?}");
        assert!(
            (3..=6).contains(&n),
            "a 300 ms lease extended {n} times in 550 ms"
        );
    }

    fn lost() -> Error {
        // What the server's YD002 looks like to the heartbeat (is_lease_lost).
        Error::InvalidArgument {
            argument: "lease_id",
            sqlstate: "YD002",
            message: "lease not held".into(),
        }
    }

    #[tokio::test]
    async fn heartbeat_gives_up_only_on_a_lost_lease_or_at_the_expiry() {
        let ms = Duration::from_millis;
        let reset = || Some(Error::Protocol("connection reset".into()));
        // Two failed extensions of a 300 ms lease (at 100 and 200 ms), then one that works:
        // the effect runs to its end.
        let lease = skewed_lease(ms(300), true, Duration::ZERO);
        let (out, n, released) =
            heartbeats(lease, ms(550), |n| if n < 2 { reset() } else { None }).await;
        assert!(matches!(out, Ok(LeaseOutcome::Ran { .. })), "{out:?}");
        assert!(n >= 3 && !released, "{n} extensions, released: {released}");
        // Failing until the lease would expire: given up at the third tick (300 ms) with
        // the heartbeat's error, the lease released.
        let lease = skewed_lease(ms(300), true, Duration::ZERO);
        let start = std::time::Instant::now();
        let (out, n, released) = heartbeats(lease, ms(2000), |_| reset()).await;
        let took = start.elapsed();
        assert!(matches!(out, Err(Error::Protocol(_))), "{out:?}");
        assert!(
            (2..=3).contains(&n) && released,
            "{n} extensions, released: {released}"
        );
        assert!(took >= ms(300) && took < ms(1000), "gave up after {took:?}");
        // YD002: given up at the first tick, not released (the job is another caller's).
        let lease = skewed_lease(ms(300), true, Duration::ZERO);
        let (out, n, released) = heartbeats(lease, ms(2000), |_| Some(lost())).await;
        assert!(out.as_ref().is_err_and(Error::is_lease_lost), "{out:?}");
        assert!(n == 1 && !released, "{n} extensions, released: {released}");
    }

    #[test]
    fn transaction_aborted_is_25p02_and_not_retried() {
        let e = Error::TransactionAborted;
        assert_eq!(e.sqlstate(), Some("25P02"));
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("nothing committed"), "{e}");
    }
}

/// The examples of README.md, compiled by `cargo test --doc --all-features`.
#[cfg(all(doctest, feature = "tokio-postgres", feature = "sqlx"))]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
