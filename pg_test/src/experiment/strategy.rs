//! The deduplication strategies, each written as the guide writes it, plus
//! `dedup.try_claim` in the transaction of the effect.
//!
//! A strategy is one entry of [`STRATEGIES`]: a key for the command line, a title for the
//! table, the guide's numbers, and an async handler that gets one job id and returns what
//! happened. Adding a strategy is one handler function plus one entry.
//!
//! Every strategy runs the same side effect, [`effect`]: the handler's simulated work
//! (`--work-ms`) and then one row in `effects`, the table the experiment counts.
use anyhow::Result;
use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use std::time::Duration;
use tokio_postgres::{Client, Statement};

/// What a handler did with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Ran the effect; the message is acknowledged.
    Done,
    /// Did not run the effect, because the job is done or claimed; the message is
    /// acknowledged (the guide's diagnostic hook counts these).
    Skipped,
    /// Did not run the effect, because someone else holds a lease on the job; the message is
    /// left unacknowledged, so it is reclaimed later and retried if the holder died.
    Busy,
}

/// What every handler task of a consumer shares: its name and the settings.
pub struct Env {
    pub consumer: String,
    /// The handler's simulated work before its effect row (`--work-ms`).
    pub work: Duration,
    /// The leased claim's lifetime (`SET NX PX`).
    pub lease_ms: u64,
    /// The widened gap between the effect and the done marker (`--marker-gap-ms`).
    pub marker_gap: Duration,
    /// `dedup.try_claim`'s scope: one per run, so runs never see each other's claims.
    pub scope: String,
}

/// The connections of one handler task: a Redis connection of its own (its blocking
/// XREADGROUP must not hold up the other tasks' commands) and a PostgreSQL connection with
/// the statements prepared.
pub struct Conns {
    pub redis: MultiplexedConnection,
    pub client: Client,
    insert_effect: Statement,
    insert_processed: Statement,
    try_claim: Statement,
    lease: Statement,
    complete: Statement,
}

impl Conns {
    pub async fn prepare(redis: MultiplexedConnection, client: Client) -> Result<Conns> {
        let insert_effect = client
            .prepare("INSERT INTO effects (job_id, consumer) VALUES ($1, $2)")
            .await?;
        // The guide's section 4, verbatim.
        let insert_processed = client
            .prepare(
                "INSERT INTO processed(job_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING job_id",
            )
            .await?;
        let try_claim = client
            .prepare("SELECT dedup.try_claim($1::bigint, $2::text)")
            .await?;
        let lease = client
            .prepare(
                "SELECT status, lease_id FROM dedup.lease($1::bigint::text, $2::text, \
                 pg_catalog.make_interval(secs => $3::float8 / 1000))",
            )
            .await?;
        let complete = client
            .prepare("SELECT dedup.complete($1::bigint::text, $2::uuid, NULL, $3::text)")
            .await?;
        Ok(Conns {
            redis,
            client,
            insert_effect,
            insert_processed,
            try_claim,
            lease,
            complete,
        })
    }
}

pub type Handle = for<'a> fn(&'a Env, &'a Conns, i64) -> BoxFuture<'a, Result<Outcome>>;

/// The guide's numbers for a strategy (3,000 jobs, 60 handlers), as its table gives them.
#[derive(Clone, Copy, Debug)]
pub struct Guide {
    pub duplicates: &'static str,
    pub missing_after_crash: &'static str,
    pub duplicates_after_crash: &'static str,
}

pub struct Strategy {
    /// Command-line name (`--strategies none,try-claim`).
    pub key: &'static str,
    /// Row title in the table.
    pub title: &'static str,
    pub guide: Guide,
    pub handle: Handle,
}

const NOT_IN_GUIDE: Guide = Guide {
    duplicates: "",
    missing_after_crash: "",
    duplicates_after_crash: "",
};

