//! The background worker, on clusters of their own started with
//! `shared_preload_libraries = 'dedup'` and a prune interval of one second.
use crate::common::{ensure_eq, Ctx};
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::{connect, connect_when_up, sqlstate, Conn};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub(crate) fn preloaded(name: &str) -> Options {
    Options::named(name)
        .set("shared_preload_libraries", "dedup")
        .set("dedup.prune_interval", "1s")
        .set("dedup.prune_batch_size", "1000")
}

pub(crate) async fn start(opts: Options) -> Result<Cluster> {
    tokio::task::spawn_blocking(move || Cluster::start(opts)).await?
}

/// Poll `check` until it returns true, for at most `secs` seconds.
pub(crate) async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {secs} s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn count(c: &Conn, sql: &str) -> Result<i64> {
    Ok(c.query_one(sql, &[]).await?.get(0))
}

pub(crate) const EXPIRED: &str =
    "SELECT count(*) FROM dedup.processed WHERE processed_at < now() - interval '7 days'";

/// Create `db` with the extension and `n` claims eight days old, `live` fresh ones.
pub(crate) async fn database_with_claims(
    cluster: &Cluster,
    db: &str,
    n: i64,
    live: i64,
) -> Result<Conn> {
    let admin = connect(&cluster.dsn("postgres")).await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let c = connect(&cluster.dsn(db)).await?;
    c.batch_execute(&format!(
        "CREATE EXTENSION dedup;
         INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, {n}) g;
         INSERT INTO dedup.processed SELECT 'default', 'live-' || g, now() FROM generate_series(1, {live}) g;"
    ))
    .await?;
    Ok(c)
}

async fn launcher_pid(c: &Conn) -> Result<Option<i32>> {
    Ok(c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'dedup launcher' AND application_name = 'dedup launcher'",
        &[],
    )
    .await?
    .map(|r| r.get(0)))
}

