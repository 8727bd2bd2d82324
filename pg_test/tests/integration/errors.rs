//! Errors and warnings as a client sees them: SQLSTATE, message, hint.
use crate::common::{claim, ensure_eq, Ctx};
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::connect_when_up;

pub async fn bad_input_over_the_wire(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let none: Option<&str> = None;
    let none_i64: Option<i64> = None;
    let long = "x".repeat(1025);
    let long = long.as_str();
    let cases: Vec<(&str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>, &str)> = vec![
        ("SELECT dedup.try_claim($1::text)", vec![&none], "22004"),
        (
            "SELECT dedup.try_claim($1::bigint)",
            vec![&none_i64],
            "22004",
        ),
        (
            "SELECT dedup.try_claim($1::text, $2::text)",
            vec![&"job", &none],
            "22004",
        ),
        ("SELECT dedup.try_claim($1::text)", vec![&""], "22023"),
        ("SELECT dedup.try_claim($1::text)", vec![&long], "22001"),
    ];
    for (sql, params, want) in cases {
        c.batch_execute("BEGIN").await?;
        let err = match c.query_one(sql, &params).await {
            Ok(row) => bail!(
                "{sql} with {params:?} returned {:?}",
                row.try_get::<_, Option<bool>>(0)
            ),
            Err(e) => e,
        };
        let db = err
            .as_db_error()
            .with_context(|| format!("{sql}: not a server error: {err}"))?;
        ensure_eq(db.code().code(), want, sql)?;
        if db.hint().unwrap_or_default().is_empty() {
            bail!("{sql}: no hint");
        }
        c.batch_execute("ROLLBACK").await?;
    }
    // A read-only transaction.
    c.batch_execute("BEGIN READ ONLY").await?;
    let err = c
        .query_one("SELECT dedup.try_claim('ro')", &[])
        .await
        .err()
        .context("read-only claim succeeded")?;
    ensure_eq(
        err.code().map(|c| c.code()),
        Some("25006"),
        "read-only transaction",
    )?;
    c.batch_execute("ROLLBACK").await?;
    Ok(())
}

fn warnings(c: &dedup_pg_test::Conn) -> Vec<String> {
    c.take_notices()
        .into_iter()
        .filter(|n| n.severity() == "WARNING")
        .map(|n| format!("{}: {}", n.code().code(), n.message()))
        .collect()
}

pub async fn warning_outside_a_transaction_block(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    // Autocommit: the claim commits alone. One WARNING per call.
    ensure_eq(
        claim(&c, "SELECT dedup.try_claim('w-1')").await?,
        true,
        "autocommit claim",
    )?;
    c.batch_execute("SELECT 1").await?;
    let w = warnings(&c);
    ensure_eq(w.len(), 1, "warnings after an autocommit claim")?;
    if !w[0].starts_with("01000: dedup.try_claim was called outside a transaction block") {
        bail!("unexpected warning {w:?}");
    }
    // Inside BEGIN ... COMMIT: silent.
    c.batch_execute("BEGIN; SELECT dedup.try_claim('w-2'); COMMIT")
        .await?;
    c.batch_execute("SELECT 1").await?;
    ensure_eq(warnings(&c), vec![], "warnings inside a transaction block")?;
    // Several statements in one simple-protocol query string share one implicit
    // transaction: the claim commits with the statements after it, so no warning.
    c.batch_execute(
        "CREATE TABLE e (j text); SELECT dedup.try_claim('w-3'); INSERT INTO e VALUES ('w-3')",
    )
    .await?;
    c.batch_execute("SELECT 1").await?;
    ensure_eq(
        warnings(&c),
        vec![],
        "warnings in a multi-statement query string",
    )?;
    // Switched off for a session that combines claim and effect in one statement.
    c.batch_execute("SET dedup.warn_outside_transaction = off")
        .await?;
    c.batch_execute(
        "WITH c AS (SELECT dedup.try_claim('w-4') AS fresh) INSERT INTO e SELECT 'w-4' FROM c WHERE fresh",
    )
    .await?;
    c.batch_execute("SELECT 1").await?;
    ensure_eq(
        warnings(&c),
        vec![],
        "warnings with dedup.warn_outside_transaction = off",
    )?;
    Ok(())
}