/// Every strategy, in the guide's order, then dedup's.
pub const STRATEGIES: &[Strategy] = &[
    Strategy {
        key: "none",
        title: "none",
        guide: Guide {
            duplicates: "3,000",
            missing_after_crash: "0",
            ..NOT_IN_GUIDE
        },
        handle: |env, c, job| Box::pin(none(env, c, job)),
    },
    Strategy {
        key: "check-then-act",
        title: "check done marker, then act",
        guide: Guide {
            duplicates: "2,101",
            missing_after_crash: "-",
            ..NOT_IN_GUIDE
        },
        handle: |env, c, job| Box::pin(check_then_act(env, c, job)),
    },
    Strategy {
        key: "set-nx",
        title: "claim with SET NX, then act",
        guide: Guide {
            duplicates: "0",
            missing_after_crash: "15-20",
            ..NOT_IN_GUIDE
        },
        handle: |env, c, job| Box::pin(set_nx(env, c, job)),
    },
    Strategy {
        key: "lease",
        title: "leased claim + done marker",
        guide: Guide {
            duplicates: "0",
            missing_after_crash: "0",
            ..NOT_IN_GUIDE
        },
        handle: |env, c, job| Box::pin(leased(env, c, job, Duration::ZERO)),
    },
    Strategy {
        key: "lease-gap",
        title: "leased claim + done marker, widened gap",
        guide: Guide {
            duplicates: "",
            missing_after_crash: "",
            duplicates_after_crash: "13-20",
        },
        handle: |env, c, job| Box::pin(leased(env, c, job, env.marker_gap)),
    },
    Strategy {
        key: "processed-tx",
        title: "dedup key + effect in one transaction",
        guide: Guide {
            duplicates: "0",
            missing_after_crash: "0",
            ..NOT_IN_GUIDE
        },
        handle: |env, c, job| Box::pin(processed_in_transaction(env, c, job)),
    },
    Strategy {
        key: "try-claim",
        title: "dedup.try_claim + effect in one transaction",
        guide: NOT_IN_GUIDE,
        handle: |env, c, job| Box::pin(try_claim_in_transaction(env, c, job)),
    },
    Strategy {
        key: "dedup-lease",
        title: "dedup.lease + dedup.complete",
        guide: NOT_IN_GUIDE,
        handle: |env, c, job| Box::pin(dedup_lease(env, c, job, Duration::ZERO)),
    },
    Strategy {
        key: "dedup-lease-gap",
        title: "dedup.lease + dedup.complete, widened gap",
        guide: NOT_IN_GUIDE,
        handle: |env, c, job| Box::pin(dedup_lease(env, c, job, env.marker_gap)),
    },
    Strategy {
        key: "offsets",
        title: "dedup.advance, offsets per partition",
        guide: NOT_IN_GUIDE,
        handle: |env, c, job| Box::pin(per_partition(env, c, job)),
    },
];

/// The strategy named `key`.
/// The `offsets` strategy has no per-message handler: its consumers read partitions
/// (super::offsets).
async fn per_partition(_env: &Env, _c: &Conns, _job: i64) -> Result<Outcome> {
    anyhow::bail!("the offsets strategy reads partitions, not messages")
}

pub fn by_key(key: &str) -> Option<&'static Strategy> {
    STRATEGIES.iter().find(|s| s.key == key)
}

/// The side effect (the guide's `send_receipt`): the simulated work, then one row in
/// `effects` per execution. In the transaction strategies it runs inside the transaction.
async fn effect(env: &Env, c: &Conns, job: i64) -> Result<()> {
    if !env.work.is_zero() {
        tokio::time::sleep(env.work).await;
    }
    c.client
        .execute(&c.insert_effect, &[&job, &env.consumer])
        .await?;
    Ok(())
}

async fn exists(c: &Conns, key: &str) -> Result<bool> {
    let mut r = c.redis.clone();
    Ok(redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut r)
        .await?
        > 0)
}

/// `SET key value <args...>`: true when Redis answered OK (false for NX on an existing key).
async fn set(c: &Conns, key: &str, value: &str, args: &[&str]) -> Result<bool> {
    let mut r = c.redis.clone();
    let reply: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg(args)
        .query_async(&mut r)
        .await?;
    Ok(reply.is_some())
}

/// No deduplication: every delivery runs the effect.
async fn none(env: &Env, c: &Conns, job: i64) -> Result<Outcome> {
    effect(env, c, job).await?;
    Ok(Outcome::Done)
}

