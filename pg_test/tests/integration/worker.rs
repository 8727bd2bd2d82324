//! The background worker, on clusters of their own started with
//! `shared_preload_libraries = 'dedup'` and a prune interval of one second.
use crate::common::{ensure_eq, Ctx};
use anyhow::{bail, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::{connect, connect_when_up, Conn};
use std::future::Future;
use std::time::{Duration, Instant};

fn preloaded(name: &str) -> Options {
    Options::named(name)
        .set("shared_preload_libraries", "dedup")
        .set("dedup.prune_interval", "1s")
        .set("dedup.prune_batch_size", "1000")
}

async fn start(opts: Options) -> Result<Cluster> {
    tokio::task::spawn_blocking(move || Cluster::start(opts)).await?
}

/// Poll `check` until it returns true, for at most `secs` seconds.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F) -> Result<()>
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

async fn count(c: &Conn, sql: &str) -> Result<i64> {
    Ok(c.query_one(sql, &[]).await?.get(0))
}

const EXPIRED: &str =
    "SELECT count(*) FROM dedup.processed WHERE processed_at < now() - interval '7 days'";

/// Create `db` with the extension and `n` claims eight days old, `live` fresh ones.
async fn database_with_claims(cluster: &Cluster, db: &str, n: i64, live: i64) -> Result<Conn> {
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
    let cluster = start(preloaded("worker")).await?;
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
    // SAFETY: kill(2) on the launcher's process id.
    if unsafe { libc::kill(old, libc::SIGKILL) } != 0 {
        bail!("kill -9 {old}: {}", std::io::Error::last_os_error());
    }
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
