//! The experiment of the guide *Deduplicating work across replicas*, end to end: a Redis
//! Streams consumer group, consumer processes of concurrent handler tasks, every job
//! published twice twenty messages apart, survivors reclaiming idle messages with
//! XAUTOCLAIM, and in the crash runs one consumer killed with SIGKILL. Every execution of
//! the side effect is a row in PostgreSQL's `effects` table; duplicates are rows minus
//! distinct jobs, missing jobs are jobs minus distinct jobs.
//!
//! - [`strategy`]: the strategies, as the guide writes them, plus `dedup.try_claim`
//! - [`consumer`]: one consumer process (`experiment consumer ...`)
//! - [`offsets`]: the `offsets` strategy: a partitioned log, `dedup.advance` per batch
//! - [`run`]: the orchestrator: publish, start and kill consumers, wait for the drain, count
//! - [`report`]: the table, the JSON file, the SVG chart
//! - [`redis_server`]: a throwaway `redis-server`
pub mod consumer;
pub mod offsets;
pub mod redis_server;
pub mod report;
pub mod run;
pub mod strategy;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use strategy::{Strategy, STRATEGIES};

/// The experiment's settings. [`Config::default`] is the guide's setup.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Distinct jobs (the guide: 3,000).
    pub jobs: u32,
    /// Deliveries of each job (the guide: 2).
    pub copies: u32,
    /// Messages between two copies of a job (the guide: 20).
    pub gap: u32,
    /// Consumer processes (the guide: 3).
    pub consumers: u32,
    /// Concurrent handler tasks per consumer (the guide: 20).
    pub concurrency: u32,
    /// In crash runs, when the first consumer gets SIGKILL, from the first message
    /// published (the guide: 1.5 s).
    #[serde(serialize_with = "ser_ms")]
    pub crash_after: Duration,
    /// Runs of each strategy with and without a crash (the guide: two crash runs).
    pub runs: u32,
    /// The handler's simulated work before its effect row (the guide does not say; see
    /// docs/experiment.md).
    #[serde(serialize_with = "ser_ms")]
    pub work: Duration,
    /// Messages idle this long are reclaimed with XAUTOCLAIM (the guide: 2 s).
    #[serde(serialize_with = "ser_ms")]
    pub reclaim_idle: Duration,
    /// The leased claim's lifetime, `SET NX PX` (the guide: 3,000 ms).
    #[serde(serialize_with = "ser_ms")]
    pub lease: Duration,
    /// The widened gap between effect and done marker in `lease-gap` (the guide: 25 ms).
    #[serde(serialize_with = "ser_ms")]
    pub marker_gap: Duration,
    /// A run that has not drained by then is stopped and reported as "did not drain".
    #[serde(serialize_with = "ser_ms")]
    pub timeout: Duration,
    /// Strategies to run, by key.
    pub strategies: Vec<String>,
    /// Which runs: without a crash, with a crash, or both.
    pub crash_modes: Vec<bool>,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            jobs: 3000,
            copies: 2,
            gap: 20,
            consumers: 3,
            concurrency: 20,
            crash_after: Duration::from_millis(1500),
            runs: 2,
            work: Duration::from_millis(DEFAULT_WORK_MS),
            reclaim_idle: Duration::from_secs(2),
            lease: Duration::from_secs(3),
            marker_gap: Duration::from_millis(25),
            timeout: Duration::from_secs(60),
            strategies: STRATEGIES.iter().map(|s| s.key.to_string()).collect(),
            crash_modes: vec![false, true],
        }
    }
}

/// The handler's simulated work, in milliseconds: our choice, not the guide's (it does not
/// give one).
pub const DEFAULT_WORK_MS: u64 = 50;

pub const USAGE: &str = "\
experiment [OPTIONS]    run the guide's experiment and print the table

Starts a throwaway PostgreSQL server with dedup and a throwaway redis-server, runs every
strategy with and without a consumer crash, prints the table and writes runs.json,
table.md and chart.svg into --out. Stops everything it started, also on Ctrl-C.

