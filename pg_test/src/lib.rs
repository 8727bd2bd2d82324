//! Helpers shared by dedup's integration tests, demo and benchmarks: throwaway clusters
//! and tokio-postgres connections that keep the server's notices and warnings.
pub mod cluster;

use anyhow::Result;
use futures_util::{stream, StreamExt};
use std::sync::{Arc, Mutex};
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