pub async fn standby_refuses_claims(_ctx: Ctx) -> Result<()> {
    let (primary, standby) = tokio::task::spawn_blocking(|| -> Result<(Cluster, Cluster)> {
        let primary = Cluster::start(Options::named("primary"))?;
        primary.create_db_with_extension("app")?;
        primary.psql(
            "app",
            "BEGIN; SELECT dedup.try_claim('before-standby'); COMMIT",
        )?;
        let standby = Cluster::standby_of(&primary, Options::default())?;
        Ok((primary, standby))
    })
    .await??;
    let s = connect_when_up(&standby.dsn("app")).await?;
    ensure_eq(
        claim(&s, "SELECT pg_is_in_recovery()").await?,
        true,
        "standby in recovery",
    )?;
    // The replicated claims are readable on the standby...
    let n: i64 = s
        .query_one("SELECT count(*) FROM dedup.processed", &[])
        .await?
        .get(0);
    ensure_eq(n, 1, "replicated claims")?;
    // ...but a claim is a write: refused with a hint to connect to the primary.
    s.batch_execute("BEGIN").await?;
    let err = s
        .query_one("SELECT dedup.try_claim('on-standby')", &[])
        .await
        .err()
        .context("claim on a standby succeeded")?;
    let db = err.as_db_error().context("not a server error")?;
    ensure_eq(db.code().code(), "25006", "SQLSTATE on a standby")?;
    if !db.message().contains("standby") || !db.hint().unwrap_or_default().contains("primary") {
        bail!("unexpected error on standby: {db:?}");
    }
    s.batch_execute("ROLLBACK").await?;
    drop(s);
    drop((standby, primary));
    Ok(())
}

/// Without Citus, the Citus functions exist and say what is missing (55000, with a hint);
/// distribute() is the owner's, cluster_stats() pg_monitor's.
pub async fn citus_functions_without_citus(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    for sql in [
        "SELECT dedup.distribute()",
        "SELECT * FROM dedup.cluster_stats()",
    ] {
        match c.query(sql, &[]).await {
            Ok(_) => bail!("{sql}: succeeded without Citus"),
            Err(e) => {
                let db = e.as_db_error().context("a server error")?;
                ensure_eq(db.code().code(), "55000", sql)?;
                if !db.message().contains("Citus is not installed") || db.hint().is_none() {
                    bail!("{sql}: {} (hint {:?})", db.message(), db.hint());
                }
            }
        }
    }
    // Claims, leases and results work as ever (the lease functions' Citus form is not taken).
    c.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&c, "SELECT dedup.try_claim('no-citus')").await?,
        true,
        "claim",
    )?;
    c.batch_execute("SELECT dedup.set_result('no-citus', '{\"a\": 1}'); COMMIT")
        .await?;
    let r: String = c
        .query_one(
            "SELECT result::text FROM dedup.claim_result('no-citus')",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(r.as_str(), r#"{"a": 1}"#, "claim_result")?;
    ensure_eq(
        claim(&c, "SELECT NOT dedup._distributed()").await?,
        true,
        "_distributed",
    )?;
    let (role, app) = crate::common::unprivileged(&ctx, "nocitus", "").await?;
    for sql in [
        "SELECT dedup.distribute()",
        "SELECT * FROM dedup.cluster_stats()",
    ] {
        match app.query(sql, &[]).await {
            Ok(_) => bail!("{sql}: allowed for {role}"),
            Err(e) => ensure_eq(dedup_pg_test::sqlstate(&e), Some("42501"), sql)?,
        }
    }
    Ok(())
}
