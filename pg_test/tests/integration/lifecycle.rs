//! The extension's table under changes a session does not see coming: the extension
//! dropped and created again while a session that already claimed stays connected, and
//! a table altered by hand.
use crate::common::{claim, ensure_eq, expect_sqlstate, Ctx};
use anyhow::Result;

pub async fn extension_recreated_under_a_live_session(ctx: Ctx) -> Result<()> {
    let worker = ctx.connect().await?;
    let admin = ctx.connect().await?;
    worker.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&worker, "SELECT dedup.try_claim('before')").await?,
        true,
        "first claim",
    )?;
    worker.batch_execute("COMMIT").await?;
    admin
        .batch_execute("DROP EXTENSION dedup; CREATE EXTENSION dedup")
        .await?;
    // The worker's session cached the old table; it must find the new one.
    worker.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&worker, "SELECT dedup.try_claim('before')").await?,
        true,
        "claim in the new table",
    )?;
    ensure_eq(
        claim(&worker, "SELECT dedup.try_claim('before')").await?,
        false,
        "duplicate in the new table",
    )?;
    worker.batch_execute("COMMIT").await?;
    // Statistics updates invalidate the table's cache entry too: claims go on.
    admin
        .batch_execute("VACUUM ANALYZE dedup.processed")
        .await?;
    worker.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&worker, "SELECT dedup.try_claim('after-vacuum')").await?,
        true,
        "claim after VACUUM",
    )?;
    worker.batch_execute("COMMIT").await?;
    Ok(())
}

pub async fn altered_table_is_refused(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    // An added column, then the same column dropped (it still occupies its slot in the row).
    for alter in ["ADD COLUMN note text", "DROP COLUMN note"] {
        c.batch_execute(&format!("ALTER TABLE dedup.processed {alter}"))
            .await?;
        c.batch_execute("BEGIN").await?;
        let state = expect_sqlstate(c.query_one("SELECT dedup.try_claim('x')", &[]).await, alter)?;
        ensure_eq(
            state.as_str(),
            "55000",
            &format!("claim after ALTER TABLE ... {alter}"),
        )?;
        c.batch_execute("ROLLBACK").await?;
    }
    Ok(())
}

pub async fn claims_go_on_while_the_table_is_truncated_and_vacuumed(ctx: Ctx) -> Result<()> {
    let claimer = ctx.connect().await?;
    let maintainer = ctx.connect().await?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let maintenance = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rounds = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Each sends relation-cache invalidations for dedup.processed.
                maintainer.batch_execute("TRUNCATE dedup.processed").await?;
                maintainer
                    .batch_execute("VACUUM ANALYZE dedup.processed")
                    .await?;
                rounds += 1;
            }
            anyhow::Ok(rounds)
        }
    });
    let stmt = claimer
        .prepare("SELECT dedup.try_claim($1::bigint)")
        .await?;
    let mut errors = Vec::new();
    for job in 0..3000i64 {
        claimer.batch_execute("BEGIN").await?;
        if let Err(e) = claimer.query_one(&stmt, &[&job]).await {
            errors.push(e.to_string());
            claimer.batch_execute("ROLLBACK").await?;
            continue;
        }
        claimer.batch_execute("COMMIT").await?;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = maintenance.await??;
    println!("  3000 claims during {rounds} rounds of TRUNCATE and VACUUM ANALYZE");
    ensure_eq(
        errors.len(),
        0,
        &format!("claims that failed ({:?})", errors.first()),
    )?;
    ensure_eq(rounds > 10, true, "maintenance rounds while claiming")
}

/// The primary key is the only arbiter. A unique index a superuser adds does not turn a
/// claim of a new job into `false`: the insert meets that index as
/// `INSERT ... ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING` would (23505).
pub async fn only_the_primary_key_decides_a_claim(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute(
        "CREATE UNIQUE INDEX processed_job_only ON dedup.processed (job_id);
         BEGIN; SELECT dedup.try_claim('x', 'a'); COMMIT;",
    )
    .await?;
    c.batch_execute("BEGIN").await?;
    let state = expect_sqlstate(
        c.query_one("SELECT dedup.try_claim('x', 'b')", &[]).await,
        "a claim of a job never claimed in scope b",
    )?;
    ensure_eq(
        state.as_str(),
        "23505",
        "claim meeting a foreign unique index",
    )?;
    c.batch_execute("ROLLBACK; DROP INDEX dedup.processed_job_only")
        .await?;
    c.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&c, "SELECT dedup.try_claim('x', 'b')").await?,
        true,
        "the same claim without that index",
    )?;
    c.batch_execute("COMMIT").await?;
    Ok(())
}

/// A claim table that is not a plain heap table (here partitioned, with the same columns
/// and key) is refused with a clear error, by claims and by prune.
pub async fn a_partitioned_claim_table_is_refused(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute(
        "ALTER EXTENSION dedup DROP TABLE dedup.processed;
         ALTER TABLE dedup.processed RENAME TO processed_old;
         CREATE TABLE dedup.processed (LIKE dedup.processed_old INCLUDING ALL) PARTITION BY HASH (job_id);
         CREATE TABLE dedup.processed_p0 PARTITION OF dedup.processed FOR VALUES WITH (MODULUS 1, REMAINDER 0);",
    )
    .await?;
    for sql in ["SELECT dedup.try_claim('x')", "SELECT dedup.prune()"] {
        c.batch_execute("BEGIN").await?;
        let state = expect_sqlstate(c.query_one(sql, &[]).await, sql)?;
        ensure_eq(state.as_str(), "55000", sql)?;
        c.batch_execute("ROLLBACK").await?;
    }
    Ok(())
}
