//! Crashes: a backend killed with SIGKILL (the postmaster then restarts every backend and
//! recovers), and a server stopped with `-m immediate`. Each test runs its own cluster,
//! because a crash takes down every session on the server.
use crate::common::{claim, ensure_eq, Ctx};
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

    // SAFETY: kill(2) on a process id we just read from the server.
    if unsafe { libc::kill(a.pid, libc::SIGKILL) } != 0 {
        bail!(
            "kill -9 {} failed: {}",
            a.pid,
            std::io::Error::last_os_error()
        );
    }
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
