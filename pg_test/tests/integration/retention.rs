//! Retention over real connections: who may prune, warnings for a retention that defeats
//! deduplication, and claims racing a prune of their own keys.
use crate::common::{claim, ensure_eq, expect_sqlstate, unprivileged, Ctx};
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;

pub async fn prune_and_set_retention_are_for_privileged_roles(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let role = format!("ops_{}", ctx.db);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             INSERT INTO dedup.processed VALUES ('default', 'old', now() - interval '8 days');"
        ))
        .await?;
    let w = ctx.connect_as(&role).await?;
    for sql in [
        "SELECT dedup.prune()",
        "SELECT dedup.set_retention('x', '1 day')",
        "SELECT * FROM dedup.prune_status",
        "DELETE FROM dedup.scope_retention",
        "INSERT INTO dedup.scope_retention VALUES ('x', '1 second')",
    ] {
        let state = expect_sqlstate(w.batch_execute(sql).await, sql)?;
        ensure_eq(state.as_str(), "42501", sql)?;
    }
    // Anyone may read the retention in force.
    let r: String = w
        .query_one("SELECT dedup.retention('x')::text", &[])
        .await?
        .get(0);
    ensure_eq(
        r.as_str(),
        "7 days",
        "dedup.retention as an unprivileged role",
    )?;
    // Granted, the functions work (SECURITY DEFINER: no privilege on the tables needed).
    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION dedup.prune(text, bigint), dedup.set_retention(text, interval) TO {role};
             GRANT pg_monitor TO {role};"
        ))
        .await?;
    w.batch_execute("SELECT dedup.set_retention('x', '1 day')")
        .await?;
    let n: i64 = w.query_one("SELECT dedup.prune()", &[]).await?.get(0);
    ensure_eq(n, 1, "claims pruned by a granted role")?;
    let by: String = w
        .query_one(
            "SELECT pruned_by FROM dedup.prune_status WHERE scope IS NULL",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(by.as_str(), role.as_str(), "prune_status.pruned_by")?;
    Ok(())
}

pub async fn a_retention_under_a_minute_warns(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    // A setting is checked once the library is loaded in the session (as with preloading).
    c.batch_execute("LOAD 'dedup'").await?;
    let warned = |c: &dedup_pg_test::Conn| {
        c.take_notices()
            .iter()
            .any(|n| n.severity() == "WARNING" && n.message().contains("shorter than a minute"))
    };
    for (sql, warns) in [
        ("SELECT dedup.set_retention('q', '10 seconds')", true),
        ("SELECT dedup.set_retention('q', '5 minutes')", false),
        (
            &format!("ALTER DATABASE {} SET dedup.retention = '10s'", ctx.db) as &str,
            true,
        ),
        (
            &format!("ALTER DATABASE {} SET dedup.retention = '2min'", ctx.db),
            false,
        ),
        // And every manual prune with such a retention (in a new session: a database's
        // setting applies from the next connection on).
        ("SELECT dedup.prune()", false),
        (
            &format!("ALTER DATABASE {} SET dedup.retention = '20s'", ctx.db),
            true,
        ),
    ] {
        c.batch_execute(sql).await?;
        c.batch_execute("SELECT 1").await?;
        ensure_eq(warned(&c), warns, sql)?;
    }
    let c = ctx.connect().await?;
    c.batch_execute("SELECT dedup.prune(); SELECT 1").await?;
    ensure_eq(warned(&c), true, "dedup.prune() with a retention of 20 s")?;
    c.batch_execute(&format!("ALTER DATABASE {} RESET dedup.retention", ctx.db))
        .await?;
    Ok(())
}

