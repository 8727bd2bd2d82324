//! Leases for external effects, over real connections: one winner among concurrent
//! leases, a crashed holder's lease taken over once it expires, the guide's widened gap
//! between the effect and the done marker, and dedup's own SQLSTATEs.
use crate::common::{ensure_eq, expect_sqlstate, Ctx};
use anyhow::{bail, Context, Result};
use dedup_pg_test::Conn;
use std::time::Duration;
use uuid::Uuid;

/// `dedup.lease(job, duration => d)` in its own (autocommit) transaction.
async fn lease(c: &Conn, job: &str, duration: &str) -> Result<(String, Option<Uuid>)> {
    let row = c
        .query_one(
            "SELECT status, lease_id FROM dedup.lease($1, duration => $2::text::interval)",
            &[&job, &duration],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Lease `job` from every connection at once (behind a barrier); returns the connections,
/// the lease ids of the callers that acquired, and how many were told busy.
async fn race(conns: Vec<Conn>, job: &'static str) -> Result<(Vec<Conn>, Vec<Uuid>, usize)> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(conns.len()));
    let mut tasks = Vec::new();
    for c in conns {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let got = lease(&c, job, "30 seconds").await;
            (c, got)
        }));
    }
    let mut conns = Vec::new();
    let mut acquired = Vec::new();
    let mut busy = 0;
    for t in tasks {
        let (c, got) = t.await?;
        match got? {
            (s, Some(id)) if s == "acquired" => acquired.push(id),
            (s, None) if s == "busy" => busy += 1,
            other => bail!("unexpected lease result {other:?}"),
        }
        conns.push(c);
    }
    Ok((conns, acquired, busy))
}

pub async fn concurrent_leases_of_one_job_have_one_holder(ctx: Ctx) -> Result<()> {
    const CALLERS: usize = 16;
    let mut conns = Vec::new();
    for _ in 0..CALLERS {
        conns.push(ctx.connect().await?);
    }
    let (conns, acquired, busy) = race(conns, "send-receipt-1").await?;
    ensure_eq(
        (acquired.len(), busy),
        (1, CALLERS - 1),
        "callers that acquired, told busy",
    )?;
    let holder = acquired[0];
    conns[0]
        .execute(
            "SELECT dedup.complete('send-receipt-1', $1, '{\"message_id\": \"m-77\"}')",
            &[&holder],
        )
        .await?;
    for c in &conns {
        let row = c
            .query_one(
                "SELECT status, result::text FROM dedup.lease('send-receipt-1')",
                &[],
            )
            .await?;
        let (status, result): (String, Option<String>) = (row.get(0), row.get(1));
        ensure_eq(
            (status.as_str(), result.as_deref()),
            ("done", Some("{\"message_id\": \"m-77\"}")),
            "later lease",
        )?;
    }
    Ok(())
}

pub async fn crashed_holder_lease_is_taken_over_once(ctx: Ctx) -> Result<()> {
    const CALLERS: usize = 8;
    let observer = ctx.connect().await?;
    let dead = ctx.connect().await?;
    let (status, first) = lease(&dead, "charge-1", "5 seconds").await?;
    ensure_eq(status.as_str(), "acquired", "first lease")?;
    let first = first.context("no lease id")?;
    // The holder dies before completing (its lease was committed by dedup.lease).
    observer
        .execute("SELECT pg_terminate_backend($1)", &[&dead.pid])
        .await?;
    let mut conns = Vec::new();
    for _ in 0..CALLERS {
        conns.push(ctx.connect().await?);
    }
    // While the lease lives, the job is busy.
    ensure_eq(
        lease(&conns[0], "charge-1", "30 seconds").await?.0.as_str(),
        "busy",
        "lease before expiry",
    )?;
    tokio::time::sleep(Duration::from_millis(5200)).await;
    let (conns, acquired, _busy) = race(conns, "charge-1").await?;
    ensure_eq(
        acquired.len(),
        1,
        "callers that took the expired lease over",
    )?;
    // The dead holder comes back (a stalled process) and tries to complete: refused.
    let state = expect_sqlstate(
        observer
            .execute("SELECT dedup.complete('charge-1', $1)", &[&first])
            .await,
        "late complete",
    )?;
    ensure_eq(state.as_str(), "YD002", "SQLSTATE of a late complete")?;
    conns[0]
        .execute("SELECT dedup.complete('charge-1', $1)", &[&acquired[0]])
        .await?;
    ensure_eq(
        lease(&conns[1], "charge-1", "30 seconds").await?.0.as_str(),
        "done",
        "after completion",
    )?;
    Ok(())
}

