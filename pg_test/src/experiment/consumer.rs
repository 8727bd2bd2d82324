//! One consumer process of the consumer group (`experiment consumer ...`): `--concurrency`
//! handler tasks, each with a Redis and a PostgreSQL connection of its own. A task takes one
//! message at a time: one idle for `--reclaim-idle-ms` (XAUTOCLAIM) when the consumer's
//! reclaim is due, else a new one (XREADGROUP); runs the strategy on it; and acknowledges
//! it (XACK) unless the strategy leaves it for later.
//!
//! It talks to the orchestrator over its standard streams: it prints `ready` once every
//! connection is open, then `stats {json}` every 100 ms and once more at the end. It stops
//! when its standard input closes (the orchestrator asks it to, or died): it takes no new
//! messages, lets its handlers finish, prints its last stats and exits. A SIGKILL stops it
//! anywhere, which is the crash the experiment is about.
use super::strategy::{self, Conns, Env, Outcome, Strategy};
use anyhow::{anyhow, bail, Context, Result};
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::AsyncConnectionConfig;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Stream and group names in the throwaway Redis.
pub const STREAM: &str = "jobs";
pub const GROUP: &str = "g";

/// How often a consumer looks for messages to reclaim.
const RECLAIM_EVERY: Duration = Duration::from_millis(250);

/// Everything a consumer process is started with.
#[derive(Clone, Debug)]
pub struct ConsumerArgs {
    pub name: String,
    pub redis_url: String,
    pub pg_dsn: String,
    pub strategy: String,
    pub concurrency: usize,
    pub work: Duration,
    pub lease: Duration,
    pub marker_gap: Duration,
    pub reclaim_idle: Duration,
    pub scope: String,
    /// Consumer processes in the run (the `offsets` strategy splits partitions by it).
    pub consumers: u32,
}

impl ConsumerArgs {
    /// Command-line arguments after `consumer`.
    pub fn to_args(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        vec![
            "--name".into(),
            self.name.clone(),
            "--redis".into(),
            self.redis_url.clone(),
            "--pg".into(),
            self.pg_dsn.clone(),
            "--strategy".into(),
            self.strategy.clone(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--work-ms".into(),
            ms(self.work),
            "--lease-ms".into(),
            ms(self.lease),
            "--marker-gap-ms".into(),
            ms(self.marker_gap),
            "--reclaim-idle-ms".into(),
            ms(self.reclaim_idle),
            "--scope".into(),
            self.scope.clone(),
            "--consumers".into(),
            self.consumers.to_string(),
        ]
    }

    pub fn parse(args: &[String]) -> Result<ConsumerArgs> {
        let mut c = ConsumerArgs {
            name: String::new(),
            redis_url: String::new(),
            pg_dsn: String::new(),
            strategy: String::new(),
            concurrency: 20,
            work: Duration::ZERO,
            lease: Duration::from_secs(3),
            marker_gap: Duration::ZERO,
            reclaim_idle: Duration::from_secs(2),
            scope: "default".into(),
            consumers: 1,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it
                .next()
                .ok_or_else(|| anyhow!("{flag} needs a value"))?
                .clone();
            let ms = |v: &str| -> Result<Duration> {
                Ok(Duration::from_millis(
                    v.parse().with_context(|| format!("{flag} {v}"))?,
                ))
            };
            match flag.as_str() {
                "--name" => c.name = value,
                "--redis" => c.redis_url = value,
                "--pg" => c.pg_dsn = value,
                "--strategy" => c.strategy = value,
                "--concurrency" => c.concurrency = value.parse()?,
                "--work-ms" => c.work = ms(&value)?,
                "--lease-ms" => c.lease = ms(&value)?,
                "--marker-gap-ms" => c.marker_gap = ms(&value)?,
                "--reclaim-idle-ms" => c.reclaim_idle = ms(&value)?,
                "--scope" => c.scope = value,
                "--consumers" => c.consumers = value.parse()?,
                other => bail!("consumer: unknown argument {other}"),
            }
        }
        if c.name.is_empty() || c.redis_url.is_empty() || c.pg_dsn.is_empty() {
            bail!("consumer needs --name, --redis and --pg");
        }
        if c.concurrency == 0 {
            bail!("--concurrency must be at least 1");
        }
        Ok(c)
    }
}

/// A consumer's counters, as it reports them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    /// Messages taken with XREADGROUP.
    pub delivered: u64,
    /// Messages taken over with XAUTOCLAIM.
    pub reclaimed: u64,
    /// Effects run.
    pub effects: u64,
    /// Messages acknowledged without running the effect (job done or claimed).
    pub skipped: u64,
    /// Messages left unacknowledged because another consumer held the lease.
    pub busy: u64,
    /// Handler errors (the message is left unacknowledged and reclaimed later).
    pub errors: u64,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    reclaimed: AtomicU64,
    effects: AtomicU64,
    skipped: AtomicU64,
    busy: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> Stats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            delivered: g(&self.delivered),
            reclaimed: g(&self.reclaimed),
            effects: g(&self.effects),
            skipped: g(&self.skipped),
            busy: g(&self.busy),
            errors: g(&self.errors),
        }
    }
}

fn report(counters: &Counters) {
    let line = serde_json::to_string(&counters.snapshot()).unwrap_or_default();
    println!("stats {line}");
}

/// When this consumer next looks for messages to reclaim, and where its XAUTOCLAIM scan
/// of the pending list goes on from. Shared by its handler tasks.
struct Reclaim {
    cursor: String,
    next: Instant,
}