pub async fn claims_racing_a_prune_of_their_keys_have_one_winner(ctx: Ctx) -> Result<()> {
    const KEYS: i64 = 5000;
    const CLAIMERS: usize = 8;
    let admin = ctx.connect().await?;
    admin
        .batch_execute(&format!(
            "INSERT INTO dedup.processed SELECT 'race', 'k-' || g, now() - interval '8 days' \
             FROM generate_series(1, {KEYS}) g"
        ))
        .await?;
    let pruner = ctx.connect().await?;
    pruner
        .batch_execute("SET dedup.prune_batch_size = 200")
        .await?;
    let prune = tokio::spawn(async move {
        let n: i64 = pruner
            .query_one("SELECT dedup.prune('race')", &[])
            .await?
            .get(0);
        anyhow::Ok(n)
    });
    let mut tasks = Vec::new();
    for _ in 0..CLAIMERS {
        let c = ctx.connect().await?;
        tasks.push(tokio::spawn(async move {
            let mut keys: Vec<i64> = (1..=KEYS).collect();
            keys.shuffle(&mut rand::rng());
            let stmt = c
                .prepare("SELECT dedup.try_claim('k-' || $1::bigint, 'race')")
                .await?;
            let mut won = Vec::new();
            for k in keys {
                c.batch_execute("BEGIN").await?;
                let fresh: bool = c.query_one(&stmt, &[&k]).await?.get(0);
                c.batch_execute("COMMIT").await?;
                if fresh {
                    won.push(k);
                }
            }
            anyhow::Ok(won)
        }));
    }
    let pruned = prune.await??;
    let mut winners = std::collections::HashMap::new();
    for t in tasks {
        for k in t.await?? {
            *winners.entry(k).or_insert(0) += 1;
        }
    }
    if let Some((k, n)) = winners.iter().find(|(_, n)| **n > 1) {
        bail!("key k-{k} had {n} winners");
    }
    let row = admin
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE processed_at > now() - interval '1 hour') \
             FROM dedup.processed WHERE scope = 'race'",
            &[],
        )
        .await?;
    let (rows, fresh): (i64, i64) = (row.get(0), row.get(1));
    // Every old claim is gone; every winner's claim is the only row of its key.
    ensure_eq(pruned, KEYS, "claims pruned")?;
    ensure_eq(
        (rows, fresh),
        (winners.len() as i64, winners.len() as i64),
        "rows left: one per winner",
    )?;
    println!(
        "  {pruned} pruned while {CLAIMERS} connections claimed the same keys: {} re-claimed",
        winners.len()
    );
    Ok(())
}

/// A plain role row-locks the first batch's worth of expired claims (`dedup.lease` of a
/// done job locks its row, as any `ON CONFLICT DO UPDATE` does, and the transaction stays
/// open); the prune skips them and goes on past them, instead of scanning the same rows for
/// ever. Before the fix this prune spun until its statement_timeout.
pub async fn claims_locked_by_another_role_do_not_stop_a_prune(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    // The locked claims first (the first blocks, the first batch), the others after them.
    admin
        .batch_execute(
            "INSERT INTO dedup.processed SELECT 'held', 'locked-' || g, now() - interval '8 days' \
               FROM generate_series(1, 100) g; \
             INSERT INTO dedup.processed SELECT 'held', 'free-' || g, now() - interval '8 days' \
               FROM generate_series(1, 250) g",
        )
        .await?;
    let (_, holder) = unprivileged(&ctx, "holder", "").await?;
    holder.batch_execute("BEGIN").await?;
    let statuses: Vec<String> = holder
        .query(
            "SELECT (dedup.lease('locked-' || g, 'held')).status FROM generate_series(1, 100) g",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(
        statuses.iter().all(|s| s == "done"),
        true,
        "every held claim is done",
    )?;
    let pruner = ctx.connect().await?;
    pruner
        .batch_execute("SET dedup.prune_batch_size = 100; SET statement_timeout = '60s'")
        .await?;
    let pruned: i64 = pruner
        .query_one("SELECT dedup.prune('held')", &[])
        .await?
        .get(0);
    ensure_eq(pruned, 250, "claims pruned past the 100 locked ones")?;
    holder.batch_execute("ROLLBACK").await?;
    let pruned: i64 = pruner
        .query_one("SELECT dedup.prune('held')", &[])
        .await?
        .get(0);
    ensure_eq(pruned, 100, "the claims pruned once their locks were gone")?;
    Ok(())
}

/// A claim's processed_at is its transaction's start, so a transaction (or a prepared one)
/// that lasts longer than the retention commits a claim that looks expired at once. It is
/// kept its retention from its commit: a prune right after the commits deletes neither, a
/// copy delivered then finds both, and a prune a retention later deletes them. Before the
/// fix the first prune deleted both and the copies ran again.
pub async fn a_claim_is_kept_its_retention_from_commit(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    admin
        .batch_execute("SELECT dedup.set_retention('late', '2 seconds')")
        .await?;
    let long = ctx.connect().await?;
    long.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(
            &long,
            "SELECT dedup.try_claim('in-a-long-transaction', 'late')",
        )
        .await?,
        true,
        "the long transaction's claim",
    )?;
    let prepared = ctx.connect().await?;
    prepared.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&prepared, "SELECT dedup.try_claim('prepared', 'late')").await?,
        true,
        "the prepared transaction's claim",
    )?;
    let gid = format!("late-{}", ctx.db);
    prepared
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await?;
    // Both last longer than the retention, then commit.
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    long.batch_execute("COMMIT").await?;
    admin
        .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
        .await?;
    let old: i64 = admin
        .query_one(
            "SELECT count(*) FROM dedup.processed \
              WHERE scope = 'late' AND processed_at < now() - interval '3 seconds'",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(
        old,
        2,
        "claims stamped more than a retention before their commit",
    )?;
    let pruned: i64 = admin
        .query_one("SELECT dedup.prune('late')", &[])
        .await?
        .get(0);
    ensure_eq(pruned, 0, "claims pruned right after their commit")?;
    let copy = ctx.connect().await?;
    for job in ["in-a-long-transaction", "prepared"] {
        ensure_eq(
            claim(&copy, &format!("SELECT dedup.try_claim('{job}', 'late')")).await?,
            false,
            &format!("a copy of {job} delivered right after the commit"),
        )?;
    }
    // A retention after the commits (and after the prune that saw them ended), they go.
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    let pruned: i64 = admin
        .query_one("SELECT dedup.prune('late')", &[])
        .await?
        .get(0);
    ensure_eq(pruned, 2, "claims pruned a retention after their commit")?;
    Ok(())
}

