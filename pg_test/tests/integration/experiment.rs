//! The guide's experiment, short: every strategy once without and once with a crash, with
//! fewer jobs and an earlier crash than the full run, against the test's database and a
//! throwaway redis-server. Real consumer processes (the `experiment` binary), a real
//! SIGKILL. Asserts the pattern that must always hold (SET NX losing jobs in a crash is
//! probable, not certain: up to three crash runs); the numbers are printed.
use crate::common::{ensure_eq, Ctx};
use anyhow::{bail, Result};
use dedup_pg_test::experiment::redis_server::RedisServer;
use dedup_pg_test::experiment::report;
use dedup_pg_test::experiment::run::{publish_order, Experiment, RunResult};
use dedup_pg_test::experiment::Config;
use std::path::PathBuf;
use std::time::Duration;

/// The short matrix: 900 jobs instead of 3,000, one run per cell, the crash at 0.5 s
/// instead of 1.5 s so that it still lands while every strategy's run is going on.
pub fn short_config() -> Config {
    Config {
        jobs: 900,
        runs: 1,
        crash_after: Duration::from_millis(500),
        ..Config::default()
    }
}

fn one<'a>(runs: &'a [RunResult], strategy: &str, crash: bool) -> Result<&'a RunResult> {
    runs.iter()
        .find(|r| r.strategy == strategy && r.crash == crash)
        .ok_or_else(|| anyhow::anyhow!("no {strategy} run with crash={crash}"))
}

pub async fn short_matrix_shows_the_guides_pattern(ctx: Ctx) -> Result<()> {
    let redis = RedisServer::start().await?;
    let config = short_config();
    let exp = Experiment {
        config: config.clone(),
        pg_dsn: ctx.dsn(),
        consumer_dsns: Vec::new(),
        redis_url: redis.url(),
        consumer_exe: PathBuf::from(env!("CARGO_BIN_EXE_experiment")),
    };
    let runs = exp
        .run_matrix(|r| println!("  {}", report::run_summary(r).replace('\n', "\n  ")))
        .await?;
    println!("\n{}", report::table(&runs, &config));
    let chart = std::env::temp_dir().join(format!("dedup-experiment-{}.svg", std::process::id()));
    let drawn = report::write_chart(&chart, &runs, "short matrix");
    let svg = std::fs::read_to_string(&chart).unwrap_or_default();
    let _ = std::fs::remove_file(&chart);
    drawn?;
    ensure_eq(svg.starts_with("<svg"), true, "the chart is an SVG")?;

    let mut failures = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    for r in &runs {
        check(
            r.drained,
            format!("{} crash={} did not drain", r.strategy, r.crash),
        );
        check(
            !r.crash || r.crashed(),
            format!(
                "{}: the run drained before the crash time, so nothing was killed",
                r.strategy
            ),
        );
    }
    let none = one(&runs, "none", false)?;
    check(
        none.duplicates > 0,
        format!("none: expected duplicates, got {}", none.duplicates),
    );
    for key in ["try-claim", "processed-tx", "offsets"] {
        for crash in [false, true] {
            let r = one(&runs, key, crash)?;
            check(
                r.duplicates == 0 && r.missing == 0 && r.pending == 0,
                format!(
                    "{key} crash={crash}: {} duplicates, {} missing, {} pending; want 0, 0, 0",
                    r.duplicates, r.missing, r.pending
                ),
            );
        }
    }
    // The offsets consumers delivered every entry at least twice (each batch twice, and
    // after the crash the partitions taken over from the database's position).
    for crash in [false, true] {
        let r = one(&runs, "offsets", crash)?;
        let delivered: u64 = r.consumers.iter().map(|c| c.stats.delivered).sum();
        let took_over: u64 = r.consumers.iter().map(|c| c.stats.reclaimed).sum();
        check(
            delivered >= 2 * r.jobs && (!r.crashed() || took_over > 0),
            format!(
                "offsets crash={crash}: {delivered} deliveries of {} jobs, {took_over} partitions taken over",
                r.jobs
            ),
        );
    }
    // dedup's lease never loses a job, crash or not, and without a crash runs each job once;
    // a crash between the effect and dedup.complete may repeat one (at-least-once).
    for crash in [false, true] {
        let r = one(&runs, "dedup-lease", crash)?;
        check(
            r.missing == 0 && r.pending == 0 && (crash || r.duplicates == 0),
            format!(
                "dedup-lease crash={crash}: {} duplicates, {} missing, {} pending",
                r.duplicates, r.missing, r.pending
            ),
        );
    }
    // A crash loses the jobs the killed consumer had claimed and not done: usually 10 to 20,
    // but a kill that finds its handlers between jobs loses fewer (4 seen). Up to two more
    // crash runs before calling it a failure.
    let mut lost: Vec<u64> = vec![one(&runs, "set-nx", true)?.missing];
    let set_nx = dedup_pg_test::experiment::strategy::by_key("set-nx").unwrap();
    while lost.iter().all(|&m| m == 0) && lost.len() < 3 {
        let r = exp
            .run_once(set_nx, true, lost.len() as u32 + 1, "set-nx crash, again")
            .await?;
        println!("  {}", report::run_summary(&r).replace('\n', "\n  "));
        check(r.crashed(), "set-nx: a crash run had no crash".to_string());
        lost.push(r.missing);
    }
    check(
        lost.iter().any(|&m| m > 0),
        format!("set-nx with a crash lost no job in {} runs", lost.len()),
    );
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// Every job is published `copies` times, consecutive copies `gap` messages apart.
pub async fn copies_are_published_gap_messages_apart(_ctx: Ctx) -> Result<()> {
    for (jobs, copies, gap) in [(3000, 2, 20), (900, 2, 20), (50, 3, 7), (5, 2, 20)] {
        let cfg = Config {
            jobs,
            copies,
            gap,
            ..Config::default()
        };
        let order = publish_order(&cfg);
        ensure_eq(order.len() as u64, cfg.messages(), "messages")?;
        let mut seen = std::collections::HashMap::<u32, Vec<usize>>::new();
        for (pos, (job, _copy)) in order.iter().enumerate() {
            seen.entry(*job).or_default().push(pos);
        }
        ensure_eq(seen.len() as u32, jobs, "distinct jobs")?;
        for (job, positions) in seen {
            ensure_eq(positions.len() as u32, copies, "copies of a job")?;
            let last_block = job > jobs - jobs % gap && jobs % gap != 0;
            let want = if last_block {
                (jobs % gap) as usize
            } else {
                gap as usize
            };
            for w in positions.windows(2) {
                ensure_eq(
                    w[1] - w[0],
                    want,
                    &format!("distance between copies of job {job}"),
                )?;
            }
        }
    }
    Ok(())
}
