//! The orchestrator: for each run, a clean stream and clean tables, consumer processes,
//! the messages, a SIGKILL in crash runs, the wait for the drain, and the count.
use super::consumer::{ConsumerArgs, Stats, GROUP, STREAM};
use super::strategy::Strategy;
use super::Config;
use crate::children;
use anyhow::{bail, Context, Result};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamInfoConsumer, StreamInfoConsumersReply, StreamInfoGroupsReply};
use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// One consumer's part in a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConsumerReport {
    pub name: String,
    /// Killed with SIGKILL (its stats are the last it printed before).
    pub killed: bool,
    pub stats: Stats,
}

/// The SIGKILL of a crash run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Kill {
    pub consumer: String,
    /// Seconds after the first message was published.
    pub at_s: f64,
    /// Messages acknowledged when it happened (at the last poll before).
    pub acked_before: u64,
    /// Messages delivered to it and not acknowledged when it died (XINFO CONSUMERS): its
    /// handlers in flight, and in the lease strategies the copies it left for later.
    pub pending: u64,
}

/// One run: the count and how it ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub strategy: String,
    pub crash: bool,
    /// 1-based run number within (strategy, crash).
    pub run: u32,
    pub jobs: u64,
    pub messages: u64,
    /// Rows in `effects`: executions of the side effect.
    pub effect_rows: u64,
    /// Distinct jobs in `effects`.
    pub jobs_done: u64,
    /// `effect_rows - jobs_done`.
    pub duplicates: u64,
    /// `jobs - jobs_done`.
    pub missing: u64,
    /// Every message acknowledged and the pending list empty before the timeout.
    pub drained: bool,
    /// Seconds from the first message published to the drain (or the timeout).
    pub seconds: f64,
    /// Messages acknowledged / still pending when the run ended.
    pub acked: u64,
    pub pending: u64,
    /// In a crash run, the kill; `None` in a crash run means the run drained before the
    /// crash time and no consumer was killed.
    pub kill: Option<Kill>,
    pub consumers: Vec<ConsumerReport>,
}

impl RunResult {
    /// A crash run in which the crash happened.
    pub fn crashed(&self) -> bool {
        self.kill.is_some()
    }
}

/// Where the experiment runs: a PostgreSQL database with the extension, a Redis server,
/// and the binary to start consumers with (`<exe> consumer ...`).
pub struct Experiment {
    pub config: Config,
    pub pg_dsn: String,
    /// Where consumer i connects: `consumer_dsns[(i - 1) % len]`; `pg_dsn` when empty (on
    /// Citus: the coordinator and the workers, one consumer each).
    pub consumer_dsns: Vec<String>,
    pub redis_url: String,
    pub consumer_exe: PathBuf,
}

/// The progress line: rewritten in place on a terminal, a line every few seconds otherwise.
struct Progress {
    tty: bool,
    last: Instant,
    shown: bool,
}

impl Progress {
    fn new() -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            shown: false,
        }
    }
    fn show(&mut self, line: &str) {
        if self.tty {
            eprint!("\r\x1b[2K{line}");
            let _ = std::io::stderr().flush();
            self.shown = true;
        } else if self.last.elapsed() >= Duration::from_secs(5) {
            eprintln!("  ... {line}");
            self.last = Instant::now();
        }
    }
    fn clear(&mut self) {
        if self.tty && self.shown {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
            self.shown = false;
        }
    }
}

/// A running consumer process.
struct Consumer {
    name: String,
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    stats: Arc<Mutex<Stats>>,
    ready: tokio::sync::watch::Receiver<bool>,
    /// Reads its standard output; ends when the process does.
    reader: tokio::task::JoinHandle<()>,
    killed: bool,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // kill_on_drop kills it; forget it for the signal handler.
        children::unregister(self.pid);
    }
}

