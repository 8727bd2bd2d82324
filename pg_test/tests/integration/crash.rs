//! Crashes: a backend killed with SIGKILL (the postmaster then restarts every backend and
//! recovers), and a server stopped with `-m immediate`. Each test runs its own cluster,
//! because a crash takes down every session on the server.
use crate::common::{claim, ensure_eq, kill9, redeliver, Ctx, Writers};
use anyhow::{bail, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::{connect, connect_when_up};
use std::time::Duration;

async fn own_cluster(name: &str) -> Result<(Cluster, String)> {
    let cluster = tokio::task::spawn_blocking({
        let name = name.to_string();
        move || Cluster::start(Options::named(&name))
    })
    .await??;
    cluster.create_db_with_extension("crash")?;
    let dsn = cluster.dsn("crash");
    Ok((cluster, dsn))
}

pub async fn killed_backend_loses_its_claim_and_server_keeps_committed_ones(
    _ctx: Ctx,
) -> Result<()> {
    let (cluster, dsn) = own_cluster("kill9").await?;
    let setup = connect(&dsn).await?;
    setup
        .batch_execute(
            "CREATE TABLE effects (job_id text);
             BEGIN; SELECT dedup.try_claim('kept'); INSERT INTO effects VALUES ('kept'); COMMIT;",
        )
        .await?;
    let a = connect(&dsn).await?;
    a.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&a, "SELECT dedup.try_claim('k9')").await?,
        true,
        "A's claim",
    )?;
    a.batch_execute("INSERT INTO effects VALUES ('k9 by A')")
        .await?;

    kill9(a.pid)?;
    // The postmaster notices, terminates every backend and runs crash recovery.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = connect_when_up(&dsn).await?;
    b.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&b, "SELECT dedup.try_claim('k9')").await?,
        true,
        "claim after the crash",
    )?;
    b.batch_execute("INSERT INTO effects VALUES ('k9 by B'); COMMIT")
        .await?;
    b.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&b, "SELECT dedup.try_claim('kept')").await?,
        false,
        "claim committed before the crash",
    )?;
    b.batch_execute("COMMIT").await?;
    let effects: Vec<String> = b
        .query("SELECT job_id FROM effects ORDER BY 1", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(
        effects,
        vec!["k9 by B".to_string(), "kept".to_string()],
        "effects",
    )?;
    let log = cluster.log_tail(200);
    if !log.contains("was terminated by signal 9") {
        bail!("the server log does not show the crash:\n{log}");
    }
    Ok(())
}

pub async fn immediate_stop_keeps_committed_claims_only(_ctx: Ctx) -> Result<()> {
    let (mut cluster, dsn) = own_cluster("immediate").await?;
    let a = connect(&dsn).await?;
    a.batch_execute(
        "BEGIN; SELECT dedup.try_claim('committed-' || g) FROM generate_series(1, 100) g; COMMIT;",
    )
    .await?;
    let open = connect(&dsn).await?;
    open.batch_execute(
        "BEGIN; SELECT dedup.try_claim('uncommitted-' || g) FROM generate_series(1, 100) g;",
    )
    .await?;
    // Committed with synchronous_commit on: durable in the WAL before COMMIT returned.
    let _cluster = tokio::task::spawn_blocking(move || -> Result<Cluster> {
        cluster.stop("immediate")?;
        cluster.start_again()?;
        Ok(cluster)
    })
    .await??;
    drop((a, open));
    let b = connect_when_up(&dsn).await?;
    let row = b
        .query_one(
            "SELECT count(*) FILTER (WHERE job_id LIKE 'committed-%'), \
                    count(*) FILTER (WHERE job_id LIKE 'uncommitted-%') FROM dedup.processed",
            &[],
        )
        .await?;
    ensure_eq(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (100, 0),
        "claims after recovery",
    )?;
    b.batch_execute("BEGIN").await?;
    let again = b
        .query_one(
            "SELECT count(*) FILTER (WHERE dedup.try_claim('committed-' || g)), \
                    count(*) FILTER (WHERE dedup.try_claim('uncommitted-' || g)) \
             FROM generate_series(1, 100) g",
            &[],
        )
        .await?;
    ensure_eq(
        (again.get::<_, i64>(0), again.get::<_, i64>(1)),
        (0, 100),
        "re-claims after recovery",
    )?;
    b.batch_execute("COMMIT").await?;
    Ok(())
}

