//! Two copies of a job in flight at once, and many copies from many connections.
use crate::common::{claim, ensure_eq, wait_until_blocked, Ctx};
use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use std::time::Duration;

/// Session B's claim of a key that session A holds blocks until A ends.
async fn race(ctx: &Ctx, key: &str, a_ends_with: &str) -> Result<bool> {
    let a = ctx.connect().await?;
    let b = ctx.connect().await?;
    let observer = ctx.connect().await?;
    a.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&a, &format!("SELECT dedup.try_claim('{key}')")).await?,
        true,
        "A's claim",
    )?;
    b.batch_execute("BEGIN").await?;
    let b_pid = b.pid;
    let sql = format!("SELECT dedup.try_claim('{key}')");
    let b_claim = tokio::spawn(async move {
        let r = claim(&b, &sql).await;
        (b, r)
    });
    wait_until_blocked(&observer, b_pid).await?;
    // Still blocked a moment later: B is really waiting for A, not for anything else.
    tokio::time::sleep(Duration::from_millis(200)).await;
    if b_claim.is_finished() {
        bail!("B's claim returned while A's transaction was open");
    }
    a.batch_execute(a_ends_with).await?;
    let (b, got) = tokio::time::timeout(Duration::from_secs(30), b_claim).await??;
    b.batch_execute("COMMIT").await?;
    got
}

pub async fn second_session_waits_then_gets_false_after_commit(ctx: Ctx) -> Result<()> {
    ensure_eq(
        race(&ctx, "job-c", "COMMIT").await?,
        false,
        "B after A committed",
    )?;
    let c = ctx.connect().await?;
    ensure_eq(
        claim(
            &c,
            "SELECT count(*) = 1 FROM dedup.processed WHERE job_id = 'job-c'",
        )
        .await?,
        true,
        "one claim row",
    )
}

pub async fn second_session_waits_then_gets_true_after_rollback(ctx: Ctx) -> Result<()> {
    ensure_eq(
        race(&ctx, "job-r", "ROLLBACK").await?,
        true,
        "B after A rolled back",
    )?;
    // B committed its claim: a third copy is a duplicate.
    let c = ctx.connect().await?;
    c.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&c, "SELECT dedup.try_claim('job-r')").await?,
        false,
        "third copy",
    )?;
    c.batch_execute("COMMIT").await?;
    Ok(())
}

pub async fn savepoint_rollback_releases_the_claim_to_a_waiter(ctx: Ctx) -> Result<()> {
    let a = ctx.connect().await?;
    let b = ctx.connect().await?;
    let observer = ctx.connect().await?;
    // Within one session: a claim rolled back to a savepoint can be taken again.
    a.batch_execute("BEGIN; SAVEPOINT s1").await?;
    ensure_eq(
        claim(&a, "SELECT dedup.try_claim('sp')").await?,
        true,
        "claim in savepoint",
    )?;
    a.batch_execute("ROLLBACK TO SAVEPOINT s1").await?;
    ensure_eq(
        claim(&a, "SELECT dedup.try_claim('sp')").await?,
        true,
        "claim after ROLLBACK TO",
    )?;
    a.batch_execute("COMMIT").await?;

    // Across sessions: B waits on A's claim made inside a savepoint and gets it as soon as
    // A rolls back to the savepoint, while A's transaction is still open.
    a.batch_execute("BEGIN; SAVEPOINT s1").await?;
    ensure_eq(
        claim(&a, "SELECT dedup.try_claim('sp2')").await?,
        true,
        "A's claim",
    )?;
    b.batch_execute("BEGIN").await?;
    let b_pid = b.pid;
    let b_claim = tokio::spawn(async move {
        let r = claim(&b, "SELECT dedup.try_claim('sp2')").await;
        (b, r)
    });
    wait_until_blocked(&observer, b_pid).await?;
    a.batch_execute("ROLLBACK TO SAVEPOINT s1").await?;
    let (b, got) = tokio::time::timeout(Duration::from_secs(30), b_claim).await??;
    ensure_eq(got?, true, "B after A's ROLLBACK TO SAVEPOINT")?;
    b.batch_execute("COMMIT").await?;
    ensure_eq(
        claim(&a, "SELECT dedup.try_claim('sp2')").await?,
        false,
        "A again, after B committed",
    )?;
    a.batch_execute("COMMIT").await?;
    Ok(())
}

