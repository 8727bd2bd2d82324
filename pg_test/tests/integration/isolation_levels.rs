//! REPEATABLE READ and SERIALIZABLE: a claim committed by a concurrent transaction that the
//! caller's snapshot cannot see is a serialization failure (40001), exactly as for
//! INSERT ... ON CONFLICT DO NOTHING; retrying the transaction turns it into `false`.
use crate::common::{claim, ensure_eq, expect_sqlstate, wait_until_blocked, Ctx};
use anyhow::Result;
use std::time::Duration;

const LEVELS: [&str; 2] = ["REPEATABLE READ", "SERIALIZABLE"];

pub async fn snapshot_that_misses_a_committed_claim_gets_40001_then_false(ctx: Ctx) -> Result<()> {
    let a = ctx.connect().await?;
    let b = ctx.connect().await?;
    for (i, level) in LEVELS.iter().enumerate() {
        let key = format!("snap-{i}");
        a.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
            .await?; // snapshot taken
        b.batch_execute(&format!("BEGIN; SELECT dedup.try_claim('{key}'); COMMIT"))
            .await?;
        let state = expect_sqlstate(
            a.query_one(&format!("SELECT dedup.try_claim('{key}')"), &[])
                .await,
            level,
        )?;
        ensure_eq(state.as_str(), "40001", level)?;
        a.batch_execute("ROLLBACK").await?;
        // The retry takes a new snapshot, which sees the committed claim.
        a.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await?;
        ensure_eq(
            claim(&a, &format!("SELECT dedup.try_claim('{key}')")).await?,
            false,
            level,
        )?;
        a.batch_execute("COMMIT").await?;
        // A claim committed before the snapshot is a plain duplicate, no error.
        a.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await?;
        ensure_eq(
            claim(&a, &format!("SELECT dedup.try_claim('{key}')")).await?,
            false,
            level,
        )?;
        // Our own claim, taken earlier in this transaction, is not a conflict either.
        ensure_eq(
            claim(&a, &format!("SELECT dedup.try_claim('own-{key}')")).await?,
            true,
            level,
        )?;
        ensure_eq(
            claim(&a, &format!("SELECT dedup.try_claim('own-{key}')")).await?,
            false,
            level,
        )?;
        a.batch_execute("COMMIT").await?;
    }
    Ok(())
}

pub async fn waiting_repeatable_read_claim_gets_40001_or_true(ctx: Ctx) -> Result<()> {
    let observer = ctx.connect().await?;
    for level in LEVELS {
        for (holder_ends, want) in [("COMMIT", "40001"), ("ROLLBACK", "true")] {
            let key = format!("wait-{}-{holder_ends}", level.replace(' ', "-"));
            let holder = ctx.connect().await?;
            let waiter = ctx.connect().await?;
            waiter
                .batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1"))
                .await?;
            holder
                .batch_execute(&format!("BEGIN; SELECT dedup.try_claim('{key}')"))
                .await?;
            let pid = waiter.pid;
            let sql = format!("SELECT dedup.try_claim('{key}')");
            let task = tokio::spawn(async move {
                let r = waiter.query_one(&sql, &[]).await;
                (waiter, r)
            });
            wait_until_blocked(&observer, pid).await?;
            holder.batch_execute(holder_ends).await?;
            let (waiter, r) = tokio::time::timeout(Duration::from_secs(30), task).await??;
            let got = match r {
                Ok(row) => row.get::<_, bool>(0).to_string(),
                Err(e) => dedup_pg_test::sqlstate(&e).unwrap_or("?").to_string(),
            };
            ensure_eq(
                got.as_str(),
                want,
                &format!("{level}, holder {holder_ends}"),
            )?;
            waiter.batch_execute("ROLLBACK").await?;
        }
    }
    Ok(())
}