/// set_result knows "a claim of this transaction" by the row's 32-bit xmin. A claim kept
/// for 2^32 transactions shares those bits with one transaction of the next epoch, which
/// could then store a result for a job it never claimed. Here pg_resetwal moves the
/// server to the next epoch, just before the claim's xid: the transaction that gets that
/// xid again is refused (55000). Before the fix its set_result overwrote the claimer's
/// result.
pub async fn set_result_refuses_a_claim_of_an_earlier_epoch(_ctx: Ctx) -> Result<()> {
    let mut cluster = tokio::task::spawn_blocking(|| {
        Cluster::start(Options::named("epoch").set("autovacuum", "off"))
    })
    .await??;
    cluster.create_db_with_extension("crash")?;
    let dsn = cluster.dsn("crash");
    let c = connect(&dsn).await?;
    c.batch_execute(
        "BEGIN; SELECT dedup.try_claim('old'); SELECT dedup.set_result('old', '{\"by\": \"claimer\"}'); COMMIT;",
    )
    .await?;
    let xmin: i64 = c
        .query_one(
            "SELECT xmin::text::int8 FROM dedup.processed WHERE job_id = 'old'",
            &[],
        )
        .await?
        .get(0);
    // Frozen, as a claim that old would be: visible whatever its xid's status (and so is
    // everything else of this database and the shared catalogs, whose latest rows have
    // xids the next epoch will hand out again).
    c.batch_execute("VACUUM (FREEZE)").await?;
    c.batch_execute("CHECKPOINT").await?;
    drop(c);
    let start_at = xmin - 5;
    let mut cluster = tokio::task::spawn_blocking(move || -> Result<Cluster> {
        cluster.stop("fast")?;
        dedup_pg_test::cluster::run(
            dedup_pg_test::cluster::as_server_user(cluster.bindir.join("pg_resetwal"))
                .args(["-e", "1", "-x", &start_at.to_string(), "-D"])
                .arg(&cluster.data),
        )?;
        cluster.start_again()?;
        Ok(cluster)
    })
    .await??;
    let c = connect_when_up(&dsn).await?;
    // Spend transaction ids until the next one is the claim's, in the new epoch.
    let mut next: i64 = 0;
    for _ in 0..20 {
        next = c
            .query_one(
                "SELECT (pg_current_xact_id()::text::int8 % 4294967296)",
                &[],
            )
            .await?
            .get(0);
        if next == xmin - 1 {
            break;
        }
    }
    if next != xmin - 1 {
        bail!("the new epoch's transaction ids did not reach {xmin} (at {next}): the test's setup failed");
    }
    c.batch_execute("BEGIN").await?;
    let mine: i64 = c
        .query_one("SELECT pg_current_xact_id()::text::int8", &[])
        .await?
        .get(0);
    if mine % 4294967296 != xmin || mine < 4294967296 {
        bail!("this transaction's id is {mine}, not {xmin} of the next epoch: the test's setup failed");
    }
    let refused = c
        .batch_execute("SELECT dedup.set_result('old', '{\"by\": \"intruder\"}')")
        .await;
    c.batch_execute("ROLLBACK").await?;
    match refused {
        Err(e) if e.code().map(|s| s.code()) == Some("55000") => {}
        Err(e) => bail!("set_result of an earlier epoch's claim: {e}"),
        Ok(()) => bail!("set_result stored a result for a claim of an earlier epoch"),
    }
    let by: String = c
        .query_one("SELECT result->>'by' FROM dedup.claim_result('old')", &[])
        .await?
        .get(0);
    ensure_eq(by.as_str(), "claimer", "the stored result")?;
    cluster.stop("fast")?;
    Ok(())
}

