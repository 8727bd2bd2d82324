//! A queue consumer whose effect is a call to another service (a payment, an email), with a
//! leased claim: `dedup.lease`, the call with the job id as its idempotency key, a heartbeat
//! while it runs, `dedup.complete` (tokio-postgres, reqwest).
//!
//! No transaction spans a call to another service, so the claim cannot commit together with
//! the effect as in `main.rs`. Instead, for every message, each step in a short transaction
//! of its own: lease the job; on `done` acknowledge the message; on `busy` leave it (another
//! consumer holds the job; the queue delivers the message again); on `acquired` make the
//! call, complete the lease, and only then acknowledge. A consumer that dies holding a lease
//! loses it when it expires, so the job is never lost; one that dies between the call and
//! `dedup.complete` makes the next holder repeat the call, which the idempotency key turns
//! into a no-op at the service.
//!
//! Environment: `DATABASE_URL` (required), `CHARGES_URL` (the service: a POST with an
//! `Idempotency-Key` header, answering JSON), `LEASE_S` (default 30), `WORKERS` (concurrent
//! workers, each with its own connection; default 4), `VISIBILITY_TIMEOUT_S` (default 30),
//! `EXIT_WHEN_EMPTY=1` (exit once every message is acknowledged). The queue is in
//! `examples/schema.sql`.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

const SCOPE: &str = "charges";
/// The heartbeat holds the lease for this long at most.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What this consumer did: `skipped` were done before, `busy` held by another consumer.
#[derive(Default)]
struct Stats {
    done: AtomicU64,
    skipped: AtomicU64,
    busy: AtomicU64,
    failed: AtomicU64,
}

struct Config {
    http: reqwest::Client,
    charges_url: String,
    lease: Duration,
    me: String,
    stats: Stats,
}

/// Why a job was not done: a query failed, or the call did.
#[derive(Debug)]
enum Failure {
    Db(tokio_postgres::Error),
    Call(reqwest::Error),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Db(e)
    }
}

impl From<reqwest::Error> for Failure {
    fn from(e: reqwest::Error) -> Self {
        Failure::Call(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Db(e) => match e.as_db_error() {
                Some(db) => write!(f, "{db}"),
                None => write!(f, "{e}"),
            },
            Failure::Call(e) => write!(f, "{e}"),
        }
    }
}

// [readme:rust-lease]
/// The external effect, with the job id as its idempotency key: the service does a
/// repeated call once. Its JSON answer becomes the job's stored result.
async fn charge(cfg: &Config, job_id: &str) -> Result<serde_json::Value, reqwest::Error> {
    cfg.http
        .post(&cfg.charges_url)
        .header("Idempotency-Key", job_id)
        .json(&serde_json::json!({ "job": job_id, "consumer": cfg.me }))
        .timeout(CALL_TIMEOUT)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await
}

/// Lease the job, charge, complete; each statement is a transaction of its own.
/// `"acquired"`: charged now; `"done"`: done before; both mean: acknowledge the message.
/// `"busy"`: another consumer holds the lease: leave the message unacknowledged.
async fn handle(db: &Client, cfg: &Config, job_id: &str) -> Result<String, Failure> {
    let secs = cfg.lease.as_secs_f64();
    let row = db
        .query_one(
            "SELECT status, lease_id FROM dedup.lease($1, $2, make_interval(secs => $3))",
            &[&job_id, &SCOPE, &secs],
        )
        .await?;
    let (status, lease_id): (String, Option<Uuid>) = (row.get(0), row.get(1));
    let Some(lease_id) = lease_id.filter(|_| status == "acquired") else {
        return Ok(status);
    };
    // The call, and a heartbeat extending the lease every third of its duration meanwhile.
    let call = charge(cfg, job_id);
    tokio::pin!(call);
    let mut heartbeat = tokio::time::interval(cfg.lease / 3);
    heartbeat.tick().await; // the first tick is immediate
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            _ = heartbeat.tick() => {
                // An error (YD002: the lease expired and was taken over) returns, which
                // drops the call: the job is another consumer's now.
                db.execute(
                    "SELECT dedup.extend_lease($1, $2, make_interval(secs => $3), $4)",
                    &[&job_id, &lease_id, &secs, &SCOPE],
                )
                .await?;
            }
        }
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            // Give the job back, so the redelivered copy need not wait for the lease to
            // expire. If the call did reach the service, the key makes the retry harmless.
            db.execute(
                "SELECT dedup.release_lease($1, $2, $3)",
                &[&job_id, &lease_id, &SCOPE],
            )
            .await?;
            return Err(e.into());
        }
    };
    // YD002 here means the lease expired and another consumer took the job over: it repeats
    // the call (the key makes that a no-op) and completes. Do not acknowledge then: if that
    // consumer dies before completing, the redelivered message is what gets the job done; a
    // copy that finds the job done acknowledges it.
    db.execute(
        "SELECT dedup.complete($1, $2, $3, $4)",
        &[&job_id, &lease_id, &answer, &SCOPE],
    )
    .await?;
    Ok(status)
}

/// Receive a batch of messages; acknowledge each only once its job is done.
async fn consume_batch(db: &Client, cfg: &Config, vt: i32) -> Result<usize, tokio_postgres::Error> {
    let batch = db
        .query("SELECT msg_id, job_id FROM queue.receive(10, $1)", &[&vt])
        .await?;
    let stats = &cfg.stats;
    for msg in &batch {
        let (msg_id, job_id): (i64, &str) = (msg.get(0), msg.get(1));
        match handle(db, cfg, job_id).await.as_deref() {
            Ok("busy") => {
                // Not acknowledged: if the holder dies, this copy does the job.
                stats.busy.fetch_add(1, Relaxed);
            }
            Ok(status) => {
                db.execute("SELECT queue.ack($1)", &[&msg_id]).await?;
                let now = status == "acquired"; // else done before
                let n = if now { &stats.done } else { &stats.skipped };
                n.fetch_add(1, Relaxed);
            }
            Err(e) => {
                // Not acknowledged: the queue delivers it again after the visibility timeout.
                stats.failed.fetch_add(1, Relaxed);
                eprintln!("{}: job {job_id} left unacknowledged: {e}", cfg.me);
            }
        }
    }
    Ok(batch.len())
}
// [/readme:rust-lease]

/// One worker: its own connection, receiving until told to stop.
async fn worker(
    url: String,
    cfg: Arc<Config>,
    vt: i32,
    exit_when_empty: bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection error: {e}");
        }
    });
    loop {
        if consume_batch(&client, &cfg, vt).await? > 0 {
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
    let cfg = Arc::new(Config {
        http: reqwest::Client::new(),
        charges_url: env_or("CHARGES_URL", "http://127.0.0.1:8080/charges".to_string()),
        lease: Duration::from_secs_f64(env_or("LEASE_S", 30.0)),
        me: format!("rust-lease-{}", std::process::id()),
        stats: Stats::default(),
    });
    let tasks: Vec<_> = (0..workers)
        .map(|_| tokio::spawn(worker(url.clone(), cfg.clone(), vt, exit_when_empty)))
        .collect();
    let mut ok = true;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("{}: worker stopped: {e}", cfg.me);
                ok = false;
            }
            Err(e) => {
                eprintln!("{}: worker panicked: {e}", cfg.me);
                ok = false;
            }
        }
    }
    let s = &cfg.stats;
    println!(
        "{} summary done={} skipped={} busy={} failed={}",
        cfg.me,
        s.done.load(Relaxed),
        s.skipped.load(Relaxed),
        s.busy.load(Relaxed),
        s.failed.load(Relaxed)
    );
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