/// Section 2: skip if marked done, mark done afterwards (a read, then a write: racy).
async fn check_then_act(env: &Env, c: &Conns, job: i64) -> Result<Outcome> {
    let done = format!("done:{job}");
    if exists(c, &done).await? {
        return Ok(Outcome::Skipped);
    }
    effect(env, c, job).await?;
    set(c, &done, "1", &["EX", "86400"]).await?;
    Ok(Outcome::Done)
}

/// Section 3, first listing: a permanent claim before the work; the message is
/// acknowledged either way.
async fn set_nx(env: &Env, c: &Conns, job: i64) -> Result<Outcome> {
    if set(c, &format!("claim:{job}"), "1", &["NX", "EX", "86400"]).await? {
        effect(env, c, job).await?;
        return Ok(Outcome::Done);
    }
    Ok(Outcome::Skipped)
}

/// Section 3, second listing: a leased claim (`PX`) and a done marker written after the
/// effect. A copy that loses the claim leaves its message unacknowledged. `gap` widens the
/// window between the effect and the marker (section 4's 25 ms experiment).
async fn leased(env: &Env, c: &Conns, job: i64, gap: Duration) -> Result<Outcome> {
    let done = format!("done:{job}");
    if exists(c, &done).await? {
        return Ok(Outcome::Skipped);
    }
    let lease = env.lease_ms.to_string();
    let claim = format!("claim:{job}");
    if !set(c, &claim, &env.consumer, &["NX", "PX", &lease]).await? {
        return Ok(Outcome::Busy);
    }
    effect(env, c, job).await?;
    if !gap.is_zero() {
        tokio::time::sleep(gap).await;
    }
    set(c, &done, "1", &["EX", "86400"]).await?;
    Ok(Outcome::Done)
}

/// Run `body` between BEGIN and COMMIT; ROLLBACK if it fails.
async fn in_transaction<'a>(
    c: &'a Conns,
    body: impl std::future::Future<Output = Result<Outcome>> + 'a,
) -> Result<Outcome> {
    c.client.batch_execute("BEGIN").await?;
    match body.await {
        Ok(outcome) => {
            c.client.batch_execute("COMMIT").await?;
            Ok(outcome)
        }
        Err(e) => {
            let _ = c.client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// Section 4: the guide's hand-written dedup key, in the transaction of the effect.
async fn processed_in_transaction(env: &Env, c: &Conns, job: i64) -> Result<Outcome> {
    in_transaction(c, async {
        let fresh = c.client.query_opt(&c.insert_processed, &[&job]).await?;
        if fresh.is_none() {
            return Ok(Outcome::Skipped); // already done, by someone, atomically
        }
        effect(env, c, job).await?;
        Ok(Outcome::Done)
    })
    .await
}

/// dedup: `dedup.try_claim` in the transaction of the effect.
async fn try_claim_in_transaction(env: &Env, c: &Conns, job: i64) -> Result<Outcome> {
    in_transaction(c, async {
        let fresh: bool = c
            .client
            .query_one(&c.try_claim, &[&job, &env.scope])
            .await?
            .get(0);
        if !fresh {
            return Ok(Outcome::Skipped);
        }
        effect(env, c, job).await?;
        Ok(Outcome::Done)
    })
    .await
}

/// dedup's leased claim with a done marker (the guide's section 3, with PostgreSQL instead
/// of Redis): `dedup.lease` in a transaction of its own, the effect outside any
/// transaction (it stands for an external call), then `dedup.complete`. Busy: leave the
/// message unacknowledged. A lease lost before `complete` (YD002) is an error: the message
/// stays unacknowledged, and its redelivery finds the job done.
async fn dedup_lease(env: &Env, c: &Conns, job: i64, gap: Duration) -> Result<Outcome> {
    let row = c
        .client
        .query_one(&c.lease, &[&job, &env.scope, &(env.lease_ms as f64)])
        .await?;
    let status: String = row.get(0);
    match status.as_str() {
        "done" => return Ok(Outcome::Skipped),
        "busy" => return Ok(Outcome::Busy),
        _ => {}
    }
    let lease_id: uuid::Uuid = row.get(1);
    effect(env, c, job).await?;
    if !gap.is_zero() {
        tokio::time::sleep(gap).await;
    }
    c.client
        .execute(&c.complete, &[&job, &lease_id, &env.scope])
        .await?;
    Ok(Outcome::Done)
}
