//! A stand-in for an external service (a payment provider) for the lease examples: a tiny
//! HTTP/1.1 server in the test process, outside every consumer's transaction. It honours an
//! `Idempotency-Key` header as such services do (the first call with a key charges, a later
//! one answers with the same charge and charges nothing), records every call, and injects
//! faults: refusals before the effect, responses lost after it, and slow calls.
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the service did to a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Answered at once.
    None,
    /// 503 before the effect: nothing charged.
    Refused,
    /// The effect (if the key is new), then the connection closed without an answer.
    AnswerLost,
    /// The effect (if the key is new), then the answer after `SLOW`.
    Slow,
}

/// One call, in the order the service received them.
#[derive(Clone, Debug)]
pub struct Call {
    pub key: String,
    pub consumer: String,
    pub fault: Fault,
    /// This call charged (the first call with its key that was not refused).
    pub charged: bool,
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    /// Idempotency key -> the charge made for it.
    charges: HashMap<String, String>,
}

pub struct Service {
    pub url: String,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

/// How long a slow call takes to answer.
pub const SLOW: Duration = Duration::from_secs(3);

/// The fault for the `n`th call (from 1), whose key is `job-J`: the first call of every
/// job sent once (J a multiple of 5) is refused (J % 10 == 0) or loses its answer (J % 10
/// == 5), so a consumer that acknowledges a failed message loses that job; then every 7th
/// call is refused, every 11th loses its answer and every 19th is slow.
fn fault(n: usize, key: &str, first_with_key: bool) -> Fault {
    let job: u64 = key
        .strip_prefix("job-")
        .and_then(|j| j.parse().ok())
        .unwrap_or(1);
    match job % 10 {
        0 if first_with_key => Fault::Refused,
        5 if first_with_key => Fault::AnswerLost,
        _ if n.is_multiple_of(7) => Fault::Refused,
        _ if n.is_multiple_of(11) => Fault::AnswerLost,
        _ if n.is_multiple_of(19) => Fault::Slow,
        _ => Fault::None,
    }
}

impl Service {
    pub async fn start() -> Result<Service> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/charges", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &state).await {
                        eprintln!("fake service: {e:#}");
                    }
                });
            }
        });
        Ok(Service { url, state, server })
    }

    /// Every call so far, in the order received.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Idempotency key -> charge, for every key charged so far.
    pub fn charges(&self) -> HashMap<String, String> {
        self.state.lock().unwrap().charges.clone()
    }

    pub fn charged(&self) -> usize {
        self.state.lock().unwrap().charges.len()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// One request per connection (`Connection: close`).
async fn serve(mut stream: TcpStream, state: &Mutex<State>) -> Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(()); // closed before a request
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 64 * 1024 {
            bail!("request head too long");
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let length: usize = header("content-length")
        .context("no Content-Length")?
        .parse()?;
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed in the middle of the body");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    if !request_line.starts_with("POST /charges ") {
        return respond(&mut stream, "404 Not Found", "{}").await;
    }
    let body: serde_json::Value = serde_json::from_slice(&buf[head_end..head_end + length])?;
    let consumer = body["consumer"].as_str().unwrap_or("?").to_string();
    let Some(key) = header("idempotency-key") else {
        return respond(&mut stream, "400 Bad Request", r#"{"error": "no key"}"#).await;
    };

    let (fault, charge) = {
        let mut s = state.lock().unwrap();
        let first_with_key = !s.calls.iter().any(|c| c.key == key);
        let fault = fault(s.calls.len() + 1, &key, first_with_key);
        let mut charged = false;
        let charge = if fault == Fault::Refused {
            None
        } else {
            let next = format!("ch_{}", s.charges.len() + 1);
            let charge = s.charges.entry(key.clone()).or_insert_with(|| {
                charged = true;
                next
            });
            Some(charge.clone())
        };
        s.calls.push(Call {
            key,
            consumer,
            fault,
            charged,
        });
        (fault, charge)
    };
    match (fault, charge) {
        (Fault::Refused, _) | (_, None) => {
            respond(
                &mut stream,
                "503 Service Unavailable",
                r#"{"error": "try again"}"#,
            )
            .await
        }
        (Fault::AnswerLost, _) => Ok(()), // dropping the stream closes it unanswered
        (fault, Some(charge)) => {
            if fault == Fault::Slow {
                tokio::time::sleep(SLOW).await;
            }
            respond(
                &mut stream,
                "200 OK",
                &format!(r#"{{"charge": "{charge}"}}"#),
            )
            .await
        }
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    // The caller may have given up (a timeout) or died: nothing to do about it here.
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
    Ok(())
}