/// A retention with parts of both signs is positive with 30-day months but not in every
/// month: '1 month -29 days' is -1 day after a February of 28 days, when its cutoff is in
/// the future and every claim of the scope is pruned. It is refused (22023) unless it is
/// positive with months of 28 days (31 for a negative count); days and time mixed are
/// exact in UTC. Before the fix '1 month -29 days' was accepted.
pub async fn a_retention_positive_only_in_some_months_is_refused(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    for retention in ["1 month -29 days", "1 year -340 days", "2 months -57 days"] {
        let sql = format!("SELECT dedup.set_retention('odd', '{retention}')");
        let err = c
            .batch_execute(&sql)
            .await
            .err()
            .with_context(|| format!("{sql} succeeded"))?;
        let db = err.as_db_error().with_context(|| format!("{sql}: {err}"))?;
        ensure_eq(db.code().code(), "22023", &sql)?;
        if !db.message().contains("whatever a month's length") || db.hint().is_none() {
            bail!("{sql}: {} (hint {:?})", db.message(), db.hint());
        }
    }
    for (retention, kept) in [
        ("1 day -1 hour", "1 day -01:00:00"),
        ("1 month -27 days", "1 mon -27 days"),
        ("-1 month 40 days", "-1 mons +40 days"),
    ] {
        c.batch_execute(&format!("SELECT dedup.set_retention('odd', '{retention}')"))
            .await?;
        let got: String = c
            .query_one("SELECT dedup.retention('odd')::text", &[])
            .await?
            .get(0);
        ensure_eq(got.as_str(), kept, retention)?;
    }
    Ok(())
}

