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