/// One handler run, as the guide writes it: lease, the external effect (an autocommit insert
/// on its own connection stands for the email or the payment), `gap`, then the done marker.
/// With `crash`, the handler dies in the gap. With `idempotency_key`, the external system
/// ignores a repeated job id.
async fn handle(
    ctx: &Ctx,
    job: &str,
    gap: Duration,
    crash: bool,
    idempotency_key: bool,
) -> Result<bool> {
    let c = ctx.connect().await?;
    let external = ctx.connect().await?;
    let (status, id) = lease(&c, job, "1 second").await?;
    if status != "acquired" {
        return Ok(false);
    }
    let effect = if idempotency_key {
        "INSERT INTO external_effects VALUES ($1) ON CONFLICT (job_id) DO NOTHING"
    } else {
        "INSERT INTO external_effects_no_key VALUES ($1)"
    };
    external.execute(effect, &[&job]).await?;
    tokio::time::sleep(gap).await;
    if crash {
        let killer = ctx.connect().await?;
        killer
            .execute("SELECT pg_terminate_backend($1)", &[&c.pid])
            .await?;
        return Ok(true);
    }
    c.execute("SELECT dedup.complete($1, $2)", &[&job, &id])
        .await?;
    Ok(true)
}

pub async fn crash_between_effect_and_done_marker_repeats_the_effect(ctx: Ctx) -> Result<()> {
    let setup = ctx.connect().await?;
    setup
        .batch_execute(
            "CREATE TABLE external_effects (job_id text PRIMARY KEY);
             CREATE TABLE external_effects_no_key (job_id text NOT NULL);",
        )
        .await?;
    let gap = Duration::from_millis(25);
    for idempotency_key in [false, true] {
        let job = format!("payment-{idempotency_key}");
        // The first handler crashes in the 25 ms gap; the lease expires; the redelivered
        // copy acquires it and runs the effect again.
        ensure_eq(
            handle(&ctx, &job, gap, true, idempotency_key).await?,
            true,
            "first handler ran",
        )?;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        ensure_eq(
            handle(&ctx, &job, gap, false, idempotency_key).await?,
            true,
            "redelivery ran",
        )?;
        ensure_eq(
            handle(&ctx, &job, gap, false, idempotency_key).await?,
            false,
            "third copy skipped",
        )?;
    }
    let without_key: i64 = setup
        .query_one("SELECT count(*) FROM external_effects_no_key", &[])
        .await?
        .get(0);
    let with_key: i64 = setup
        .query_one("SELECT count(*) FROM external_effects", &[])
        .await?
        .get(0);
    // At-least-once: the crash in the gap repeats the effect, and only an idempotency key
    // at the external system absorbs the repeat.
    ensure_eq(
        (without_key, with_key),
        (2, 1),
        "external effects (no key, with key)",
    )?;
    println!("  crash in the 25 ms gap: effect ran {without_key} times without a key, {with_key} with one");
    Ok(())
}