impl Experiment {
    /// Create the tables the strategies write to (once per database).
    pub async fn prepare_database(&self) -> Result<()> {
        let c = crate::connect(&self.pg_dsn).await?;
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS effects (
                 job_id bigint NOT NULL,
                 consumer text NOT NULL,
                 at timestamptz NOT NULL DEFAULT clock_timestamp());
             -- the guide's section 5 table
             CREATE TABLE IF NOT EXISTS processed (
                 job_id bigint PRIMARY KEY,
                 processed_at timestamptz NOT NULL DEFAULT now());",
        )
        .await
        .context("creating the effects and processed tables")?;
        Ok(())
    }

    /// Every selected strategy, without and with a crash, `runs` times each. `each` sees
    /// every result as it comes.
    pub async fn run_matrix(&self, mut each: impl FnMut(&RunResult)) -> Result<Vec<RunResult>> {
        self.prepare_database().await?;
        let mut results = Vec::new();
        let strategies = self.config.strategies()?;
        let total = strategies.len() * self.config.crash_modes.len() * self.config.runs as usize;
        for strategy in strategies {
            for &crash in &self.config.crash_modes {
                for run in 1..=self.config.runs {
                    let name = format!(
                        "{} {} run {run}",
                        strategy.key,
                        if crash { "crash" } else { "no crash" }
                    );
                    let label = format!("{}/{total} {name}", results.len() + 1);
                    let r = self
                        .run_once(strategy, crash, run, &label)
                        .await
                        .context(name)?;
                    each(&r);
                    results.push(r);
                }
            }
        }
        Ok(results)
    }

    async fn redis(&self) -> Result<MultiplexedConnection> {
        let client = redis::Client::open(self.redis_url.as_str())?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// One run of `strategy`; `label` names it in the progress line.
    pub async fn run_once(
        &self,
        strategy: &'static Strategy,
        crash: bool,
        run: u32,
        label: &str,
    ) -> Result<RunResult> {
        let cfg = &self.config;
        let mut r = self.redis().await?;
        redis::cmd("FLUSHALL").query_async::<()>(&mut r).await?;
        redis::cmd("XGROUP")
            .arg(&["CREATE", STREAM, GROUP, "$", "MKSTREAM"])
            .query_async::<()>(&mut r)
            .await?;
        let pg = crate::connect(&self.pg_dsn).await?;
        pg.batch_execute("TRUNCATE effects, processed").await?;
        // A scope per run: the claims of earlier runs stay in dedup.processed, unseen.
        let scope = format!("run-{}", uuid::Uuid::new_v4());

        let mut consumers = Vec::new();
        for i in 1..=cfg.consumers {
            let args = ConsumerArgs {
                name: format!("c{i}"),
                redis_url: self.redis_url.clone(),
                pg_dsn: if self.consumer_dsns.is_empty() {
                    self.pg_dsn.clone()
                } else {
                    self.consumer_dsns[(i as usize - 1) % self.consumer_dsns.len()].clone()
                },
                strategy: strategy.key.to_string(),
                concurrency: cfg.concurrency as usize,
                work: cfg.work,
                lease: cfg.lease,
                marker_gap: cfg.marker_gap,
                reclaim_idle: cfg.reclaim_idle,
                scope: scope.clone(),
                consumers: cfg.consumers,
            };
            consumers.push(self.spawn(args)?);
        }
        let ready_by = Instant::now() + Duration::from_secs(60);
        for c in &mut consumers {
            let wait = c.ready.wait_for(|r| *r);
            match tokio::time::timeout_at(ready_by.into(), wait).await {
                Ok(Ok(_)) => {}
                _ => bail!(
                    "consumer {} did not get ready (exit status: {:?})",
                    c.name,
                    c.child.try_wait()?
                ),
            }
        }

        let started = Instant::now();
        // The offsets strategy reads a partitioned log: each job once, in its partition's
        // stream, and no consumer group (super::offsets).
        let offsets = strategy.key == "offsets";
        let (last_id, last_positions) = if offsets {
            (String::new(), super::offsets::publish(&mut r, cfg).await?)
        } else {
            (publish(&mut r, cfg).await?, Vec::new())
        };
        let total = if offsets {
            cfg.jobs as u64
        } else {
            cfg.messages()
        };

        let mut progress = Progress::new();
        let mut kill = None;
        let (drained, acked, pending) = loop {
            let (done, acked, pending) = if offsets {
                let (covered, done) =
                    super::offsets::progress(&pg, &scope, &last_positions).await?;
                (done, covered, total.saturating_sub(covered))
            } else {
                let info: StreamInfoGroupsReply = redis::cmd("XINFO")
                    .arg(&["GROUPS", STREAM])
                    .query_async(&mut r)
                    .await?;
                let group = info
                    .groups
                    .into_iter()
                    .find(|g| g.name == GROUP)
                    .context("the consumer group is gone")?;
                let pending = group.pending as u64;
                let read = group.entries_read.unwrap_or(0) as u64;
                let acked = read.saturating_sub(pending);
                (
                    group.last_delivered_id == last_id && pending == 0,
                    acked,
                    pending,
                )
            };
            if done {
                break (true, acked, pending);
            }
            let elapsed = started.elapsed();
            if elapsed >= cfg.timeout {
                break (false, acked, pending);
            }
            if crash && kill.is_none() && elapsed >= cfg.crash_after {
                let victim = &mut consumers[0];
                // SAFETY: kill(2) on our own child, not yet reaped (kill_on_drop reaps it).
                if unsafe { libc::kill(victim.pid as libc::pid_t, libc::SIGKILL) } != 0 {
                    bail!(
                        "kill -9 {}: {}",
                        victim.pid,
                        std::io::Error::last_os_error()
                    );
                }
                victim.killed = true;
                let _ = victim.child.wait().await;
                children::unregister(victim.pid);
                let consumers: Vec<StreamInfoConsumer> = if offsets {
                    Vec::new()
                } else {
                    redis::cmd("XINFO")
                        .arg(&["CONSUMERS", STREAM, GROUP])
                        .query_async::<StreamInfoConsumersReply>(&mut r)
                        .await?
                        .consumers
                };
                kill = Some(Kill {
                    consumer: victim.name.clone(),
                    at_s: elapsed.as_secs_f64(),
                    acked_before: acked,
                    pending: consumers
                        .iter()
                        .find(|c| c.name == victim.name)
                        .map(|c| c.pending as u64)
                        .unwrap_or(0),
                });
            }
            progress.show(&format!(
                "[{label}] {:5.1} s: acked {acked}/{total}, pending {pending}{}",
                elapsed.as_secs_f64(),
                if kill.is_some() { ", c1 killed" } else { "" }
            ));
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let seconds = started.elapsed().as_secs_f64();
        progress.clear();

        let reports = stop(consumers).await;
        let row = pg
            .query_one("SELECT count(*), count(DISTINCT job_id) FROM effects", &[])
            .await?;
        let (rows, done): (i64, i64) = (row.get(0), row.get(1));
        let strays: i64 = pg
            .query_one(
                "SELECT count(*) FROM effects WHERE job_id NOT BETWEEN 1 AND $1",
                &[&(cfg.jobs as i64)],
            )
            .await?
            .get(0);
        if strays > 0 {
            bail!("{strays} effect rows for job ids outside 1..{}", cfg.jobs);
        }
        Ok(RunResult {
            strategy: strategy.key.to_string(),
            crash,
            run,
            jobs: cfg.jobs as u64,
            messages: total,
            effect_rows: rows as u64,
            jobs_done: done as u64,
            duplicates: (rows - done) as u64,
            missing: cfg.jobs as u64 - done as u64,
            drained,
            seconds,
            acked,
            pending,
            kill,
            consumers: reports,
        })
    }

    fn spawn(&self, args: ConsumerArgs) -> Result<Consumer> {
        let mut child = Command::new(&self.consumer_exe)
            .arg("consumer")
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.consumer_exe.display()))?;
        let pid = child.id().context("consumer exited at once")?;
        children::register(pid, &format!("consumer {}", args.name), None);
        let stats = Arc::new(Mutex::new(Stats::default()));
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        let stdout = child.stdout.take().context("consumer stdout")?;
        let sink = stats.clone();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line == "ready" {
                    let _ = ready_tx.send(true);
                } else if let Some(json) = line.strip_prefix("stats ") {
                    if let Ok(s) = serde_json::from_str(json) {
                        *sink.lock().unwrap() = s;
                    }
                }
            }
        });
        Ok(Consumer {
            name: args.name,
            stdin: child.stdin.take(),
            child,
            pid,
            stats,
            ready,
            reader,
            killed: false,
        })
    }
}