pub async fn thirty_two_connections_claim_two_thousand_jobs(ctx: Ctx) -> Result<()> {
    const CONNECTIONS: usize = 32;
    const JOBS: i64 = 2000;
    let setup = ctx.connect().await?;
    setup
        .batch_execute("CREATE TABLE effects (job_id bigint NOT NULL, worker int NOT NULL)")
        .await?;
    let mut tasks = Vec::new();
    for worker in 0..CONNECTIONS as i32 {
        let c = ctx.connect().await?;
        tasks.push(tokio::spawn(async move {
            let mut jobs: Vec<i64> = (1..=JOBS).collect();
            jobs.shuffle(&mut rand::rng());
            c.batch_execute("SET synchronous_commit = off").await?;
            let claim_stmt = c
                .prepare("SELECT dedup.try_claim($1::bigint, 'thirty-two')")
                .await?;
            let effect = c
                .prepare("INSERT INTO effects (job_id, worker) VALUES ($1, $2)")
                .await?;
            let mut won = 0u64;
            for job in jobs {
                c.batch_execute("BEGIN").await?;
                let fresh: bool = c.query_one(&claim_stmt, &[&job]).await?.get(0);
                if fresh {
                    c.execute(&effect, &[&job, &worker]).await?;
                    won += 1;
                }
                c.batch_execute("COMMIT").await?;
            }
            anyhow::Ok(won)
        }));
    }
    let mut winners = 0;
    for t in tasks {
        winners += t.await??;
    }
    ensure_eq(winners, JOBS as u64, "claims that returned true")?;
    let row = setup
        .query_one(
            "SELECT count(*), count(DISTINCT job_id), min(job_id), max(job_id), count(DISTINCT worker) FROM effects",
            &[],
        )
        .await?;
    ensure_eq(row.get::<_, i64>(0), JOBS, "effect rows")?;
    ensure_eq(row.get::<_, i64>(1), JOBS, "distinct jobs with an effect")?;
    ensure_eq(
        (row.get::<_, i64>(2), row.get::<_, i64>(3)),
        (1, JOBS),
        "job range",
    )?;
    println!(
        "  32 connections: {} workers won at least one job",
        row.get::<_, i64>(4)
    );
    let claims: i64 = setup
        .query_one(
            "SELECT count(*) FROM dedup.processed WHERE scope = 'thirty-two'",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(claims, JOBS, "claim rows")
}

pub async fn terminated_backend_releases_its_claim(ctx: Ctx) -> Result<()> {
    let a = ctx.connect().await?;
    let b = ctx.connect().await?;
    let observer = ctx.connect().await?;
    observer
        .batch_execute("CREATE TABLE effects (job_id text)")
        .await?;
    a.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&a, "SELECT dedup.try_claim('term')").await?,
        true,
        "A's claim",
    )?;
    a.batch_execute("INSERT INTO effects VALUES ('term by A')")
        .await?;
    b.batch_execute("BEGIN").await?;
    let b_pid = b.pid;
    let b_claim = tokio::spawn(async move {
        let r = claim(&b, "SELECT dedup.try_claim('term')").await;
        (b, r)
    });
    wait_until_blocked(&observer, b_pid).await?;
    // The consumer dies mid-transaction, after its claim and effect.
    ensure_eq(
        claim(
            &observer,
            &format!("SELECT pg_terminate_backend({})", a.pid),
        )
        .await?,
        true,
        "pg_terminate_backend",
    )?;
    let (b, got) = tokio::time::timeout(Duration::from_secs(30), b_claim).await??;
    ensure_eq(got?, true, "B's claim after A was terminated")?;
    b.batch_execute("INSERT INTO effects VALUES ('term by B'); COMMIT")
        .await?;
    if a.batch_execute("SELECT 1").await.is_ok() {
        bail!("A's connection survived pg_terminate_backend");
    }
    let effects: Vec<String> = observer
        .query("SELECT job_id FROM effects ORDER BY 1", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(effects, vec!["term by B".to_string()], "effects")
}