pub async fn leases_and_fingerprints_raise_their_own_sqlstates(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    for (sql, want) in [
        ("SELECT dedup.try_claim('o-1', 'default', 'sha-a')", None),
        ("SELECT dedup.try_claim('o-1', 'default', 'sha-a')", None),
        (
            "SELECT dedup.try_claim('o-1', 'default', 'sha-b')",
            Some("YD001"),
        ),
        (
            "SELECT * FROM dedup.lease('o-1', fingerprint => 'sha-b')",
            Some("YD001"),
        ),
        (
            "SELECT * FROM dedup.lease('o-1', fingerprint => 'sha-a')",
            None,
        ),
        (
            "SELECT dedup.complete('o-2', gen_random_uuid())",
            Some("YD002"),
        ),
        (
            "SELECT dedup.extend_lease('o-2', gen_random_uuid())",
            Some("YD002"),
        ),
        (
            "SELECT dedup.release_lease('o-2', gen_random_uuid())",
            Some("YD002"),
        ),
        ("SELECT * FROM dedup.lease(NULL)", Some("22004")),
        (
            "SELECT * FROM dedup.lease('o-3', duration => '0 seconds')",
            Some("22023"),
        ),
        (
            "SELECT * FROM dedup.lease('o-3', duration => '30 days')",
            Some("22023"),
        ),
        ("SELECT dedup.complete('o-3', NULL)", Some("22004")),
    ] {
        c.batch_execute("SET dedup.warn_outside_transaction = off")
            .await?;
        match (c.batch_execute(sql).await, want) {
            (Ok(()), None) => {}
            (result, Some(want)) => ensure_eq(expect_sqlstate(result, sql)?.as_str(), want, sql)?,
            (Err(e), None) => bail!("{sql}: {e}"),
        }
    }
    // A lease in a read-only transaction.
    c.batch_execute("BEGIN READ ONLY").await?;
    let state = expect_sqlstate(
        c.batch_execute("SELECT dedup.lease('o-4')").await,
        "read-only lease",
    )?;
    ensure_eq(state.as_str(), "25006", "lease in a read-only transaction")?;
    c.batch_execute("ROLLBACK").await?;
    Ok(())
}

/// A lease extended past its scope's retention and then completed stays done for the
/// whole retention from its completion, and an extension longer than the retention is
/// refused as a lease that long is.
pub async fn completed_lease_is_kept_for_its_retention_from_completion(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute("SELECT dedup.set_retention('r5', '5 seconds')")
        .await?;
    let row = c
        .query_one(
            "SELECT lease_id FROM dedup.lease('j', 'r5', duration => '4 seconds')",
            &[],
        )
        .await?;
    let id: Uuid = row.get(0);
    // The lease was taken 7 s ago and extended twice since (as a slow effect would).
    c.batch_execute(
        "UPDATE dedup.processed SET processed_at = now() - interval '7 seconds' WHERE scope = 'r5'",
    )
    .await?;
    c.execute(
        "SELECT dedup.extend_lease('j', $1, '4 seconds', 'r5')",
        &[&id],
    )
    .await?;
    let state = expect_sqlstate(
        c.execute(
            "SELECT dedup.extend_lease('j', $1, '10 seconds', 'r5')",
            &[&id],
        )
        .await,
        "an extension longer than the retention",
    )?;
    ensure_eq(state.as_str(), "22023", "extend_lease beyond the retention")?;
    c.execute("SELECT dedup.complete('j', $1, NULL, 'r5')", &[&id])
        .await?;
    let pruned: i64 = c.query_one("SELECT dedup.prune('r5')", &[]).await?.get(0);
    ensure_eq(pruned, 0, "claims pruned right after complete")?;
    let status: String = c
        .query_one(
            "SELECT status FROM dedup.lease('j', 'r5', duration => '4 seconds')",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(status.as_str(), "done", "a new lease of the completed job")?;
    // Once the retention has passed since completion, it is pruned as usual.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let pruned: i64 = c.query_one("SELECT dedup.prune('r5')", &[]).await?.get(0);
    ensure_eq(pruned, 1, "claims pruned a retention after complete")?;
    Ok(())
}