/// dedup.retention is set for the server or a database, where every session and the
/// worker see the same value; a role's setting and a session's SET are refused with a
/// message, so no session reports a retention the worker does not keep.
pub async fn retention_is_the_same_in_every_session(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    admin.batch_execute("LOAD 'dedup'").await?;
    for sql in [
        "SET dedup.retention = '30d'",
        "SET LOCAL dedup.retention = '30d'",
        "SELECT set_config('dedup.retention', '30d', false)",
    ] {
        admin.batch_execute("BEGIN").await?;
        let state = expect_sqlstate(admin.batch_execute(sql).await, sql)?;
        ensure_eq(state.as_str(), "22023", sql)?;
        admin.batch_execute("ROLLBACK").await?;
    }
    // A role's setting is ignored, with a WARNING when the role's session loads dedup.
    let (role, _) = crate::common::unprivileged(&ctx, "longer", "").await?;
    admin
        .batch_execute(&format!("ALTER ROLE {role} SET dedup.retention = '30d'"))
        .await?;
    let w = ctx.connect_as(&role).await?;
    let r: String = w
        .query_one("SELECT dedup.retention()::text", &[])
        .await?
        .get(0);
    ensure_eq(
        r.as_str(),
        "7 days",
        "dedup.retention() in a session of the role",
    )?;
    let warned = w
        .take_notices()
        .iter()
        .any(|n| n.severity() == "WARNING" && n.message().contains("dedup.retention"));
    ensure_eq(warned, true, "a WARNING for the role's setting")?;
    admin
        .batch_execute(&format!("ALTER ROLE {role} RESET dedup.retention"))
        .await?;
    // A database's setting holds in every session of that database.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} SET dedup.retention = '30d'",
            ctx.db
        ))
        .await?;
    let w = ctx.connect_as(&role).await?;
    let r: String = w
        .query_one("SELECT dedup.retention()::text", &[])
        .await?
        .get(0);
    ensure_eq(
        r.as_str(),
        "30 days",
        "dedup.retention() with a database setting",
    )?;
    admin
        .batch_execute(&format!("ALTER DATABASE {} RESET dedup.retention", ctx.db))
        .await?;
    Ok(())
}
/// dedup.prune() in a session whose TimeZone has a daylight-saving jump of 23 hours about
/// now, where `now() - interval '1 day'` is less than 90 minutes ago: the cutoffs are
/// computed in UTC, so a two-hour-old claim of a one-day scope is kept (computed in the
/// session's zone, that day lasted an hour and the claim was pruned, its job to run again).
/// The worker's test of a database owner's TimeZone does not cover this: the worker sets
/// its own zone first.
pub async fn prune_in_a_session_of_another_time_zone_keeps_a_day(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let Some(zone) = crate::worker::short_day_zone(&c).await? else {
        bail!("no time zone found in which '1 day' is short today: the test needs another");
    };
    c.batch_execute(
        "SELECT dedup.set_retention('q', '1 day');
         INSERT INTO dedup.processed SELECT 'q', 'young', now() - interval '2 hours';
         INSERT INTO dedup.processed SELECT 'q', 'old', now() - interval '25 hours';",
    )
    .await?;
    c.batch_execute(&format!("SET TimeZone = '{zone}'")).await?;
    let pruned: i64 = c.query_one("SELECT dedup.prune('q')", &[]).await?.get(0);
    c.batch_execute("RESET TimeZone").await?;
    let left: Vec<String> = c
        .query(
            "SELECT job_id FROM dedup.processed WHERE scope = 'q' ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(
        (pruned, left),
        (1, vec!["young".to_string()]),
        &format!("a prune of a one-day scope under TimeZone {zone}"),
    )
}

/// `scope_retention.set_by` names the role that called `dedup.set_retention`, not the
/// function's owner.
pub async fn set_by_names_the_caller(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let (role, w) = crate::common::unprivileged(
        &ctx,
        "ops",
        "GRANT EXECUTE ON FUNCTION dedup.set_retention(text, interval) TO {role};",
    )
    .await?;
    w.batch_execute("SELECT dedup.set_retention('by-role', '2 days')")
        .await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role}_via_set_role; GRANT {role}_via_set_role TO postgres;
             GRANT EXECUTE ON FUNCTION dedup.set_retention(text, interval) TO {role}_via_set_role;
             SET ROLE {role}_via_set_role; SELECT dedup.set_retention('by-set-role', '3 days'); RESET ROLE;"
        ))
        .await?;
    let rows: Vec<(String, String)> = admin
        .query(
            "SELECT scope, set_by::text FROM dedup.scope_retention ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    ensure_eq(
        rows,
        vec![
            ("by-role".to_string(), role.clone()),
            ("by-set-role".to_string(), format!("{role}_via_set_role")),
        ],
        "scope_retention.set_by",
    )?;
    Ok(())
}
