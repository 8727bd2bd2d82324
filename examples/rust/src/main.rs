//! A queue consumer that does each job's effect exactly once with `dedup.try_claim`
//! (tokio-postgres, async).
//!
//! For every message: claim its job and write the effect in one transaction, commit, and
//! only then acknowledge the message. A message whose transaction did not commit is not
//! acknowledged, so the queue delivers it again. The whole transaction is retried on
//! serialization failure (40001) and deadlock (40P01).
//!
//! Environment: `DATABASE_URL` (required), `WORKERS` (concurrent workers, each with its own
//! connection; default 4), `VISIBILITY_TIMEOUT_S` (default 30), `EXIT_WHEN_EMPTY=1` (exit
//! once every message is acknowledged, instead of polling for ever). The queue and the
//! `receipts` table are in `examples/schema.sql`.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Error, NoTls};

const MAX_ATTEMPTS: u32 = 5;

/// What this consumer did: the guide's diagnostic hook (a rise in `skipped` means more
/// duplicates are arriving; none for weeks means the claim may not be wired in).
#[derive(Default)]
struct Stats {
    done: AtomicU64,
    skipped: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
}

// [readme:rust]
/// Claim the job and write its effect in one transaction. `Ok(true)`: done now;
/// `Ok(false)`: a committed claim exists, the job was done before. Either way the
/// transaction has committed and the message can be acknowledged.
async fn handle(client: &mut Client, job_id: &str, me: &str) -> Result<bool, Error> {
    let tx = client.transaction().await?;
    let fresh: bool = tx
        .query_one("SELECT dedup.try_claim($1)", &[&job_id])
        .await?
        .get(0);
    if fresh {
        tx.execute(
            "INSERT INTO receipts (job_id, consumer) VALUES ($1, $2)",
            &[&job_id, &me],
        )
        .await?;
    }
    // An effect outside the database (an email, a payment) cannot join this transaction:
    // lease it instead (src/lease.rs).
    tx.commit().await?; // an error here, too, means: not committed, do not acknowledge
    Ok(fresh)
}

/// Retry the whole transaction on serialization failure and deadlock.
async fn handle_with_retry(
    c: &mut Client,
    job_id: &str,
    me: &str,
    stats: &Stats,
) -> Result<bool, Error> {
    let mut attempt = 1;
    loop {
        match handle(c, job_id, me).await {
            Err(e) if attempt < MAX_ATTEMPTS && retryable(&e) => {
                stats.retried.fetch_add(1, Relaxed);
                tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                attempt += 1;
            }
            result => return result,
        }
    }
}

fn retryable(e: &Error) -> bool {
    e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
        || e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED)
}

/// Receive a batch of messages; acknowledge each only after its transaction committed.
async fn consume_batch(c: &mut Client, me: &str, vt: i32, stats: &Stats) -> Result<usize, Error> {
    let batch = c
        .query("SELECT msg_id, job_id FROM queue.receive(10, $1)", &[&vt])
        .await?;
    for msg in &batch {
        let (msg_id, job_id): (i64, &str) = (msg.get(0), msg.get(1));
        match handle_with_retry(c, job_id, me, stats).await {
            Ok(fresh) => {
                c.execute("SELECT queue.ack($1)", &[&msg_id]).await?;
                let n = if fresh { &stats.done } else { &stats.skipped };
                n.fetch_add(1, Relaxed);
            }
            Err(e) => {
                // Not acknowledged: the queue delivers it again after the visibility timeout.
                stats.failed.fetch_add(1, Relaxed);
                let why = e.as_db_error().map_or(e.to_string(), |db| db.to_string());
                eprintln!("{me}: job {job_id} left unacknowledged: {why}");
            }
        }
    }
    Ok(batch.len())
}
// [/readme:rust]

/// One worker: its own connection, receiving until told to stop.
async fn worker(
    url: String,
    me: String,
    vt: i32,
    exit_when_empty: bool,
    stats: Arc<Stats>,
) -> Result<(), Error> {
    let (mut client, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection error: {e}");
        }
    });
    loop {
        if consume_batch(&mut client, &me, vt, &stats).await? > 0 {
            continue;
        }
        if exit_when_empty {
            let pending: i64 = client
                .query_one("SELECT queue.pending()", &[])
                .await?
                .get(0);
            if pending == 0 {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("set DATABASE_URL, e.g. postgresql://user@localhost/db");
        return std::process::ExitCode::FAILURE;
    };
    let workers: usize = env_or("WORKERS", 4);
    let vt: i32 = env_or("VISIBILITY_TIMEOUT_S", 30);
    let exit_when_empty = std::env::var("EXIT_WHEN_EMPTY").is_ok_and(|v| v == "1");
    let me = format!("rust-{}", std::process::id());
    let stats = Arc::new(Stats::default());
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            tokio::spawn(worker(
                url.clone(),
                me.clone(),
                vt,
                exit_when_empty,
                stats.clone(),
            ))
        })
        .collect();
    let mut ok = true;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("{me}: worker stopped: {e}");
                ok = false;
            }
            Err(e) => {
                eprintln!("{me}: worker panicked: {e}");
                ok = false;
            }
        }
    }
    println!(
        "{me} summary done={} skipped={} retried={} failed={}",
        stats.done.load(Relaxed),
        stats.skipped.load(Relaxed),
        stats.retried.load(Relaxed),
        stats.failed.load(Relaxed)
    );
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
