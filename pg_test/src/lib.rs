//! Helpers shared by dedup's integration tests, demo and benchmarks: throwaway clusters
//! and tokio-postgres connections that keep the server's notices and warnings; and the
//! guide's Redis Streams experiment ([`experiment`]).
pub mod children;
pub mod citus;
pub mod cluster;
pub mod doctest;
pub mod experiment;

use anyhow::{bail, Result};
use futures_util::{stream, StreamExt};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// A connection plus every NOTICE/WARNING the server sent on it.
pub struct Conn {
    pub client: Client,
    pub notices: Arc<Mutex<Vec<tokio_postgres::error::DbError>>>,
    /// Backend process id (`pg_backend_pid()`).
    pub pid: i32,
}

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Conn {
    /// Take the notices received so far.
    pub fn take_notices(&self) -> Vec<tokio_postgres::error::DbError> {
        std::mem::take(&mut *self.notices.lock().unwrap())
    }
}

/// Connect and start the task that drives the connection.
pub async fn connect(dsn: &str) -> Result<Conn> {
    let (client, mut connection) = tokio_postgres::connect(dsn, NoTls).await?;
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    tokio::spawn(async move {
        let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(msg) = messages.next().await {
            match msg {
                Ok(AsyncMessage::Notice(n)) => sink.lock().unwrap().push(n),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    Ok(Conn {
        client,
        notices,
        pid,
    })
}

/// The SQLSTATE of a failed query, if the server sent one.
pub fn sqlstate(err: &tokio_postgres::Error) -> Option<&str> {
    err.code().map(|c| c.code())
}

/// Connect, retrying for up to 60 s while the server starts or recovers from a crash.
pub async fn connect_when_up(dsn: &str) -> Result<Conn> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match connect(dsn).await {
            Ok(c) => return Ok(c),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => return Err(e),
        }
    }
}

/// Wait until backend `pid` is blocked on a lock (e.g. another transaction's claim).
pub async fn wait_until_blocked(observer: &Conn, pid: i32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = observer
            .query_one(
                "SELECT coalesce(wait_event_type, '') || ':' || coalesce(wait_event, '') \
                 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await?;
        let wait: String = row.get(0);
        if wait.starts_with("Lock:") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("backend {pid} never blocked (last wait state {wait:?})");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every claim as (scope, job_id, processed_at as text), in key order.
pub async fn claims(c: &Conn) -> Result<Vec<(String, String, String)>> {
    Ok(c.query(
        "SELECT scope, job_id, processed_at::text FROM dedup.processed ORDER BY 1, 2",
        &[],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect())
}

/// A test's error that says it cannot apply to this run, and why (the integration harness
/// counts it as not applicable, not as passed): e.g. `pg_upgrade` from an older major when
/// this run installed dedup into no older major.
#[derive(Debug)]
pub struct NotApplicable(pub String);

impl std::fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotApplicable {}