/// The `consumer` subcommand.
pub async fn main(args: ConsumerArgs) -> Result<()> {
    let strategy: &'static Strategy = strategy::by_key(&args.strategy)
        .ok_or_else(|| anyhow!("unknown strategy {}", args.strategy))?;
    if strategy.key == "offsets" {
        // c1, c2, ...: consumer i - 1 of the run's.
        let index = args
            .name
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .unwrap_or(1)
            .saturating_sub(1);
        return super::offsets::main(args.clone(), index, args.consumers.max(1)).await;
    }
    let client = redis::Client::open(args.redis_url.as_str())?;
    // No response timeout: on two busy cores an answer may take a while.
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(10)));
    let connect = |_| async {
        let redis = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .context("connecting to Redis")?;
        let pg = crate::connect_when_up(&args.pg_dsn)
            .await
            .context("connecting to PostgreSQL")?;
        pg.client
            .batch_execute(&format!("SET application_name = '{}'", args.name))
            .await?;
        Conns::prepare(redis, pg.client).await
    };
    let conns: Vec<Conns> = futures_util::future::join_all((0..args.concurrency).map(connect))
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let env = Arc::new(Env {
        consumer: args.name.clone(),
        work: args.work,
        lease_ms: args.lease.as_millis() as u64,
        marker_gap: args.marker_gap,
        scope: args.scope.clone(),
    });
    let counters = Arc::new(Counters::default());
    let reclaim = Arc::new(Mutex::new(Reclaim {
        cursor: "0-0".into(),
        next: Instant::now(),
    }));

    // Standard input closing is the request to stop.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        let _ = stop_tx.send(true);
    });
    let reporter = {
        let counters = counters.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                report(&counters);
            }
        })
    };
    println!("ready");

    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conns| {
            let (env, counters, reclaim) = (env.clone(), counters.clone(), reclaim.clone());
            let mut stop = stop_rx.clone();
            let idle_ms = args.reclaim_idle.as_millis() as u64;
            tokio::spawn(async move {
                while !*stop.borrow() {
                    let next = tokio::select! {
                        m = next_message(&mut conns, &env.consumer, idle_ms, &reclaim, &counters) => m,
                        _ = stop.changed() => break,
                    };
                    match next {
                        Ok(Some(message)) => {
                            handle(strategy, &env, &mut conns, &counters, &message).await
                        }
                        Ok(None) => {}
                        Err(e) => {
                            eprintln!("[{}] reading the stream: {e:#}", env.consumer);
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            })
        })
        .collect();
    // Stop: the handler tasks finish the message they hold, then end.
    for t in tasks {
        t.await?;
    }
    reporter.abort();
    report(&counters);
    Ok(())
}

/// The next message for one handler task: a reclaimed one when this consumer's reclaim is
/// due (every 250 ms, or at once after a reclaim that found one), else a new one
/// (XREADGROUP, blocking up to 100 ms); `None` if there was none.
async fn next_message(
    conns: &mut Conns,
    me: &str,
    idle_ms: u64,
    reclaim: &Mutex<Reclaim>,
    counters: &Counters,
) -> Result<Option<StreamId>> {
    let due = {
        let mut r = reclaim.lock().unwrap();
        if Instant::now() >= r.next {
            r.next = Instant::now() + RECLAIM_EVERY;
            Some(r.cursor.clone())
        } else {
            None
        }
    };
    if let Some(cursor) = due {
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(STREAM)
            .arg(GROUP)
            .arg(me)
            .arg(idle_ms)
            .arg(&cursor)
            .arg(StreamAutoClaimOptions::default().count(1))
            .query_async(&mut conns.redis)
            .await?;
        let found = reply.claimed.into_iter().next();
        let mut r = reclaim.lock().unwrap();
        r.cursor = reply.next_stream_id;
        if found.is_some() {
            r.next = Instant::now();
            counters.reclaimed.fetch_add(1, Ordering::Relaxed);
            return Ok(found);
        }
    }
    let opts = StreamReadOptions::default()
        .group(GROUP, me)
        .count(1)
        .block(100);
    let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
        .arg(&opts)
        .arg("STREAMS")
        .arg(STREAM)
        .arg(">")
        .query_async(&mut conns.redis)
        .await?;
    let message = reply
        .and_then(|r| r.keys.into_iter().next())
        .and_then(|k| k.ids.into_iter().next());
    if message.is_some() {
        counters.delivered.fetch_add(1, Ordering::Relaxed);
    }
    Ok(message)
}

/// Run the strategy on one message and acknowledge it unless the strategy leaves it for
/// later (or failed).
async fn handle(
    strategy: &Strategy,
    env: &Env,
    conns: &mut Conns,
    counters: &Counters,
    message: &StreamId,
) {
    let outcome = match message
        .get::<String>("job")
        .and_then(|j| j.parse::<i64>().ok())
    {
        Some(job) => (strategy.handle)(env, conns, job).await,
        None => Err(anyhow!("message {} has no job field", message.id)),
    };
    let counter = match outcome {
        Ok(Outcome::Done) => &counters.effects,
        Ok(Outcome::Skipped) => &counters.skipped,
        Ok(Outcome::Busy) => &counters.busy,
        Err(ref e) => {
            if counters.errors.load(Ordering::Relaxed) < 5 {
                eprintln!("[{}] message {}: {e:#}", env.consumer, message.id);
            }
            &counters.errors
        }
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if matches!(outcome, Ok(Outcome::Done | Outcome::Skipped)) {
        let acked: redis::RedisResult<i64> = redis::cmd("XACK")
            .arg(STREAM)
            .arg(GROUP)
            .arg(&message.id)
            .query_async(&mut conns.redis)
            .await;
        if let Err(e) = acked {
            eprintln!("[{}] XACK {}: {e}", env.consumer, message.id);
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