pub async fn worker_prunes_every_database_with_the_extension(_ctx: Ctx) -> Result<()> {
    // No pause between batches until the reload below sets one: the 20 batches of database
    // a's 20,000 claims fit in one visit (a visit stops at its share, one interval here,
    // and the log line looked for below is a whole pass's).
    let cluster = start(preloaded("worker").set("dedup.prune_batch_delay", "0")).await?;
    let a = database_with_claims(&cluster, "a", 20_000, 100).await?;
    let b = database_with_claims(&cluster, "b", 3_000, 100).await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    admin.batch_execute("CREATE DATABASE c").await?; // no extension: left alone
    for (c, name) in [(&a, "a"), (&b, "b")] {
        eventually(20, &format!("pruning database {name}"), || async {
            Ok(count(c, EXPIRED).await? == 0)
        })
        .await?;
        ensure_eq(
            count(c, "SELECT count(*) FROM dedup.processed").await?,
            100,
            "live claims kept",
        )?;
    }
    // A database created after the worker started is found at its next pass.
    let d = database_with_claims(&cluster, "d", 500, 10).await?;
    eventually(20, "pruning a database created later", || async {
        Ok(count(&d, EXPIRED).await? == 0)
    })
    .await?;
    // The last pass is recorded in each database.
    let by: String = a
        .query_one(
            "SELECT pruned_by FROM dedup.prune_status WHERE scope IS NULL",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(by.as_str(), "worker", "prune_status of database a")?;
    // A new retention by reload: one hour.
    admin
        .batch_execute("ALTER SYSTEM SET dedup.retention = '1h'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    a.batch_execute(
        "INSERT INTO dedup.processed SELECT 'default', 'two-hours-' || g, now() - interval '2 hours' FROM generate_series(1, 50) g;
         INSERT INTO dedup.processed SELECT 'default', 'half-hour-' || g, now() - interval '30 minutes' FROM generate_series(1, 50) g;",
    )
    .await?;
    eventually(20, "pruning with the reloaded retention", || async {
        Ok(count(
            &a,
            "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'two-hours-%'",
        )
        .await?
            == 0)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure_eq(
        count(
            &a,
            "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'half-hour-%'",
        )
        .await?,
        50,
        "claims younger than the reloaded retention",
    )?;
    // A pause between batches by reload: 3,000 claims in batches of 1,000 take three
    // batches, each followed by a pause of 300 ms.
    admin
        .batch_execute("ALTER SYSTEM SET dedup.prune_batch_delay = '300ms'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.batch_execute(
        "INSERT INTO dedup.processed SELECT 'default', 'paused-' || g, now() - interval '8 days' FROM generate_series(1, 3000) g",
    )
    .await?;
    // The claims are gone batch by batch; the pass is recorded after its last pause.
    eventually(20, "pruning with pauses", || async {
        Ok(count(
            &a,
            "SELECT count(*) FROM dedup.prune_status WHERE scope = 'default' AND rows_deleted = 3000",
        )
        .await?
            == 1)
    })
    .await?;
    ensure_eq(
        count(
            &a,
            "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'paused-%'",
        )
        .await?,
        0,
        "claims left after the paused pass",
    )?;
    let secs: f64 = a
        .query_one(
            "SELECT extract(epoch FROM duration)::float8 FROM dedup.prune_status WHERE scope = 'default'",
            &[],
        )
        .await?
        .get(0);
    if secs < 0.9 {
        bail!("a pass of three batches with dedup.prune_batch_delay = 300ms took {secs} s");
    }
    // Visible in pg_stat_activity; one log line per database and pass that deleted.
    if launcher_pid(&admin).await?.is_none() {
        bail!("no dedup launcher in pg_stat_activity");
    }
    let log = cluster.log_text();
    for want in [
        "dedup launcher started",
        "dedup: pruned 20000 claims in database \"a\"",
        "dedup: pruned 3000 claims in database \"b\"",
        "dedup: pruned 500 claims in database \"d\"",
        "dedup: pruned 50 claims in database \"a\"",
    ] {
        if !log.contains(want) {
            bail!("the server log lacks {want:?}:\n{}", cluster.log_tail(30));
        }
    }
    if log.contains("database \"c\"") || log.contains("ERROR") {
        bail!(
            "the server log mentions database c or an error:\n{}",
            cluster.log_tail(30)
        );
    }
    Ok(())
}

pub async fn worker_is_restarted_after_kill_9(_ctx: Ctx) -> Result<()> {
    let cluster = start(preloaded("worker-kill")).await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    eventually(20, "launcher up", || async {
        Ok(launcher_pid(&admin).await?.is_some())
    })
    .await?;
    let old = launcher_pid(&admin).await?.unwrap_or_default();
    crate::common::kill9(old)?;
    // The postmaster restarts every process after a crash, the launcher with them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let admin = connect_when_up(&cluster.dsn("postgres")).await?;
    eventually(60, "launcher restarted", || async {
        Ok(launcher_pid(&admin).await?.is_some_and(|p| p != old))
    })
    .await?;
    let a = database_with_claims(&cluster, "a", 1000, 0).await?;
    eventually(20, "pruning after the restart", || async {
        Ok(count(&a, EXPIRED).await? == 0)
    })
    .await?;
    Ok(())
}

pub async fn fast_stop_is_not_held_up_by_a_large_prune(_ctx: Ctx) -> Result<()> {
    // The first pass runs at start on an empty database; the next one only on demand.
    let opts = preloaded("worker-stop")
        .set("dedup.prune_interval", "1h")
        .set("dedup.prune_batch_size", "500");
    let mut cluster = start(opts).await?;
    let a = database_with_claims(&cluster, "a", 1_000_000, 0).await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    admin
        .batch_execute("ALTER SYSTEM SET dedup.prune_interval = '1s'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    eventually(30, "a prune pass under way", || async {
        Ok(count(&a, EXPIRED).await? < 1_000_000)
    })
    .await?;
    drop((a, admin));
    let started = Instant::now();
    let (cluster_back, stopped_in) =
        tokio::task::spawn_blocking(move || -> Result<(Cluster, Duration)> {
            cluster.stop("fast")?;
            let took = started.elapsed();
            // Start again with pruning off, to see where the pass stopped.
            cluster.append_conf(&Options::default().set("dedup.prune_interval", "0"))?;
            cluster.start_again()?;
            Ok((cluster, took))
        })
        .await??;
    let a = connect_when_up(&cluster_back.dsn("a")).await?;
    let left = count(&a, EXPIRED).await?;
    println!(
        "  pg_ctl stop -m fast took {:.2} s with {left} expired claims still to prune",
        stopped_in.as_secs_f64()
    );
    if stopped_in > Duration::from_secs(5) {
        bail!("pg_ctl stop -m fast took {stopped_in:?}");
    }
    if left == 0 {
        bail!("the pass finished before the stop: the test did not stop a running prune");
    }
    Ok(())
}

pub async fn standby_does_not_prune_until_promoted(_ctx: Ctx) -> Result<()> {
    // The primary does not prune (interval 0), so expired claims reach the standby.
    let primary = start(preloaded("worker-primary").set("dedup.prune_interval", "0")).await?;
    let p = database_with_claims(&primary, "a", 2000, 10).await?;
    p.batch_execute("CHECKPOINT").await?;
    // (Blocking calls: the harness runs one test at a time on a multi-threaded runtime.)
    let standby = Cluster::standby_of(
        &primary,
        Options::default().set("dedup.prune_interval", "1s"),
    )?;
    let s = connect_when_up(&standby.dsn("a")).await?;
    eventually(30, "claims replicated", || async {
        Ok(count(&s, EXPIRED).await? == 2000)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    if launcher_pid(&s).await?.is_some() {
        bail!("a dedup launcher runs on the standby");
    }
    ensure_eq(
        count(&s, EXPIRED).await?,
        2000,
        "expired claims on the standby",
    )?;
    drop((p, s));
    drop(primary);
    standby.promote()?;
    let s = connect_when_up(&standby.dsn("a")).await?;
    eventually(30, "pruning after promotion", || async {
        Ok(count(&s, EXPIRED).await? == 0)
    })
    .await?;
    ensure_eq(
        count(&s, "SELECT count(*) FROM dedup.processed").await?,
        10,
        "live claims after promotion",
    )?;
    Ok(())
}

/// No ordinary role can stop pruning. An idle session holding the advisory lock of
/// 0.4.0's prune lock (database a), an open transaction holding the row lock of an
/// expired lease (database b): every database is still pruned on time. A database whose
/// prune is kept from running longer than one interval (a privileged `dedup.prune()`
/// left open, database d) gets a WARNING and shows as overdue.
pub async fn no_role_can_stop_pruning(_ctx: Ctx) -> Result<()> {
    let cluster = start(preloaded("worker-locks")).await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    admin.batch_execute("CREATE ROLE anyone LOGIN").await?;
    let mut conns = Vec::new();
    for db in ["a", "b", "c", "d"] {
        conns.push(database_with_claims(&cluster, db, 0, 0).await?);
    }
    let as_anyone = |db: &str| format!("{} user=anyone", cluster.dsn(db));
    let holder = connect(&as_anyone("a")).await?;
    let locked: bool = holder
        .query_one("SELECT pg_try_advisory_lock(1684366453, 1)", &[])
        .await?
        .get(0);
    ensure_eq(locked, true, "advisory lock taken by an ordinary role")?;
    // b: an expired lease, taken over by a transaction left open.
    conns[1]
        .batch_execute(
            "INSERT INTO dedup.processed (scope, job_id, processed_at, lease_id, lease_expires_at)
             VALUES ('default', 'held', now() - interval '8 days', gen_random_uuid(), now() - interval '1 hour')",
        )
        .await?;
    let taker = connect(&as_anyone("b")).await?;
    taker.batch_execute("BEGIN").await?;
    let status: String = taker
        .query_one("SELECT status FROM dedup.lease('held')", &[])
        .await?
        .get(0);
    ensure_eq(
        status.as_str(),
        "acquired",
        "take-over of the expired lease",
    )?;
    for c in &conns[..3] {
        c.batch_execute(
            "INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 2000) g",
        )
        .await?;
    }
    for (c, db) in conns.iter().zip(["a", "b", "c"]) {
        eventually(30, &format!("pruning database {db}"), || async {
            Ok(count(
                c,
                "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'old-%'",
            )
            .await?
                == 0)
        })
        .await?;
    }
    taker.batch_execute("COMMIT").await?;
    ensure_eq(
        count(
            &conns[1],
            "SELECT count(*) FROM dedup.processed WHERE job_id = 'held'",
        )
        .await?,
        1,
        "the lease taken over",
    )?;
    // d: pruned once, then a prune by a privileged session left open keeps the worker out.
    let d = &conns[3];
    eventually(30, "a first pass over database d", || async {
        Ok(count(
            d,
            "SELECT count(*) FROM dedup.prune_status WHERE scope IS NULL",
        )
        .await?
            == 1)
    })
    .await?;
    // The worker's prune lock is gone with the worker: no prune waits for a pass that ended.
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(connect(&cluster.dsn("d")).await?);
    }
    for s in &sessions {
        s.batch_execute("SET lock_timeout = '3s'; BEGIN; SELECT dedup.prune(); ROLLBACK;")
            .await
            .map_err(|e| anyhow::anyhow!("dedup.prune() after the worker's passes: {e}"))?;
    }
    drop(sessions);
    let busy = connect(&cluster.dsn("d")).await?;
    busy.batch_execute("BEGIN; SELECT dedup.prune();").await?;
    eventually(30, "database d reported as overdue", || async {
        Ok(count(
            d,
            "SELECT count(*) FROM dedup.prune_status WHERE scope IS NULL AND overdue",
        )
        .await?
            == 1)
    })
    .await?;
    eventually(30, "a WARNING for database d", || async {
        Ok(cluster.log_text().lines().any(|l| {
            l.contains("WARNING") && l.contains("database \"d\"") && l.contains("not been pruned")
        }))
    })
    .await?;
    busy.batch_execute("COMMIT").await?;
    eventually(30, "database d no longer overdue", || async {
        Ok(count(
            d,
            "SELECT count(*) FROM dedup.prune_status WHERE scope IS NULL AND NOT overdue",
        )
        .await?
            == 1)
    })
    .await?;
    drop(holder);
    Ok(())
}

/// VACUUM truncates the table between two batches of a pass; the next batch starts past
/// the new end and must not fail.
pub async fn vacuum_truncation_between_batches(_ctx: Ctx) -> Result<()> {
    let cluster = start(
        preloaded("worker-truncate")
            .set("dedup.prune_batch_size", "1000000")
            .set("dedup.prune_batch_delay", "5s"),
    )
    .await?;
    let a = database_with_claims(&cluster, "a", 0, 0).await?;
    // About 1,100 blocks of expired claims, then live ones: the first batch (blocks 0 to
    // 1023) deletes only expired claims, and the pass pauses 5 s after it.
    a.batch_execute(
        "INSERT INTO dedup.processed SELECT 'default', 'first-' || g, now() FROM generate_series(1, 100) g;
         INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 150000) g;
         INSERT INTO dedup.processed SELECT 'default', 'live-' || g, now() FROM generate_series(1, 50000) g;",
    )
    .await?;
    eventually(30, "the first batch", || async {
        Ok(count(
            &a,
            "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'old-%'",
        )
        .await?
            < 150000)
    })
    .await?;
    // In the pause: delete all but the first block's claims, and let VACUUM truncate the
    // table to that block.
    a.batch_execute("DELETE FROM dedup.processed WHERE job_id NOT LIKE 'first-%'")
        .await?;
    a.batch_execute("VACUUM dedup.processed").await?;
    let blocks: i64 = a
        .query_one("SELECT pg_relation_size('dedup.processed') / 8192", &[])
        .await?
        .get(0);
    if blocks >= 1024 {
        bail!("VACUUM left {blocks} blocks: the test did not truncate the table under the pass");
    }
    // The pass that deleted is recorded in its scope's row (the row of scope NULL is
    // overwritten by every later pass, each second); a failed pass in last_error.
    eventually(30, "the pass recorded", || async {
        Ok(count(
            &a,
            "SELECT count(*) FROM dedup.prune_status \
              WHERE (scope = 'default' AND rows_deleted > 0) OR last_error IS NOT NULL",
        )
        .await?
            > 0)
    })
    .await?;
    let row = a
        .query_one(
            "SELECT consecutive_failures, coalesce(last_error, '') FROM dedup.prune_status WHERE scope IS NULL",
            &[],
        )
        .await?;
    ensure_eq(
        (row.get::<_, i32>(0), row.get::<_, String>(1)),
        (0, String::new()),
        "failures of the pass",
    )?;
    Ok(())
}

/// DROP DATABASE succeeds while the worker is in the middle of a long pass there (it
/// waits at most 5 s for other sessions to leave).
pub async fn drop_database_during_a_pass(_ctx: Ctx) -> Result<()> {
    let cluster = start(
        preloaded("worker-drop")
            .set("dedup.prune_batch_size", "100")
            .set("dedup.prune_batch_delay", "1s"),
    )
    .await?;
    let a = database_with_claims(&cluster, "a", 20_000, 0).await?;
    eventually(30, "a prune pass under way", || async {
        Ok(count(&a, EXPIRED).await? < 20_000)
    })
    .await?;
    drop(a);
    let admin = connect(&cluster.dsn("postgres")).await?;
    let started = Instant::now();
    admin.batch_execute("DROP DATABASE a").await?;
    println!(
        "  DROP DATABASE during a pass took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `dedup.prune_role` set to a role that is not a superuser, holding exactly the grants the
/// docs (docs/retention.md, "The background worker") list: the worker prunes with them.
pub async fn prune_role_with_the_documented_grants(_ctx: Ctx) -> Result<()> {
    let cluster = start(preloaded("worker-role").set("dedup.prune_role", "pruner")).await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    admin
        .batch_execute("CREATE ROLE pruner LOGIN NOSUPERUSER")
        .await?;
    let a = database_with_claims(&cluster, "a", 0, 0).await?;
    a.batch_execute(
        "GRANT SELECT, UPDATE, DELETE ON dedup.processed TO pruner;
         GRANT SELECT, INSERT, UPDATE ON dedup._prune_status TO pruner;
         GRANT SELECT, DELETE ON dedup.forgotten TO pruner;
         GRANT SELECT, INSERT, DELETE ON dedup._horizons TO pruner;
         GRANT EXECUTE ON FUNCTION dedup._mark_horizon(float8), dedup._horizon(timestamptz) TO pruner;
         INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 500) g;",
    )
    .await?;
    eventually(30, "pruning as pruner", || async {
        Ok(count(&a, EXPIRED).await? == 0)
    })
    .await?;
    let log = cluster.log_text();
    if log.contains("WARNING") {
        bail!(
            "warnings while pruning as pruner:\n{}",
            cluster.log_tail(20)
        );
    }
    Ok(())
}

/// A POSIX time zone in which `now() - interval '1 day'` is less than 90 minutes ago: a
/// daylight-saving jump of 23 hours that starts about now. None if no candidate does it
/// here (the test is then wrong, not the worker).
pub async fn short_day_zone(c: &Conn) -> Result<Option<String>> {
    let doy: f64 = c
        .query_one(
            "SELECT extract(doy FROM now() AT TIME ZONE 'UTC')::float8",
            &[],
        )
        .await?
        .get(0);
    let doy = doy as i64;
    for start in [doy - 1, doy, doy - 2, doy + 1] {
        if !(1..=363).contains(&start) {
            continue;
        }
        let zone = format!("AAA0BBB-23,J{start}/0,J{}/0", start + 2);
        c.batch_execute(&format!("SET TimeZone = '{zone}'")).await?;
        let short: bool = c
            .query_one(
                "SELECT now() - interval '1 day' > now() - interval '90 minutes'",
                &[],
            )
            .await?
            .get(0);
        c.batch_execute("RESET TimeZone").await?;
        if short {
            return Ok(Some(zone));
        }
    }
    Ok(None)
}

/// A database owner (`CREATEDB`, nothing else) sets, for every session of its database, a
/// TimeZone whose daylight-saving jump makes '1 day' last one hour, and
/// `enable_tidscan = off`, which makes every batch's DELETE a sequential scan of the whole
/// table (and `role`, and from 17 on `transaction_timeout`, which stopped the first fix's
/// passes there). The worker must keep a claim of a one-day scope that is two hours old,
/// and read the table once per pass, not once per batch. Before the fix the claim was
/// pruned (and the job would run again) and the DELETEs read the table again per batch.
pub async fn a_database_owners_settings_do_not_change_a_pass(_ctx: Ctx) -> Result<()> {
    // Batches of 100 over 20,000 claims: each batch's DELETE of 100 TIDs is a TID scan (a
    // sequential one would cost the planner far more), unless enable_tidscan is off.
    let cluster = start(
        preloaded("worker-settings")
            .set("dedup.prune_batch_size", "100")
            .set("dedup.prune_batch_delay", "0"),
    )
    .await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    admin
        .batch_execute("CREATE ROLE mallory LOGIN CREATEDB")
        .await?;
    let as_mallory = |db: &str| format!("{} user=mallory", cluster.dsn(db));
    let m = connect(&as_mallory("postgres")).await?;
    m.batch_execute("CREATE DATABASE tz").await?;
    let c = connect(&cluster.dsn("tz")).await?;
    let Some(zone) = short_day_zone(&c).await? else {
        bail!("no time zone found in which '1 day' is short today: the test needs another");
    };
    c.batch_execute(
        "CREATE EXTENSION dedup;
         SELECT dedup.set_retention('q', '1 day');
         INSERT INTO dedup.processed SELECT 'q', 'young', now() - interval '2 hours';
         INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days'
           FROM generate_series(1, 20000) g;",
    )
    .await?;
    let owner = connect(&as_mallory("tz")).await?;
    owner
        .batch_execute(&format!(
            "ALTER DATABASE tz SET TimeZone = '{zone}'; ALTER DATABASE tz SET enable_tidscan = off"
        ))
        .await?;
    // Settings pg_settings does not show (role: the worker would run as mallory, who may
    // not touch the claim table), and, from 17 on, a transaction_timeout that would end
    // the worker in its first batch.
    owner
        .batch_execute("ALTER DATABASE tz SET role = mallory")
        .await?;
    let version: i32 = c
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0);
    if version >= 170_000 {
        owner
            .batch_execute("ALTER DATABASE tz SET transaction_timeout = '1ms'")
            .await?;
    }
    // The table's reads so far; from here on only the worker reads it.
    let reads = "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables \
                 WHERE relid = 'dedup.processed'::regclass";
    c.batch_execute("SELECT pg_stat_force_next_flush()").await?;
    let before = count(&c, reads).await?;
    // Until two whole passes after the one that pruned the old claims.
    let deleted = "SELECT coalesce(sum(rows_deleted), 0)::int8 FROM dedup.prune_status WHERE scope = 'default'";
    eventually(120, "the old claims pruned", || async {
        Ok(count(&c, deleted).await? >= 20_000)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let read = count(&c, reads).await? - before;
    let young: i64 = c
        .query_one(
            "SELECT count(*) FROM dedup.processed WHERE job_id = 'young' AND scope = 'q'",
            &[],
        )
        .await?
        .get(0);
    let mut wrong = Vec::new();
    if young != 1 {
        wrong.push(format!(
            "the two-hour-old claim of the one-day scope was pruned under TimeZone {zone}"
        ));
    }
    // A pass reads the table's rows about once (each batch goes on where the last one
    // stopped); a sequential DELETE per batch would read what is left again, 200 times.
    if read > 3 * 20_001 {
        wrong.push(format!(
            "the worker's passes read {read} rows of a table of 20,001: its DELETEs scanned the table"
        ));
    }
    if !wrong.is_empty() {
        bail!("{}", wrong.join("; "));
    }
    Ok(())
}

/// The server log written since `mark` (a length of [`Cluster::log_text`] taken before).
fn log_since(cluster: &Cluster, mark: usize) -> String {
    cluster.log_text().get(mark..).unwrap_or("").to_string()
}

/// DROP DATABASE and ALTER DATABASE ... RENAME take their lock on the database before they
/// check that their role owns it, so a plain role's attempt, failing with 42501, held for
/// a moment the lock the worker looks at between batches; in a loop, it made the worker
/// leave each pass of that database early, logging that the database was being dropped or
/// renamed. Eight sessions of a plain role try both in a loop here: a pass of 200 batches
/// must prune the database without leaving once, and a superuser's DROP DATABASE in the
/// middle of a pass, under the same loop, must still succeed (the worker leaves for it
/// within DROP DATABASE's 5 s).
pub async fn a_failing_drop_database_does_not_stop_pruning(_ctx: Ctx) -> Result<()> {
    // 20,000 claims in batches of 100: a pass looks at the lock before each of its 200
    // batches and in each pause after one.
    let cluster =
        start(preloaded("worker-drop-attempts").set("dedup.prune_batch_size", "100")).await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    // (The attempts' ERRORs, thousands a second, stay out of the server log.)
    admin
        .batch_execute("CREATE ROLE anyone LOGIN; ALTER ROLE anyone SET log_min_messages = fatal")
        .await?;
    let victim = database_with_claims(&cluster, "victim", 0, 0).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let mut attackers = Vec::new();
    for _ in 0..8 {
        let c = connect(&format!("{} user=anyone", cluster.dsn("postgres"))).await?;
        let (stop, refused) = (stop.clone(), refused.clone());
        attackers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for sql in [
                    "DROP DATABASE victim",
                    "ALTER DATABASE victim RENAME TO elsewhere",
                ] {
                    match c.batch_execute(sql).await {
                        Ok(()) => bail!("{sql} succeeded for a plain role"),
                        Err(e) if sqlstate(&e) == Some("42501") => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        // Once the superuser has dropped it, below.
                        Err(e) if sqlstate(&e) == Some("3D000") => {}
                        Err(e) => bail!("{sql} as a plain role: {e}"),
                    }
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = refused.load(Ordering::Relaxed);
    let mark = cluster.log_text().len();
    victim
        .batch_execute(
            "INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 20000) g",
        )
        .await?;
    eventually(
        60,
        "pruning under the loop of failing DROP DATABASE",
        || async { Ok(count(&victim, EXPIRED).await? == 0) },
    )
    .await?;
    let attempts = refused.load(Ordering::Relaxed) - before;
    println!("  {attempts} DROP DATABASE and RENAME attempts refused with 42501 during the pass");
    if attempts < 500 {
        bail!(
            "only {attempts} failing attempts during the pass: the test did not keep the lock busy"
        );
    }
    let log = log_since(&cluster, mark);
    if log.contains("left database \"victim\" in the middle of a pass") {
        bail!(
            "the worker left database victim for a role that may not drop it:\n{}",
            cluster.log_tail(20)
        );
    }
    // The owner (here a superuser) drops it in the middle of a long pass, the loop going on.
    admin
        .batch_execute("ALTER SYSTEM SET dedup.prune_batch_delay = '1s'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    victim
        .batch_execute(
            "INSERT INTO dedup.processed SELECT 'default', 'late-' || g, now() - interval '8 days' FROM generate_series(1, 20000) g",
        )
        .await?;
    eventually(30, "a long pass under way", || async {
        Ok(count(&victim, EXPIRED).await? < 20_000)
    })
    .await?;
    drop(victim);
    let started = Instant::now();
    let dropped = admin.batch_execute("DROP DATABASE victim").await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.await??;
    }
    dropped.map_err(|e| anyhow::anyhow!("DROP DATABASE by a superuser during a pass: {e}"))?;
    println!(
        "  DROP DATABASE by a superuser during a pass, under the loop, took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Hold the one background worker slot left free (`max_worker_processes = 2`: the
/// launcher's and this one) for `secs` seconds: a session runs `SELECT pg_sleep(secs)` in a
/// parallel worker (debug_parallel_query). Returns once the worker runs (trying again if a
/// prune worker had the slot just then), with the task that ends with the query.
async fn hold_the_free_slot(
    cluster: &Cluster,
    admin: &Conn,
    secs: f64,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0);
    let force = if version >= 160_000 {
        "debug_parallel_query"
    } else {
        "force_parallel_mode"
    };
    for _ in 0..20 {
        let holder = connect(&cluster.dsn("postgres")).await?;
        holder.batch_execute(&format!("SET {force} = on")).await?;
        let pid = holder.pid;
        let sql = format!("SELECT pg_sleep({secs})");
        let task = tokio::spawn(async move {
            holder.batch_execute(&sql).await?;
            Ok::<(), anyhow::Error>(())
        });
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let workers: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker' AND leader_pid = $1",
                    &[&pid],
                )
                .await?
                .get(0);
            if workers == 1 {
                return Ok(task);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Its query runs in the session itself: no slot was free when it started.
        admin
            .execute("SELECT pg_cancel_backend($1)", &[&pid])
            .await?;
        let _ = task.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bail!("no parallel worker started in 20 tries: the test could not take the free slot")
}

/// Whether none of `dbs` has an expired claim left.
async fn all_pruned(dbs: &[Conn]) -> Result<bool> {
    for c in dbs {
        if count(c, EXPIRED).await? > 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// CPU time (user and system, seconds) process `pid` has used so far, from /proc.
fn cpu_seconds(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the name in parentheses: the state (field 3), ... utime (14) and stime (15).
    let fields: Vec<&str> = stat[stat.rfind(')').context("/proc/PID/stat")? + 1..]
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).context("utime")?.parse::<u64>()?
        + fields.get(12).context("stime")?.parse::<u64>()?;
    // SAFETY: sysconf only reads a system setting.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Ok(ticks as f64 / hz as f64)
}

/// Parallel query workers (or other extensions') can take every background worker slot.
/// The launcher used to give up its whole cycle at the first database it could not start a
/// worker for, warn, and wait two intervals whatever happened meanwhile; as its back-off
/// started over every cycle, it warned again every two intervals while the slots stayed
/// full. Here `max_worker_processes = 2` leaves one slot beside the launcher, which a
/// parallel worker running pg_sleep holds.
///
/// A: with an interval of 30 s, a cycle starts (a reload) while the slot is held for about
/// 4 s: every database must be pruned soon after the slot is free, not two intervals
/// later. B: with an interval of 1 s, the slot is held for 8 s: one WARNING for the whole
/// shortage, a LOG when it is over, the databases pruned after it, and the launcher waits
/// meanwhile rather than spinning.
pub async fn full_worker_slots_hold_up_pruning_only_while_full(_ctx: Ctx) -> Result<()> {
    let cluster = start(
        preloaded("worker-slots")
            .set("dedup.prune_interval", "30s")
            .set("max_worker_processes", "2")
            .set("max_logical_replication_workers", "0"),
    )
    .await?;
    let admin = connect(&cluster.dsn("postgres")).await?;
    let mut dbs = Vec::new();
    for db in ["a", "b", "c"] {
        dbs.push(database_with_claims(&cluster, db, 0, 0).await?);
    }
    let insert = |phase: &str| {
        format!(
            "INSERT INTO dedup.processed SELECT 'default', '{phase}-' || g, now() - interval '8 days' FROM generate_series(1, 1000) g"
        )
    };
    let no_slot = "could not start a worker to prune database";

    // A. The cluster's first cycle is over (it found no database with dedup); the next is
    // 30 s away, or at the reload below.
    let mark = cluster.log_text().len();
    let holder = hold_the_free_slot(&cluster, &admin, 4.0).await?;
    for c in &dbs {
        c.batch_execute(&insert("a")).await?;
    }
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    eventually(10, "the launcher finding no free slot", || async {
        Ok(log_since(&cluster, mark).contains(no_slot))
    })
    .await
    .with_context(|| cluster.log_tail(40))?;
    holder.await??;
    eventually(
        15,
        "every database pruned once the slot is free (A)",
        || all_pruned(&dbs),
    )
    .await?;
    let log = log_since(&cluster, mark);
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARNING") && l.contains(no_slot))
        .count();
    ensure_eq(warnings, 1, "WARNINGs about the full slots (A)")?;
    if !log.contains("a background worker slot is free again") {
        bail!(
            "no LOG line at the end of the shortage (A):\n{}",
            cluster.log_tail(20)
        );
    }

    // B. Cycles every second; the slot held for 8 s.
    admin
        .batch_execute("ALTER SYSTEM SET dedup.prune_interval = '1s'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let launcher = launcher_pid(&admin)
        .await?
        .context("no dedup launcher in pg_stat_activity")?;
    let mark = cluster.log_text().len();
    let holder = hold_the_free_slot(&cluster, &admin, 8.0).await?;
    let cpu = cpu_seconds(launcher)?;
    for c in &dbs {
        c.batch_execute(&insert("b")).await?;
    }
    eventually(10, "the launcher finding no free slot", || async {
        Ok(log_since(&cluster, mark).contains(no_slot))
    })
    .await
    .with_context(|| cluster.log_tail(40))?;
    holder.await??;
    let cpu = cpu_seconds(launcher)? - cpu;
    eventually(
        15,
        "every database pruned once the slot is free (B)",
        || all_pruned(&dbs),
    )
    .await?;
    let log = log_since(&cluster, mark);
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARNING") && l.contains(no_slot))
        .count();
    let mut wrong = Vec::new();
    if warnings != 1 {
        wrong.push(format!(
            "{warnings} WARNINGs about the full slots over 8 s of cycles every second, not one"
        ));
    }
    if !log.contains("a background worker slot is free again") {
        wrong.push("no LOG line at the end of the shortage".to_string());
    }
    if cpu > 1.0 {
        wrong.push(format!(
            "the launcher used {cpu:.2} s of CPU while the slot was held for 8 s"
        ));
    }
    if !wrong.is_empty() {
        bail!("{}:\n{}", wrong.join("; "), cluster.log_tail(30));
    }
    Ok(())
}

/// The worker visits databases one at a time, so one database whose pass is long (a large
/// table, or a database owner's settings made each batch slow) could hold up every other. A
/// database now gets at most its share of the worker per visit (one interval here, a minute
/// at most), and the next visit goes on from where the last one stopped. Before the fix the
/// small database waited for the large one's whole pass.
pub async fn a_slow_database_does_not_hold_up_the_others(_ctx: Ctx) -> Result<()> {
    // 100 batches of 100 claims, 200 ms apart: a pass of more than 20 s.
    let cluster = start(
        preloaded("worker-share")
            .set("dedup.prune_batch_size", "100")
            .set("dedup.prune_batch_delay", "200"),
    )
    .await?;
    let big = database_with_claims(&cluster, "big", 10_000, 10).await?;
    eventually(30, "the large database's pass begun", || async {
        Ok(count(&big, EXPIRED).await? < 10_000)
    })
    .await?;
    let small = database_with_claims(&cluster, "small", 500, 10).await?;
    eventually(
        10,
        "the small database pruned while the large one's pass goes on",
        || async { Ok(count(&small, EXPIRED).await? == 0) },
    )
    .await?;
    if count(&big, EXPIRED).await? == 0 {
        bail!("the large database's pass ended first: the test needs a longer one");
    }
    let stopped = "SELECT resume_target FROM dedup._prune_status WHERE scope = ''";
    let at: Option<String> = big.query_one(stopped, &[]).await?.get(0);
    ensure_eq(
        at.as_deref(),
        Some("dedup.processed"),
        "where the large database's last visit stopped",
    )?;
    eventually(120, "the large database pruned, visit by visit", || async {
        Ok(count(&big, EXPIRED).await? == 0)
    })
    .await?;
    eventually(10, "its whole pass recorded", || async {
        let row = big
            .query_one(
                "SELECT resume_target IS NULL AND last_pass_at IS NOT NULL \
                   FROM dedup._prune_status WHERE scope = ''",
                &[],
            )
            .await?;
        Ok(row.get::<_, bool>(0))
    })
    .await?;
    let log = cluster.log_text();
    if !log.contains("its share of the worker; the pass goes on from block") {
        bail!(
            "the server log lacks the visits cut short:\n{}",
            cluster.log_tail(30)
        );
    }
    Ok(())
}

/// A visit cut short by its share of the worker is not a failure: it ends a run of failed
/// passes, as a whole pass does. Before the fix only a whole pass reset the count, so on a
/// table whose passes take several visits, failures that came between them (a killed
/// worker, a lock timeout) kept adding up, and the back-off stayed at its longest, 64
/// intervals, while every visit in between succeeded.
pub async fn a_visit_cut_short_ends_a_run_of_failures(_ctx: Ctx) -> Result<()> {
    // 100 batches of 100 claims, 200 ms apart: a pass of several visits of a second.
    let cluster = start(
        preloaded("worker-share-failures")
            .set("dedup.prune_batch_size", "100")
            .set("dedup.prune_batch_delay", "200"),
    )
    .await?;
    let big = database_with_claims(&cluster, "big", 10_000, 10).await?;
    // A visit cut short records where the pass stopped in the row of all scopes, and what
    // it deleted, with the time, in its scope's row, in one transaction.
    let visit = "SELECT d.last_pass_at, a.consecutive_failures FROM dedup._prune_status AS a \
                   JOIN dedup._prune_status AS d ON d.scope = 'default' \
                  WHERE a.scope = '' AND a.resume_target IS NOT NULL";
    eventually(30, "a visit cut short", || async {
        Ok(big.query_opt(visit, &[]).await?.is_some())
    })
    .await?;
    // Six failures in a row, the last an hour ago: the back-off (32 intervals) is over.
    big.batch_execute(
        "UPDATE dedup._prune_status SET consecutive_failures = 6, last_error = 'injected', \
                last_error_at = now() - interval '1 hour' WHERE scope = ''",
    )
    .await?;
    let before: SystemTime = big
        .query_one(
            "SELECT last_pass_at FROM dedup._prune_status WHERE scope = 'default'",
            &[],
        )
        .await?
        .get(0);
    let failures = std::sync::Mutex::new(None);
    eventually(30, "the next visit cut short", || async {
        let row = big.query_opt(visit, &[]).await?;
        Ok(match row {
            Some(r) if r.get::<_, SystemTime>(0) > before => {
                *failures.lock().unwrap() = Some(r.get::<_, i32>(1));
                true
            }
            _ => false,
        })
    })
    .await?;
    let failures = *failures.lock().unwrap();
    ensure_eq(
        failures,
        Some(0),
        "failures in a row after a visit that pruned",
    )
}