/// The messages in publishing order, as (job, copy): blocks of `gap` jobs, each block
/// `copies` times in a row, so consecutive copies of a job are `gap` messages apart (the
/// last block, if shorter, less).
pub fn publish_order(cfg: &Config) -> Vec<(u32, u32)> {
    let mut order = Vec::with_capacity(cfg.messages() as usize);
    let mut first = 1u32;
    while first <= cfg.jobs {
        let last = first.saturating_add(cfg.gap - 1).min(cfg.jobs);
        for copy in 1..=cfg.copies {
            for job in first..=last {
                order.push((job, copy));
            }
        }
        first = last + 1;
    }
    order
}

/// Publish every message of [`publish_order`]; the last message id.
async fn publish(r: &mut MultiplexedConnection, cfg: &Config) -> Result<String> {
    let order = publish_order(cfg);
    let mut last_id = String::new();
    for chunk in order.chunks(500) {
        let mut pipe = redis::pipe();
        for (job, copy) in chunk {
            pipe.cmd("XADD")
                .arg(STREAM)
                .arg("*")
                .arg("job")
                .arg(job)
                .arg("copy")
                .arg(copy);
        }
        let ids: Vec<String> = pipe.query_async(r).await?;
        last_id = ids.last().cloned().unwrap_or_default();
    }
    Ok(last_id)
}

/// Ask the live consumers to stop (close their standard input), wait for them, and collect
/// their last stats. A consumer that does not stop within 30 s is killed.
async fn stop(mut consumers: Vec<Consumer>) -> Vec<ConsumerReport> {
    for c in &mut consumers {
        c.stdin = None;
    }
    let mut reports = Vec::new();
    for mut c in consumers {
        if !c.killed
            && tokio::time::timeout(Duration::from_secs(30), c.child.wait())
                .await
                .is_err()
        {
            eprintln!("consumer {} did not stop within 30 s: killing it", c.name);
            let _ = c.child.kill().await;
        }
        let _ = c.child.wait().await;
        // The last stats line, read once its standard output is closed.
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut c.reader).await;
        let stats = c.stats.lock().unwrap().clone();
        reports.push(ConsumerReport {
            name: c.name.clone(),
            killed: c.killed,
            stats,
        });
    }
    reports
}
