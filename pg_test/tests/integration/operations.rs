//! Operating retention safely: the ages of the claims duplicates hit, copies past half the
//! retention, waits for concurrent holders, table health per scope, dedup.forget with its
//! audit trail, and a counter file of the previous format read after the upgrade. Tests
//! that count run a preloaded cluster of their own.
use crate::common::{ensure_eq, expect_sqlstate, unprivileged, Ctx};
use crate::stats::{as_consumer, preloaded};
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::Cluster;
use dedup_pg_test::{connect, connect_when_up};
use std::time::{Duration, Instant};

/// (duplicates, busy, late, age max in s, ages, waits, wait max in s) of one consumer.
type Row = (i64, i64, i64, f64, Vec<i64>, i64, f64);

async fn ages(c: &dedup_pg_test::Conn, consumer: &str, scope: &str) -> Result<Row> {
    let r = c
        .query_one(
            "SELECT duplicates, busy, late_duplicates, \
                    coalesce(extract(epoch FROM duplicate_age_max), 0)::float8, duplicate_ages, \
                    waits, coalesce(extract(epoch FROM wait_max), 0)::float8 \
               FROM dedup.stats WHERE consumer = $1 AND scope = $2",
            &[&consumer, &scope],
        )
        .await
        .with_context(|| format!("the counters of {consumer} in {scope}"))?;
    Ok((
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        r.get(6),
    ))
}

/// Claims whose age is set by hand, hit by copies: each age lands in its bucket, the
/// largest is kept, and the copies of claims older than half the scope's retention (1 hour
/// here) are late. A done lease counts its age too. A copy that waits 300 ms for a
/// concurrent holder that commits is a wait of at least that long.
pub async fn duplicate_ages_late_copies_and_waits(_ctx: Ctx) -> Result<()> {
    let cluster = Cluster::start(preloaded("ages"))?;
    cluster.create_db_with_extension("app")?;
    let admin = connect(&cluster.dsn("app")).await?;
    admin
        .batch_execute(
            "SELECT dedup.set_retention('ages', interval '1 hour');
             BEGIN;
             SELECT dedup.try_claim(j, 'ages') FROM unnest(ARRAY['a1', 'a2', 'a3', 'a4']) AS j;
             COMMIT;
             UPDATE dedup.processed SET processed_at = now() - CASE job_id
                 WHEN 'a1' THEN interval '0.1 seconds' WHEN 'a2' THEN interval '30 seconds'
                 WHEN 'a3' THEN interval '40 minutes' ELSE interval '2 days' END
              WHERE scope = 'ages';",
        )
        .await?;
    let c = as_consumer(&cluster, "app", "copies").await?;
    for j in ["a1", "a2", "a3", "a4"] {
        let got: bool = c
            .query_one("SELECT dedup.try_claim($1, 'ages')", &[&j])
            .await?
            .get(0);
        ensure_eq(got, false, &format!("copy of {j}"))?;
    }
    let (dups, busy, late, max, buckets, _, _) = ages(&c, "copies", "ages").await?;
    ensure_eq(
        (dups, busy, late),
        (4, 0, 2),
        "duplicates, busy, late (a3 and a4)",
    )?;
    ensure_eq(
        buckets,
        vec![1, 1, 0, 1, 0, 0, 0, 1, 0, 0],
        "buckets (<=1 s, <=1 min, <=10 min, <=1 h, <=6 h, <=12 h, <=1 d, <=3.5 d, <=7 d, more)",
    )?;
    if !(172_790.0..172_900.0).contains(&max) {
        bail!("largest age {max} s, want about 2 days (172800 s)");
    }

    // A lease that is done, hit again three hours later (past half of 1 hour: late).
    let lease = as_consumer(&cluster, "app", "leases").await?;
    let id: uuid::Uuid = lease
        .query_one("SELECT lease_id FROM dedup.lease('l1', 'ages')", &[])
        .await?
        .get(0);
    lease
        .execute("SELECT dedup.complete('l1', $1, NULL, 'ages')", &[&id])
        .await?;
    admin
        .batch_execute("UPDATE dedup.processed SET processed_at = now() - interval '3 hours' WHERE job_id = 'l1'")
        .await?;
    let status: String = lease
        .query_one("SELECT status FROM dedup.lease('l1', 'ages')", &[])
        .await?
        .get(0);
    ensure_eq(status.as_str(), "done", "the second lease call")?;
    let (dups, _, late, _, buckets, _, _) = ages(&lease, "leases", "ages").await?;
    ensure_eq((dups, late), (1, 1), "the done lease: a late duplicate")?;
    ensure_eq(buckets[4], 1, "3 hours: the <=6 h bucket")?;

    // A wait: the holder commits after 300 ms.
    let holder = as_consumer(&cluster, "app", "holder").await?;
    holder
        .batch_execute("BEGIN; SELECT dedup.try_claim('w1', 'ages')")
        .await?;
    let dsn = cluster.dsn("app");
    let wait = tokio::spawn(async move {
        let w = as_consumer_dsn(&dsn, "waiter").await?;
        let got: bool = w
            .query_one("SELECT dedup.try_claim('w1', 'ages')", &[])
            .await?
            .get(0);
        Ok::<_, anyhow::Error>(got)
    });
    // Until the copy waits for the holder.
    let started = Instant::now();
    loop {
        let blocked: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = 'app'",
                &[],
            )
            .await?
            .get(0);
        if blocked > 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            bail!("the second claim never waited");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.batch_execute("COMMIT").await?;
    let got = wait.await??;
    ensure_eq(got, false, "the waiting copy")?;
    let (_, busy, _, _, _, waits, wait_max) = ages(&admin, "waiter", "ages").await?;
    ensure_eq((busy, waits), (1, 1), "busy and waits of the waiting copy")?;
    if !(0.29..20.0).contains(&wait_max) {
        bail!("longest wait {wait_max} s, want at least 0.3 s");
    }
    Ok(())
}

