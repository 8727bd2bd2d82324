//! The short demonstration behind `make demo-sessions`: a throwaway server with the extension, two
//! sessions handling two copies of one job at the same time, and a consumer that dies
//! mid-transaction. Every server it starts is stopped at the end, also on Ctrl-C.
use anyhow::{bail, Result};
use dedup_pg_test::cluster::{stop_all_on_signal, Cluster, Options};
use dedup_pg_test::{connect, wait_until_blocked, Conn};

async fn claimed(c: &Conn, who: &str, job: &str) -> Result<bool> {
    let fresh: bool = c
        .query_one("SELECT dedup.try_claim($1)", &[&job])
        .await?
        .get(0);
    println!("  {who}: SELECT dedup.try_claim('{job}')  ->  {fresh}");
    Ok(fresh)
}

/// B's side: the call is printed when it is sent, its result when it returns.
async fn claimed_after_wait(c: &Conn, job: &str) -> Result<bool> {
    println!("  B: SELECT dedup.try_claim('{job}')  ...");
    let fresh: bool = c
        .query_one("SELECT dedup.try_claim($1)", &[&job])
        .await?
        .get(0);
    println!("  B: ...  ->  {fresh}");
    Ok(fresh)
}

async fn two_copies(dsn: &str, job: &str, first_ends: &str) -> Result<()> {
    let (a, b, observer) = (
        connect(dsn).await?,
        connect(dsn).await?,
        connect(dsn).await?,
    );
    a.batch_execute("BEGIN").await?;
    println!("  A: BEGIN");
    claimed(&a, "A", job).await?;
    a.execute("INSERT INTO receipts VALUES ($1, 'A')", &[&job])
        .await?;
    println!("  A: INSERT INTO receipts ...  (the effect, same transaction)");
    b.batch_execute("BEGIN").await?;
    println!("  B: BEGIN");
    let (job_b, b_pid) = (job.to_string(), b.pid);
    let b_task = tokio::spawn(async move {
        let fresh = claimed_after_wait(&b, &job_b).await?;
        if fresh {
            b.execute("INSERT INTO receipts VALUES ($1, 'B')", &[&job_b])
                .await?;
            println!("  B: INSERT INTO receipts ...");
        } else {
            println!("  B: skips the effect and acknowledges the message");
        }
        b.batch_execute("COMMIT").await?;
        println!("  B: COMMIT");
        anyhow::Ok(())
    });
    wait_until_blocked(&observer, b_pid).await?;
    println!("  B: ... waits: A's transaction holds the claim");
    // Each of A's actions is printed before it runs: B cannot move before it does.
    if first_ends == "crash" {
        println!("  A: ** the consumer dies mid-transaction (pg_terminate_backend) **");
        observer
            .execute("SELECT pg_terminate_backend($1)", &[&a.pid])
            .await?;
    } else {
        println!("  A: COMMIT");
        a.batch_execute("COMMIT").await?;
    }
    b_task.await??;
    let rows: Vec<String> = observer
        .query(
            "SELECT job_id || ' done by ' || done_by FROM receipts WHERE job_id = $1",
            &[&job],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    println!("  receipts for {job}: {rows:?}  ->  exactly once\n");
    if rows.len() != 1 {
        bail!("expected exactly one receipt for {job}, found {rows:?}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    stop_all_on_signal();
    let cluster = tokio::task::spawn_blocking(|| -> Result<Cluster> {
        let c = Cluster::start(Options::named("demo"))?;
        c.create_db_with_extension("demo")?;
        Ok(c)
    })
    .await??;
    println!(
        "dedup demo: throwaway PostgreSQL on 127.0.0.1:{} with CREATE EXTENSION dedup\n",
        cluster.port
    );
    let dsn = cluster.dsn("demo");
    connect(&dsn)
        .await?
        .batch_execute("CREATE TABLE receipts (job_id text, done_by text)")
        .await?;

    println!("1. Two copies of job-42 arrive at two consumers at the same moment:");
    let r = two_copies(&dsn, "job-42", "commit").await;
    println!("2. Two copies of job-43; the first consumer dies before committing:");
    let r = r.and(two_copies(&dsn, "job-43", "crash").await);
    drop(cluster);
    r?;
    println!("The server is stopped and its directory removed.");
    Ok(())
}
