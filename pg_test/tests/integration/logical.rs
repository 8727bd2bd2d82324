//! A blue/green switch through logical replication, the way managed services move a
//! database to a new major and teams move databases between servers: the steps of
//! docs/operations.md ("A blue/green switch"), run as written.
use crate::common::{ensure_eq, redeliver, Ctx, Writers};
use crate::upgrade::{answers_as_before, bindir_of, holdings, HELD};
use crate::worker::{count, eventually};
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::connect;
use std::collections::HashSet;
use std::time::Duration;

/// The publication docs/operations.md gives: dedup's four tables that hold what a user
/// relies on, and the application's own (here `effects`), in one publication, so that a
/// claim and its effect arrive in the one transaction they were committed in.
pub const PUBLICATION: &str = "CREATE PUBLICATION dedup_switch FOR TABLE \
    dedup.processed, dedup.offsets, dedup.scope_retention, dedup.forgotten, public.effects";

/// Blue (the oldest major this run tested before, when there is one, else this major)
/// publishes; green (this major) subscribes with its worker off. Blue has claims,
/// fingerprints, a stored result, a running lease, an offset, a scope retention and a
/// forgotten job's audit row, and its worker prunes while the subscription copies and
/// streams: the DELETEs of its passes reach green (dedup.forgotten's too, which has no key
/// and replicates by its whole row). Four writers claim jobs with their effects on blue;
/// at the switch blue takes no more connections and its sessions are terminated (a claim
/// in flight rolls back with its effect), green replays up to blue's last WAL position, the
/// subscription is dropped and green's worker turned on. Then green holds what blue held,
/// every acknowledged claim among it, and refuses each of them: redelivering every job a
/// writer tried runs only those blue never committed, each effect exists once, and green's
/// worker prunes.
pub async fn blue_green_switch_keeps_every_claim(_ctx: Ctx) -> Result<()> {
    let from = std::env::var("DEDUP_UPGRADE_FROM").unwrap_or_default();
    let blue_bindir = match from.split_whitespace().next() {
        Some(pg_config) => bindir_of(pg_config)?,
        None => dedup_pg_test::cluster::bindir()?,
    };
    let blue = tokio::task::spawn_blocking(move || {
        Cluster::start_with(
            blue_bindir,
            Options::named("blue")
                .set("shared_preload_libraries", "dedup")
                .set("dedup.prune_interval", "1s")
                .set("wal_level", "logical"),
        )
    })
    .await??;
    let green = tokio::task::spawn_blocking(|| {
        Cluster::start(
            Options::named("green")
                .set("shared_preload_libraries", "dedup")
                .set("dedup.prune_interval", "0"),
        )
    })
    .await??;
    for c in [&blue, &green] {
        c.psql("postgres", "CREATE DATABASE app")?;
        c.psql(
            "app",
            "CREATE EXTENSION dedup; CREATE TABLE effects (job_id text NOT NULL)",
        )?;
    }
    let b = connect(&blue.dsn("app")).await?;
    b.batch_execute(HELD).await?;
    b.batch_execute(
        "BEGIN; SELECT dedup.try_claim('gone-short', 'short'); COMMIT;
         SELECT dedup.forget('gone-short', 'short');",
    )
    .await?;
    blue.psql("app", PUBLICATION)?;
    green.psql(
        "app",
        &format!(
            "CREATE SUBSCRIPTION dedup_switch CONNECTION '{}' PUBLICATION dedup_switch",
            blue.dsn("app")
        ),
    )?;
    let g = connect(&green.dsn("app")).await?;
    if let Err(e) = eventually(
        60,
        "the subscription's first copy of every table",
        || async {
            Ok(count(
                &g,
                "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'",
            )
            .await?
                == 0)
        },
    )
    .await
    {
        bail!("{e:#}; green's log:\n{}", green.log_tail(20));
    }

    // Blue's worker prunes claims and an audit row past their retention (backdated here):
    // the deletes reach green.
    b.batch_execute(
        "BEGIN; SELECT dedup.try_claim('old-' || g, 'short') FROM generate_series(1, 50) g; COMMIT;
         UPDATE dedup.processed SET processed_at = now() - interval '2 hours' WHERE scope = 'short';
         UPDATE dedup.forgotten SET forgotten_at = now() - interval '2 hours' WHERE scope = 'short';",
    )
    .await
    .context("backdating rows of published tables on blue")?;

    // Writers on blue, until the switch ends their sessions.
    let writers = Writers::start(&format!("{} application_name=writer", blue.dsn("app")), 4);
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The switch. 1: blue takes no new sessions, and those it has are ended.
    let admin = connect(&blue.dsn("postgres")).await?;
    admin
        .batch_execute(
            "ALTER DATABASE app WITH ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = 'app' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
                AND application_name = 'writer';",
        )
        .await?;
    let (tried, acked) = writers.finish().await?;
    ensure_eq(acked.len() > 100, true, "commits acknowledged on blue")?;
    // 2: green has replayed everything blue wrote.
    let lsn: String = admin
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    if let Err(e) = eventually(60, "green replaying up to blue's last position", || async {
        Ok(admin
            .query_opt(
                "SELECT 1 FROM pg_stat_replication
                  WHERE application_name = 'dedup_switch' AND replay_lsn >= $1::text::pg_lsn",
                &[&lsn],
            )
            .await?
            .is_some())
    })
    .await
    {
        bail!("{e:#}; green's log:\n{}", green.log_tail(20));
    }
    let blue_holds = holdings(&b).await?;
    let pruned_on_blue = (
        count(
            &b,
            "SELECT count(*) FROM dedup.processed WHERE scope = 'short'",
        )
        .await?,
        count(
            &b,
            "SELECT count(*) FROM dedup.forgotten WHERE scope = 'short'",
        )
        .await?,
    );
    ensure_eq(
        pruned_on_blue,
        (0, 0),
        "the backdated claims and audit row pruned on blue",
    )?;
    drop(b);
    // 3: the subscription goes (its slot on blue, which it cannot reach now, by hand), and
    // green's worker starts.
    g.batch_execute(
        "ALTER SUBSCRIPTION dedup_switch DISABLE;
         ALTER SUBSCRIPTION dedup_switch SET (slot_name = NONE);
         DROP SUBSCRIPTION dedup_switch;",
    )
    .await?;
    admin
        .batch_execute("SELECT pg_drop_replication_slot('dedup_switch')")
        .await?;
    green.psql("postgres", "ALTER SYSTEM SET dedup.prune_interval = '1s'")?;
    green.psql("postgres", "SELECT pg_reload_conf()")?;

    // Green holds what blue held.
    let green_holds = holdings(&g).await?;
    if green_holds != blue_holds {
        let missing: Vec<_> = blue_holds
            .iter()
            .filter(|h| !green_holds.contains(h))
            .take(5)
            .collect();
        let extra: Vec<_> = green_holds
            .iter()
            .filter(|h| !blue_holds.contains(h))
            .take(5)
            .collect();
        bail!(
            "green holds {} rows, blue {}; missing on green {missing:?}, only on green {extra:?}",
            green_holds.len(),
            blue_holds.len()
        );
    }
    ensure_eq(
        (
            count(
                &g,
                "SELECT count(*) FROM dedup.processed WHERE scope = 'short'",
            )
            .await?,
            count(
                &g,
                "SELECT count(*) FROM dedup.forgotten WHERE scope = 'short'",
            )
            .await?,
        ),
        (0, 0),
        "blue's prunes on green",
    )?;
    let claimed: HashSet<String> = g
        .query(
            "SELECT job_id FROM dedup.processed WHERE job_id LIKE 'w%-%'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let missing = acked.iter().filter(|j| !claimed.contains(*j)).count();
    ensure_eq(missing, 0, "acknowledged claims missing on green")?;
    let versions: Vec<String> = {
        let mut v = Vec::new();
        for c in [&admin, &g] {
            v.push(c.query_one("SHOW server_version", &[]).await?.get(0));
        }
        v
    };
    println!(
        "  blue/green {} -> {}: {} claims acknowledged on blue ({} tried), {} on green, {} rows of dedup compared",
        versions[0],
        versions[1],
        acked.len(),
        tried.len(),
        claimed.len(),
        green_holds.len()
    );

    // Green refuses what blue did: every copy redelivered to green.
    let ran_again = redeliver(&g, &tried).await?;
    ensure_eq(
        ran_again,
        tried.len() - claimed.len(),
        "jobs run again on green: those blue never committed",
    )?;
    let r = g
        .query_one(
            "SELECT count(*), count(DISTINCT job_id) FROM effects WHERE job_id LIKE 'w%-%'",
            &[],
        )
        .await?;
    ensure_eq(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (tried.len() as i64, tried.len() as i64),
        "effects on green: one per job tried",
    )?;
    answers_as_before(&g).await?;
    let retention: String = g
        .query_one("SELECT dedup.retention('short')::text", &[])
        .await?
        .get(0);
    ensure_eq(retention.as_str(), "01:00:00", "the scope's retention")?;

    // Green's worker prunes.
    g.batch_execute(
        "BEGIN; SELECT dedup.try_claim('late-' || g, 'short') FROM generate_series(1, 20) g; COMMIT;
         UPDATE dedup.processed SET processed_at = now() - interval '2 hours' WHERE scope = 'short';",
    )
    .await?;
    if let Err(e) = eventually(60, "green's worker pruning", || async {
        Ok(count(
            &g,
            "SELECT count(*) FROM dedup.processed WHERE scope = 'short'",
        )
        .await?
            == 0)
    })
    .await
    {
        bail!("{e:#}; green's log:\n{}", green.log_tail(20));
    }
    let log = blue.log_text();
    if let Some(w) = log
        .lines()
        .find(|l| l.contains("WARNING") && l.contains("dedup"))
    {
        bail!("blue's worker warned while its tables were published: {w}");
    }
    drop(g);
    drop(admin);
    drop(green);
    drop(blue);
    Ok(())
}