/// A failover: four writers claim new jobs, each claim and its effect in one transaction,
/// on a primary with a streaming standby, until the primary is stopped with
/// `-m immediate` under them; the standby is promoted. With the standby synchronous
/// (`synchronous_commit = on`, the default, and `synchronous_standby_names`), every
/// commit a writer saw acknowledged is on the promoted server. Asynchronous, some may be
/// missing (counted, not required to be zero or not). Either way, on the promoted server
/// every claim has its effect and every effect its claim, and redelivering every job a
/// writer tried (acknowledged or not) runs each missing one once and no other: each job's
/// effect exists exactly once.
pub async fn failover_keeps_what_the_standby_replayed(_ctx: Ctx) -> Result<()> {
    for synchronous in [true, false] {
        let name = if synchronous {
            "failover-sync"
        } else {
            "failover-async"
        };
        let mut primary =
            tokio::task::spawn_blocking(move || Cluster::start(Options::named(name))).await??;
        primary.create_db_with_extension("crash")?;
        primary.psql("crash", "CREATE TABLE effects (job_id text NOT NULL)")?;
        let standby = Cluster::standby_of(
            &primary,
            Options::named("failover-standby").set("cluster_name", "standby1"),
        )?;
        if synchronous {
            primary.psql(
                "postgres",
                "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
            )?;
            primary.psql("postgres", "SELECT pg_reload_conf()")?;
        }
        let admin = connect(&primary.dsn("postgres")).await?;
        let want = if synchronous { "sync" } else { "async" };
        let streaming = crate::worker::eventually(30, "the standby streaming", || async {
            let state: Option<String> = admin
                .query_opt(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'",
                    &[],
                )
                .await?
                .map(|r| r.get(0));
            Ok(state.as_deref() == Some(want))
        })
        .await;
        if let Err(e) = streaming {
            let all: Vec<String> = admin
                .query(
                    "SELECT application_name || ' ' || state || ' ' || sync_state FROM pg_stat_replication",
                    &[],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            bail!(
                "{e:#}: not {want} (pg_stat_replication: {all:?}); the standby's log:\n{}",
                standby.log_tail(15)
            );
        }
        drop(admin);

        let writers = Writers::start(&primary.dsn("crash"), 4);
        tokio::time::sleep(Duration::from_secs(3)).await;
        tokio::task::block_in_place(|| primary.stop("immediate"))?;
        let (tried, acked) = writers.finish().await?;
        ensure_eq(
            acked.len() > 100,
            true,
            "commits acknowledged before the stop",
        )?;
        tokio::task::block_in_place(|| standby.promote())?;
        let s = connect_when_up(&standby.dsn("crash")).await?;
        let claimed: std::collections::HashSet<String> = s
            .query("SELECT job_id FROM dedup.processed", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let effects: Vec<String> = s
            .query("SELECT job_id FROM effects", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let effect_set: std::collections::HashSet<String> = effects.iter().cloned().collect();
        ensure_eq(effects.len(), effect_set.len(), "effects with one row each")?;
        ensure_eq(
            &claimed,
            &effect_set,
            "claims and effects on the promoted server",
        )?;
        let missing = acked.iter().filter(|j| !claimed.contains(*j)).count();
        println!(
            "  {}: {} commits acknowledged, {} on the promoted server, {missing} acknowledged and missing",
            if synchronous { "synchronous standby" } else { "asynchronous standby" },
            acked.len(),
            claimed.len()
        );
        if synchronous {
            ensure_eq(
                missing,
                0,
                "acknowledged commits missing after a synchronous failover",
            )?;
        }
        // Every job redelivered to the promoted server: each runs at most once more, and
        // afterwards each has exactly one effect.
        let ran_again = redeliver(&s, &tried).await?;
        let (rows, distinct): (i64, i64) = {
            let r = s
                .query_one("SELECT count(*), count(DISTINCT job_id) FROM effects", &[])
                .await?;
            (r.get(0), r.get(1))
        };
        ensure_eq(rows, distinct, "effects after redelivery: one per job")?;
        ensure_eq(
            distinct as usize,
            tried.len(),
            "every job tried has its effect",
        )?;
        ensure_eq(
            ran_again,
            tried.len() - claimed.len(),
            "jobs run again: those the promoted server did not have",
        )?;
        drop(s);
        drop(standby);
        drop(primary);
    }
    Ok(())
}
