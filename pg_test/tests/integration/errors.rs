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

/// Each error names what is at fault (found while writing docs/reference/): a NULL
/// lease_id is 22004 for every lease function, not a lost lease (YD002 "lease  on job");
/// another holder's lease_id is not reported as an expired lease, nor a job never leased as
/// released; dedup.prune and dedup.advance in a read-only transaction say they cannot prune
/// or advance (not "claim"); claim_result of a NULL job id is 22004, not "no result"; a NULL fingerprints array and a
/// long stream name get hints of their own, not the job id's; "1 element"; and a claim
/// table altered by hand is reported by the function that found it.
pub async fn each_error_names_what_is_at_fault(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    /// The error of `sql`, which must fail: (SQLSTATE, message, hint).
    async fn error_of(c: &dedup_pg_test::Conn, sql: &str) -> Result<(String, String, String)> {
        match c.batch_execute(sql).await {
            Ok(()) => bail!("{sql}: succeeded"),
            Err(e) => {
                let db = e.as_db_error().with_context(|| format!("{sql}: {e}"))?;
                Ok((
                    db.code().code().to_string(),
                    db.message().to_string(),
                    db.hint().unwrap_or_default().to_string(),
                ))
            }
        }
    }
    c.batch_execute("SELECT lease_id FROM dedup.lease('fault-1', 'faults', '1 hour')")
        .await?;
    for func in ["extend_lease", "release_lease", "complete"] {
        let (code, msg, _) = error_of(
            &c,
            &format!("SELECT dedup.{func}('fault-1', NULL, scope => 'faults')"),
        )
        .await?;
        ensure_eq(code.as_str(), "22004", func)?;
        ensure_eq(
            msg.as_str(),
            format!("dedup.{func}: lease_id must not be NULL").as_str(),
            func,
        )?;
    }
    // A lease_id that is not the live holder's.
    let (code, msg, _) = error_of(
        &c,
        "SELECT dedup.complete('fault-1', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', NULL, 'faults')",
    )
    .await?;
    ensure_eq(code.as_str(), "YD002", "complete with another lease_id")?;
    if msg.contains("it expired and another caller took the job over") {
        bail!("another holder's live lease reported as an expired one: {msg}");
    }
    c.batch_execute("BEGIN READ ONLY").await?;
    let (code, msg, hint) = error_of(&c, "SELECT dedup.prune()").await?;
    c.batch_execute("ROLLBACK").await?;
    ensure_eq(code.as_str(), "25006", "prune, read only")?;
    ensure_eq(
        msg.as_str(),
        "dedup.prune: cannot prune in a read-only transaction",
        "prune, read only",
    )?;
    if hint.contains("claim and its effect") {
        bail!("prune's read-only hint speaks of claims: {hint}");
    }
    c.batch_execute("BEGIN READ ONLY").await?;
    let (code, msg, _) = error_of(&c, "SELECT dedup.advance('faults', 0, 1)").await?;
    c.batch_execute("ROLLBACK").await?;
    ensure_eq(code.as_str(), "25006", "advance, read only")?;
    ensure_eq(
        msg.as_str(),
        "dedup.advance: cannot advance in a read-only transaction",
        "advance, read only",
    )?;
    // A NULL job id is an error, not "no result" (which reads as "not done").
    for sql in [
        "SELECT * FROM dedup.claim_result(NULL)",
        "SELECT * FROM dedup.claim_result('fault-1', NULL)",
    ] {
        let (code, _, _) = error_of(&c, sql).await?;
        ensure_eq(code.as_str(), "22004", sql)?;
    }
    let (code, msg, _) = error_of(
        &c,
        "SELECT dedup.complete('never-leased', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', NULL, 'faults')",
    )
    .await?;
    ensure_eq(code.as_str(), "YD002", "complete of a job never leased")?;
    if !msg.contains("never leased") {
        bail!("a job never leased: {msg}");
    }
    let (code, _, hint) = error_of(
        &c,
        "SELECT dedup.try_claim_many(ARRAY['a'], 'faults', NULL::text[])",
    )
    .await?;
    ensure_eq(code.as_str(), "22004", "NULL fingerprints")?;
    if !hint.contains("fingerprint") {
        bail!("a NULL fingerprints array gets the hint {hint:?}");
    }
    let (code, _, hint) = error_of(
        &c,
        &format!("SELECT dedup.advance('{}', 0, 1)", "s".repeat(129)),
    )
    .await?;
    ensure_eq(code.as_str(), "22001", "long stream")?;
    if !hint.contains("stream") || hint.contains("digest") {
        bail!("a long stream name gets the hint {hint:?}");
    }
    let (_, msg, _) = error_of(
        &c,
        "SELECT dedup.try_claim_many(ARRAY['a', 'b'], 'faults', ARRAY['f'])",
    )
    .await?;
    ensure_eq(
        msg.as_str(),
        "dedup.try_claim_many: fingerprints has 1 element, job_ids 2",
        "lengths",
    )?;
    // The portable edition gets PostgreSQL's own errors for an altered table (docs/portable.md).
    if dedup_pg_test::cluster::edition() == dedup_pg_test::cluster::Edition::Native {
        for (sql, func) in [
            ("SELECT dedup.prune()", "dedup.prune"),
            (
                "SELECT dedup.try_claim_many(ARRAY['a'], 'faults')",
                "dedup.try_claim_many",
            ),
        ] {
            c.batch_execute("BEGIN; ALTER TABLE dedup.processed ADD COLUMN extra int")
                .await?;
            let (code, msg, _) = error_of(&c, sql).await?;
            c.batch_execute("ROLLBACK").await?;
            ensure_eq(code.as_str(), "55000", sql)?;
            if !msg.starts_with(&format!("{func}: ")) {
                bail!("{sql} on an altered table: {msg}");
            }
        }
    }
    Ok(())
}
