//! `experiment [OPTIONS]`: the guide's experiment, end to end (see `--help`).
//! `experiment consumer ...`: one consumer process; the orchestrator starts these.
use anyhow::{Context, Result};
use dedup_pg_test::cluster::{stop_all_on_signal, Cluster, Options};
use dedup_pg_test::experiment::consumer::{self, ConsumerArgs};
use dedup_pg_test::experiment::redis_server::RedisServer;
use dedup_pg_test::experiment::report::{self, Report};
use dedup_pg_test::experiment::run::Experiment;
use dedup_pg_test::experiment::strategy::STRATEGIES;
use dedup_pg_test::experiment::{parse_cli, Cli, USAGE};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{SystemTime, UNIX_EPOCH};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result = if args.first().map(String::as_str) == Some("consumer") {
        ConsumerArgs::parse(&args[1..]).and_then(|a| runtime.block_on(consumer::main(a)))
    } else if args.first().map(String::as_str) == Some("chart") {
        match &args[1..] {
            [json, svg] => report::chart_from_json(Path::new(json), Path::new(svg)),
            _ => Err(anyhow::anyhow!("usage: experiment chart RUNS.json OUT.svg")),
        }
    } else if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        Ok(())
    } else {
        match parse_cli(&args) {
            Ok(cli) if cli.list => {
                for s in STRATEGIES {
                    println!("{:<14} {}", s.key, s.title);
                }
                Ok(())
            }
            Ok(cli) => runtime.block_on(orchestrate(cli)),
            Err(e) => Err(e),
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("experiment: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The installed extension library, `$(pg_config --pkglibdir)/dedup.so`.
fn installed_library() -> PathBuf {
    Command::new(dedup_pg_test::cluster::pg_config())
        .arg("--pkglibdir")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|d| PathBuf::from(d.trim()).join("dedup.so"))
        .unwrap_or_default()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn commit() -> String {
    Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

async fn orchestrate(cli: Cli) -> Result<()> {
    stop_all_on_signal();
    let cfg = cli.config.clone();
    std::fs::create_dir_all(&cli.out).with_context(|| format!("creating {}", cli.out.display()))?;
    let max_connections = (cfg.consumers * cfg.concurrency + 20).max(120).to_string();
    let cluster = tokio::task::spawn_blocking(move || -> Result<Cluster> {
        let c =
            Cluster::start(Options::named("experiment").set("max_connections", &max_connections))?;
        c.create_db_with_extension("experiment")?;
        Ok(c)
    })
    .await??;
    let library = installed_library();
    let library_before = modified(&library);
    let extension_version: String = dedup_pg_test::connect(&cluster.dsn("experiment"))
        .await?
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'dedup'",
            &[],
        )
        .await?
        .get(0);
    let redis = RedisServer::start().await?;
    println!(
        "The guide's experiment: {} jobs, each published {} times {} messages apart, into a \
         Redis stream;\n{} consumer processes of {} handlers each; survivors reclaim messages \
         idle for {} ms\nwith XAUTOCLAIM; in crash runs one consumer gets SIGKILL {} ms in. \
         Every execution of the\neffect is a row in PostgreSQL's `effects` table.\n\
         Throwaway servers: PostgreSQL 15 with dedup {extension_version} on 127.0.0.1:{}, \
         redis-server on 127.0.0.1:{}.\n",
        report::thousands(cfg.jobs as u64),
        cfg.copies,
        cfg.gap,
        cfg.consumers,
        cfg.concurrency,
        cfg.reclaim_idle.as_millis(),
        cfg.crash_after.as_millis(),
        cluster.port,
        redis.port,
    );
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let exp = Experiment {
        config: cfg.clone(),
        pg_dsn: cluster.dsn("experiment"),
        consumer_dsns: Vec::new(),
        redis_url: redis.url(),
        consumer_exe: std::env::current_exe()?,
    };
    let runs = exp
        .run_matrix(|r| println!("{}", report::run_summary(r)))
        .await;
    drop(redis);
    drop(cluster);
    let runs = runs?;
    let library_replaced = modified(&library) != library_before;
    if library_replaced {
        eprintln!(
            "warning: {} was replaced while the runs went on (the extension was reinstalled)",
            library.display()
        );
    }
    println!("Everything it started is stopped.\n");

    let commit = commit();
    let table = report::table(&runs, &cfg);
    println!("{table}");
    let report = Report {
        commit: commit.clone(),
        started_unix,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        extension_version: extension_version.clone(),
        library_replaced,
        config: cfg.clone(),
        runs,
    };
    std::fs::write(cli.out.join("table.md"), &table)?;
    report::write_json(&cli.out.join("runs.json"), &report)?;
    report::write_chart(
        &cli.out.join("chart.svg"),
        &report.runs,
        &report::caption(&cfg, &commit, &extension_version),
    )?;
    println!(
        "Wrote {0}/runs.json, {0}/table.md and {0}/chart.svg (commit {commit}, dedup \
         {extension_version}{1}).",
        cli.out.display(),
        if library_replaced {
            ", reinstalled during the runs"
        } else {
            ""
        }
    );
    let undrained = report.runs.iter().filter(|r| !r.drained).count();
    let uncrashed = report
        .runs
        .iter()
        .filter(|r| r.crash && !r.crashed())
        .count();
    if undrained > 0 || uncrashed > 0 {
        anyhow::bail!(
            "{undrained} run(s) did not drain, {uncrashed} crash run(s) drained before the crash"
        );
    }
    Ok(())
}