Options (defaults: the guide's setup; the work time is ours, the guide gives none):
  --jobs N              distinct jobs                                  [3000]
  --copies N            deliveries of each job                         [2]
  --gap N               messages between two copies of a job           [20]
  --consumers N         consumer processes                             [3]
  --concurrency N       handler tasks per consumer                     [20]
  --crash-after-ms N    SIGKILL of one consumer, ms after publishing   [1500]
  --runs N              runs of each strategy, with and without crash  [2]
  --work-ms N           the handler's simulated work before the effect [50]
  --reclaim-idle-ms N   XAUTOCLAIM min-idle-time                       [2000]
  --lease-ms N          leased claim, SET NX PX                        [3000]
  --marker-gap-ms N     lease-gap: pause between effect and marker     [25]
  --timeout-s N         a run not drained by then: \"did not drain\"     [60]
  --strategies A,B      which strategies (see --list)                  [all]
  --crash no|yes|both   runs without a crash, with one, or both        [both]
  --out DIR             where runs.json, table.md and chart.svg go     [target/experiment]
  --list                list the strategies and exit

experiment chart RUNS.json OUT.svg    draw the chart again from a runs.json
";

/// Command-line options of the `experiment` binary: the [`Config`] and the output folder.
pub struct Cli {
    pub config: Config,
    pub out: PathBuf,
    pub list: bool,
}

pub fn parse_cli(args: &[String]) -> Result<Cli> {
    let mut c = Config::default();
    let mut out = PathBuf::from("target/experiment");
    let mut list = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--list" {
            list = true;
            continue;
        }
        if !USAGE.contains(&format!("  {flag} ")) {
            bail!("unknown option {flag}\n\n{USAGE}");
        }
        let v = it
            .next()
            .ok_or_else(|| anyhow!("{flag} needs a value\n\n{USAGE}"))?;
        let num = |v: &str| -> Result<u64> {
            v.parse::<u64>()
                .with_context(|| format!("{flag} wants a whole number, not {v:?}"))
        };
        let positive = |v: &str| -> Result<u32> {
            let n = num(v)?;
            if n == 0 || n > u32::MAX as u64 {
                bail!("{flag} must be at least 1");
            }
            Ok(n as u32)
        };
        match flag.as_str() {
            "--jobs" => c.jobs = positive(v)?,
            "--copies" => c.copies = positive(v)?,
            "--gap" => c.gap = positive(v)?,
            "--consumers" => c.consumers = positive(v)?,
            "--concurrency" => c.concurrency = positive(v)?,
            "--runs" => c.runs = positive(v)?,
            "--crash-after-ms" => c.crash_after = Duration::from_millis(num(v)?),
            "--work-ms" => c.work = Duration::from_millis(num(v)?),
            "--reclaim-idle-ms" => c.reclaim_idle = Duration::from_millis(num(v)?),
            "--lease-ms" => c.lease = Duration::from_millis(num(v)?),
            "--marker-gap-ms" => c.marker_gap = Duration::from_millis(num(v)?),
            "--timeout-s" => c.timeout = Duration::from_secs(num(v)?),
            "--strategies" => {
                c.strategies = v.split(',').map(|s| s.trim().to_string()).collect();
            }
            "--crash" => {
                c.crash_modes = match v.as_str() {
                    "no" => vec![false],
                    "yes" => vec![true],
                    "both" => vec![false, true],
                    other => bail!("--crash wants no, yes or both, not {other:?}"),
                }
            }
            "--out" => out = PathBuf::from(v),
            other => bail!("unknown option {other}\n\n{USAGE}"),
        }
    }
    c.strategies()?;
    Ok(Cli {
        config: c,
        out,
        list,
    })
}

impl Config {
    /// The selected strategies, in the order given.
    pub fn strategies(&self) -> Result<Vec<&'static Strategy>> {
        self.strategies
            .iter()
            .map(|k| {
                strategy::by_key(k).ok_or_else(|| {
                    let known: Vec<&str> = STRATEGIES.iter().map(|s| s.key).collect();
                    anyhow!("unknown strategy {k:?}; known: {}", known.join(", "))
                })
            })
            .collect()
    }

    /// Messages published per run.
    pub fn messages(&self) -> u64 {
        self.jobs as u64 * self.copies as u64
    }
}