async fn as_consumer_dsn(dsn: &str, name: &str) -> Result<dedup_pg_test::Conn> {
    let c = connect(&format!("{dsn} application_name={name}")).await?;
    c.batch_execute("SET dedup.warn_outside_transaction = off")
        .await?;
    Ok(c)
}

/// dedup.table_health(): live claims, the oldest claim and the last prune per scope,
/// estimated after ANALYZE and counted exactly on request; for pg_monitor only.
pub async fn table_health_estimate_and_exact(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute(
        "BEGIN;
         SELECT dedup.try_claim('h' || g, 'health-a') FROM generate_series(1, 300) g;
         SELECT dedup.try_claim('h' || g, 'health-b') FROM generate_series(1, 100) g;
         COMMIT;
         UPDATE dedup.processed SET processed_at = now() - interval '5 days' WHERE job_id = 'h7' AND scope = 'health-b';
         SELECT dedup.prune();
         ANALYZE dedup.processed;",
    )
    .await?;
    let exact: Vec<(String, i64, bool, bool, bool)> = c
        .query(
            "SELECT scope, live_claims, oldest_claim_at < now() - interval '4 days', counted, last_pruned_at IS NOT NULL \
               FROM dedup.table_health(exact => true)",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    ensure_eq(
        exact,
        vec![
            ("health-a".to_string(), 300, false, true, true),
            ("health-b".to_string(), 100, true, true, true),
        ],
        "exact table health",
    )?;
    let estimated: Vec<(String, i64, bool)> = c
        .query(
            "SELECT scope, live_claims, counted FROM dedup.table_health()",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    ensure_eq(
        estimated,
        vec![
            ("health-a".to_string(), 300, false),
            ("health-b".to_string(), 100, false),
        ],
        "estimated table health (from ANALYZE's statistics)",
    )?;
    let (_, plain) = unprivileged(&ctx, "health", "").await?;
    let refused = expect_sqlstate(
        plain.query("SELECT * FROM dedup.table_health()", &[]).await,
        "table_health as a plain role",
    )?;
    ensure_eq(refused.as_str(), "42501", "table_health for PUBLIC")?;
    let (_, monitor) = unprivileged(&ctx, "healthmon", "GRANT pg_monitor TO {role}").await?;
    monitor
        .query("SELECT * FROM dedup.table_health(true)", &[])
        .await
        .context("table_health for pg_monitor")?;
    Ok(())
}

/// dedup.forget: removes a done claim (true) and leaves an audit row; refuses a running
/// lease (55006) but forgets an expired one; false and an audit row for a job with no
/// claim; not for PUBLIC (42501), for a role with the documented grant; the job can be
/// claimed again; the audit rows are pruned after the scope's retention.
pub async fn forget_removes_done_claims_with_an_audit_row(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    admin
        .batch_execute(
            "BEGIN; SELECT dedup.try_claim('f1'); SELECT dedup.try_claim(42::bigint); COMMIT;
             SELECT dedup.lease('running', 'default', interval '10 minutes');
             SELECT dedup.lease('expired', 'default', interval '1 second');
             UPDATE dedup.processed SET lease_expires_at = now() - interval '1 minute' WHERE job_id = 'expired';",
        )
        .await?;
    let (_, plain) = unprivileged(&ctx, "noforget", "").await?;
    let refused = expect_sqlstate(
        plain.query("SELECT dedup.forget('f1')", &[]).await,
        "forget as PUBLIC",
    )?;
    ensure_eq(refused.as_str(), "42501", "forget for PUBLIC")?;
    let (role, ops) = unprivileged(
        &ctx,
        "ops",
        "GRANT EXECUTE ON FUNCTION dedup.forget(text, text), dedup.forget(bigint, text), \
                                  dedup.forget(uuid, text) TO {role}",
    )
    .await?;
    let forgot: bool = ops
        .query_one("SELECT dedup.forget('f1')", &[])
        .await?
        .get(0);
    ensure_eq(forgot, true, "forget a done claim")?;
    let forgot: bool = ops.query_one("SELECT dedup.forget(42)", &[]).await?.get(0);
    ensure_eq(forgot, true, "forget a bigint job")?;
    let forgot: bool = ops
        .query_one("SELECT dedup.forget('never-claimed')", &[])
        .await?
        .get(0);
    ensure_eq(forgot, false, "forget a job with no claim")?;
    match ops.query("SELECT dedup.forget('running')", &[]).await {
        Ok(_) => bail!("a running lease was forgotten"),
        Err(e) => {
            let db = e.as_db_error().context("a server error")?;
            ensure_eq(db.code().code(), "55006", "forget a running lease")?;
            if db.hint().is_none() || !db.message().contains("leased until") {
                bail!(
                    "forget of a running lease: {} (hint {:?})",
                    db.message(),
                    db.hint()
                );
            }
        }
    }
    let forgot: bool = ops
        .query_one("SELECT dedup.forget('expired')", &[])
        .await?
        .get(0);
    ensure_eq(forgot, true, "forget an expired lease")?;
    let bad = expect_sqlstate(
        ops.query("SELECT dedup.forget(NULL::text)", &[]).await,
        "forget NULL",
    )?;
    ensure_eq(bad.as_str(), "22004", "forget(NULL)")?;

    let audit: Vec<(String, String, bool, bool)> = admin
        .query(
            "SELECT job_id, forgotten_by::text, removed, claimed_at IS NOT NULL FROM dedup.forgotten ORDER BY forgotten_at, job_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let want: Vec<(String, String, bool, bool)> = [
        ("f1", true),
        ("42", true),
        ("never-claimed", false),
        ("expired", true),
    ]
    .iter()
    .map(|(j, removed)| (j.to_string(), role.clone(), *removed, *removed))
    .collect();
    let mut got_sorted = audit.clone();
    got_sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    ensure_eq(
        got_sorted,
        want_sorted,
        "audit rows (the refused forget left none: it rolled back)",
    )?;

    // Forgotten: the job runs again.
    admin.batch_execute("BEGIN").await?;
    let again: bool = admin
        .query_one("SELECT dedup.try_claim('f1')", &[])
        .await?
        .get(0);
    admin.batch_execute("COMMIT").await?;
    ensure_eq(again, true, "a forgotten job claimed again")?;

    // The audit rows go with the scope's retention: one made old by hand is pruned.
    admin
        .batch_execute(
            "UPDATE dedup.forgotten SET forgotten_at = now() - interval '30 days' WHERE job_id = 'f1';
             SELECT dedup.prune();",
        )
        .await?;
    let left: Vec<String> = admin
        .query("SELECT job_id FROM dedup.forgotten ORDER BY job_id", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(
        left,
        vec![
            "42".to_string(),
            "expired".to_string(),
            "never-claimed".to_string(),
        ],
        "audit rows after the prune",
    )?;
    Ok(())
}

/// A forgotten job claimed again counts as a claim, not a duplicate.
pub async fn a_forgotten_job_claimed_again_is_a_claim(_ctx: Ctx) -> Result<()> {
    let cluster = Cluster::start(preloaded("forget-stats"))?;
    cluster.create_db_with_extension("app")?;
    let c = as_consumer(&cluster, "app", "worker").await?;
    c.batch_execute(
        "BEGIN; SELECT dedup.try_claim('j', 'fs'); COMMIT;
         SELECT dedup.forget('j', 'fs');
         BEGIN; SELECT dedup.try_claim('j', 'fs'); COMMIT;",
    )
    .await?;
    let r = c
        .query_one(
            "SELECT claims, duplicates FROM dedup.stats WHERE consumer = 'worker' AND scope = 'fs'",
            &[],
        )
        .await?;
    ensure_eq(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (2, 0),
        "claims, duplicates",
    )?;
    Ok(())
}

/// A counter file of the previous format (version 2, written by 0.5.0 at a clean shutdown)
/// is read after the upgrade: its counters are kept, the new ones start at zero.
pub async fn a_counter_file_of_the_previous_format_is_read(_ctx: Ctx) -> Result<()> {
    let mut cluster = Cluster::start(preloaded("stats-v2"))?;
    cluster.create_db_with_extension("app")?;
    let c = connect(&cluster.dsn("app")).await?;
    let dbid: u32 = c
        .query_one(
            "SELECT oid::int8 FROM pg_database WHERE datname = 'app'",
            &[],
        )
        .await?
        .get::<_, i64>(0) as u32;
    drop(c);
    cluster.stop("fast")?;
    // Version 2: magic, version, key size, 6 values (u32 each); overflowed, reset_at,
    // count (u64 each); a key (dbid u32, scope_len u16, consumer_len u16, scope [128],
    // consumer [64]) and 6 u64 counters; an FNV-1a checksum of all of it.
    let mut out = Vec::new();
    for v in [0x4445_4455u32, 2, 200, 6] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u64, 1, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&dbid.to_le_bytes());
    out.extend_from_slice(&(3u16).to_le_bytes());
    out.extend_from_slice(&(3u16).to_le_bytes());
    let mut scope = [0u8; 128];
    scope[..3].copy_from_slice(b"old");
    let mut consumer = [0u8; 64];
    consumer[..3].copy_from_slice(b"v05");
    out.extend_from_slice(&scope);
    out.extend_from_slice(&consumer);
    for v in [7u64, 3, 1, 0, 1, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let sum = out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    out.extend_from_slice(&sum.to_le_bytes());
    let file = cluster.data.join("pg_stat/dedup.stat");
    std::fs::write(&file, &out)?;
    if dedup_pg_test::cluster::is_root() {
        dedup_pg_test::cluster::run(
            std::process::Command::new("chown")
                .arg("postgres:")
                .arg(&file),
        )?;
    }
    cluster.start_again()?;
    let c = connect_when_up(&cluster.dsn("app")).await?;
    let r = c
        .query_one(
            "SELECT claims, duplicates, busy, late_duplicates, waits, duplicate_ages \
               FROM dedup.stats WHERE scope = 'old' AND consumer = 'v05'",
            &[],
        )
        .await
        .context("the counters of the version 2 file")?;
    let got: (i64, i64, i64, i64, i64, Vec<i64>) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
    ensure_eq(
        got,
        (7, 3, 1, 0, 0, vec![0; 10]),
        "counters read from a version 2 file",
    )?;
    if cluster.log_text().contains("dedup: ignoring") {
        bail!("the version 2 file was refused:\n{}", cluster.log_tail(10));
    }
    Ok(())
}

/// try_claim_many counts a batch and each of its jobs; advance counts a raised mark, and
/// a position at or below it as a duplicate, under the stream's name.
pub async fn batches_and_advances_are_counted(_ctx: Ctx) -> Result<()> {
    let cluster = Cluster::start(preloaded("batch-stats"))?;
    cluster.create_db_with_extension("app")?;
    let c = as_consumer(&cluster, "app", "batcher").await?;
    c.batch_execute(
        "BEGIN; SELECT dedup.try_claim('b3', 'bs'); COMMIT;
         BEGIN; SELECT dedup.try_claim_many(ARRAY['b1', 'b2', 'b3', 'b1'], 'bs'); COMMIT;
         BEGIN; SELECT dedup.advance('st', 0, 1); SELECT dedup.advance('st', 0, 1); COMMIT;",
    )
    .await?;
    let rows: Vec<(String, i64, i64, i64, i64)> = c
        .query(
            "SELECT scope, claims, duplicates, batches, advances FROM dedup.stats \
              WHERE consumer = 'batcher' ORDER BY scope",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    ensure_eq(
        rows,
        vec![
            ("bs".to_string(), 3, 1, 1, 0),
            ("st".to_string(), 0, 1, 0, 1),
        ],
        "(scope, claims, duplicates, batches, advances)",
    )?;
    Ok(())
}
