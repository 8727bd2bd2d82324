//! The client examples in examples/, each run as its own processes against the test server
//! with a duplicated workload, and the snippets of docs/clients.md checked against them.
//!
//! Per example: load examples/schema.sql, send each job once, twice or 3 times (copies a few
//! messages apart), start 3 consumer processes, SIGKILL one of them mid-run, and wait for
//! the others to drain the queue; every message must be acknowledged.
//!
//! The claim examples (`try_claim` in the effect's transaction): faults injected into the
//! effect's transactions (deadlock, serialization failure at COMMIT, plain errors before
//! and at COMMIT, and a plain error on the first attempt of some jobs sent only once, so
//! that acknowledging a message whose transaction failed loses a job). Every job's effect
//! must be in `receipts` exactly once, and the survivors must have retried and left failed
//! messages unacknowledged (redelivered and done later).
//!
//! The lease examples (`dedup.lease`, an external call, `dedup.complete`): the external
//! system is an HTTP service in the test process (`fake_service.rs`) that honours an
//! idempotency key and injects faults (refusals, lost answers, slow answers, again on the
//! first call of some jobs sent only once). Every job must be charged exactly once and be
//! done in dedup with that charge as its result; and every repeated call for a charged job
//! (a duplicate effect, had the call carried no key) must follow a call whose caller was
//! killed or never got the answer: the lease never lets two survivors both make the call.
use crate::common::{ensure_eq, Ctx};
use crate::fake_service::{self, Fault, Service};
use anyhow::{bail, ensure, Context, Result};
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const JOBS: i64 = 120;
/// Copies of job j: 1 if j is a multiple of 5, else 2 if j is even, else 3.
const COPIES: &str = "CASE WHEN j % 5 = 0 THEN 1 WHEN j % 2 = 0 THEN 2 ELSE 3 END";
const PROCESSES: usize = 3;
/// The lease examples' lease, in seconds: twice the visibility timeout, so copies of a job
/// that is being charged are delivered and told `busy`; shorter than a slow call
/// (`fake_service::SLOW`), so only a heartbeat keeps it through one.
const LEASE_S: &str = "2";

/// How to start one example.
struct Example {
    name: &'static str,
    /// The program and its arguments, relative to the repository root.
    command: &'static [&'static str],
    kind: Kind,
}

#[derive(PartialEq)]
enum Kind {
    /// `try_claim` in the transaction of a write to `receipts`.
    Claim,
    /// `lease`, an HTTP call to the service, `complete`. `heartbeat`: the example extends
    /// the lease while the call runs (else its call times out before the lease expires).
    Lease { heartbeat: bool },
}

const RUST: Example = Example {
    name: "rust tokio-postgres",
    command: &[RUST_BIN, "dedup-example-consumer"],
    kind: Kind::Claim,
};
const PSYCOPG: Example = Example {
    name: "python psycopg",
    command: &[PYTHON, "examples/python/consumer_psycopg.py"],
    kind: Kind::Claim,
};
const ASYNCPG: Example = Example {
    name: "python asyncpg",
    command: &[PYTHON, "examples/python/consumer_asyncpg.py"],
    kind: Kind::Claim,
};
const SQLALCHEMY: Example = Example {
    name: "python sqlalchemy",
    command: &[PYTHON, "examples/python/consumer_sqlalchemy.py"],
    kind: Kind::Claim,
};
const NODE: Example = Example {
    name: "node pg",
    command: &["node", "examples/node/consumer.js"],
    kind: Kind::Claim,
};
const RUST_LEASE: Example = Example {
    name: "rust tokio-postgres lease",
    command: &[RUST_BIN, "dedup-example-lease"],
    kind: Kind::Lease { heartbeat: true },
};
const PSYCOPG_LEASE: Example = Example {
    name: "python psycopg lease",
    command: &[PYTHON, "examples/python/lease_psycopg.py"],
    kind: Kind::Lease { heartbeat: false },
};
const ASYNCPG_LEASE: Example = Example {
    name: "python asyncpg lease",
    command: &[PYTHON, "examples/python/lease_asyncpg.py"],
    kind: Kind::Lease { heartbeat: true },
};
const NODE_LEASE: Example = Example {
    name: "node pg lease",
    command: &["node", "examples/node/lease.js"],
    kind: Kind::Lease { heartbeat: true },
};
const PYTHON: &str = "examples/python/.venv/bin/python";
/// A binary of the workspace member `examples/rust`, named by the next argument.
const RUST_BIN: &str = "<rust>";

/// Every file whose `[readme:NAME]` regions docs/clients.md may show: the files run above.
const RUN_FILES: &[&str] = &[
    "examples/rust/src/main.rs",
    "examples/rust/src/lease.rs",
    "examples/python/consumer_psycopg.py",
    "examples/python/consumer_asyncpg.py",
    "examples/python/consumer_sqlalchemy.py",
    "examples/node/consumer.js",
    "examples/python/lease_psycopg.py",
    "examples/python/lease_asyncpg.py",
    "examples/node/lease.js",
];

pub async fn rust_tokio_postgres_consumer(ctx: Ctx) -> Result<()> {
    run(&ctx, &RUST).await
}
pub async fn python_psycopg_consumer(ctx: Ctx) -> Result<()> {
    run(&ctx, &PSYCOPG).await
}
pub async fn python_asyncpg_consumer(ctx: Ctx) -> Result<()> {
    run(&ctx, &ASYNCPG).await
}
pub async fn python_sqlalchemy_consumer(ctx: Ctx) -> Result<()> {
    run(&ctx, &SQLALCHEMY).await
}
pub async fn node_pg_consumer(ctx: Ctx) -> Result<()> {
    run(&ctx, &NODE).await
}
pub async fn rust_tokio_postgres_lease_consumer(ctx: Ctx) -> Result<()> {
    run_leases(&ctx, &RUST_LEASE).await
}
pub async fn python_psycopg_lease_consumer(ctx: Ctx) -> Result<()> {
    run_leases(&ctx, &PSYCOPG_LEASE).await
}
pub async fn python_asyncpg_lease_consumer(ctx: Ctx) -> Result<()> {
    run_leases(&ctx, &ASYNCPG_LEASE).await
}
pub async fn node_pg_lease_consumer(ctx: Ctx) -> Result<()> {
    run_leases(&ctx, &NODE_LEASE).await
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("pg_test has a parent")
        .to_path_buf()
}

/// A binary of the Rust examples, built (or found up to date) by cargo.
async fn rust_binary(name: &str) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--quiet", "-p", "dedup-example-consumer"])
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {cargo} build"))?;
    if !out.status.success() {
        bail!(
            "cargo build -p dedup-example-consumer failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    Ok(target.join("debug").join(name))
}

/// The example's command line, checking that setup.sh installed its dependencies.
async fn command(example: &Example) -> Result<Vec<PathBuf>> {
    let root = root();
    if let [RUST_BIN, name] = example.command {
        return Ok(vec![rust_binary(name).await?]);
    }
    let needs: &Path = if example.command[0] == PYTHON {
        Path::new(PYTHON)
    } else {
        Path::new("examples/node/node_modules/pg")
    };
    if !root.join(needs).exists() {
        bail!(
            "{} is missing: run `bash scripts/setup.sh` to install the examples' dependencies",
            needs.display()
        );
    }
    Ok(example
        .command
        .iter()
        .map(|a| {
            if a.starts_with("examples/") {
                root.join(a)
            } else {
                PathBuf::from(a)
            }
        })
        .collect())
}

/// Faults in the effect's transaction, counted by sequences (which rollbacks do not undo):
/// every 11th insert attempt raises a deadlock, every 17th a plain error, and so does the
/// first attempt of every job whose number is a multiple of 10 (sent once); at COMMIT (a
/// deferred trigger) every 13th raises a serialization failure, every 23rd a plain error.
const FAULTS: &str = r#"
CREATE SEQUENCE test_insert_attempts;
CREATE SEQUENCE test_commit_attempts;
DO $$ BEGIN
    FOR j IN 10..1000 BY 10 LOOP
        EXECUTE format('CREATE SEQUENCE test_first_attempt_job_%s', j);
    END LOOP;
END $$;
CREATE FUNCTION test_fault_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint := nextval('test_insert_attempts');
    once regclass := to_regclass('test_first_attempt_' || replace(NEW.job_id, '-', '_'));
BEGIN
    IF once IS NOT NULL AND nextval(once) = 1 THEN
        RAISE EXCEPTION 'injected failure of the first attempt of %', NEW.job_id;
    END IF;
    IF n % 11 = 0 THEN
        RAISE EXCEPTION 'injected deadlock (attempt %)', n USING ERRCODE = 'deadlock_detected';
    END IF;
    IF n % 17 = 0 THEN
        RAISE EXCEPTION 'injected failure (attempt %)', n;
    END IF;
    RETURN NEW;
END $$;
CREATE FUNCTION test_fault_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint := nextval('test_commit_attempts');
BEGIN
    IF n % 13 = 0 THEN
        RAISE EXCEPTION 'injected serialization failure at commit (attempt %)', n
            USING ERRCODE = 'serialization_failure';
    END IF;
    IF n % 23 = 0 THEN
        RAISE EXCEPTION 'injected failure at commit (attempt %)', n;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER fault_on_insert BEFORE INSERT ON receipts
    FOR EACH ROW EXECUTE FUNCTION test_fault_on_insert();
CREATE CONSTRAINT TRIGGER fault_at_commit AFTER INSERT ON receipts
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_fault_at_commit();
"#;

/// Read a child's output to the end in the background (so a full pipe never blocks it).
fn drain(
    mut r: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf).await;
        String::from_utf8_lossy(&buf).into_owned()
    })
}

struct Consumer {
    child: Child,
    /// The process id: the examples name themselves `<client>-<pid>`.
    pid: u32,
    stdout: tokio::task::JoinHandle<String>,
    stderr: tokio::task::JoinHandle<String>,
}

/// Load examples/schema.sql (and `extra` SQL) and send the duplicated workload: copy k of
/// job j at position j + 4k, copies a few messages apart, so they are often in flight at
/// the same time. Returns the number of messages.
async fn prepare(c: &tokio_postgres::Client, extra: &str) -> Result<i64> {
    let mut schema = std::fs::read_to_string(root().join("examples/schema.sql"))?;
    if dedup_pg_test::cluster::edition() == dedup_pg_test::cluster::Edition::Plain {
        // The plain script of the portable edition made dedup already, without an extension.
        schema = schema.replace("CREATE EXTENSION IF NOT EXISTS dedup;", "");
    }
    c.batch_execute(&schema)
        .await
        .context("loading examples/schema.sql")?;
    c.batch_execute(extra).await?;
    c.batch_execute(&format!(
        "DO $$ DECLARE r record; BEGIN
           FOR r IN SELECT j, k FROM generate_series(1, {JOBS}) j, generate_series(0, {COPIES} - 1) k
                    ORDER BY j + 4 * k, k LOOP
             PERFORM queue.send('job-' || r.j);
           END LOOP;
         END $$"
    ))
    .await?;
    Ok(c.query_one("SELECT count(*) FROM queue.messages", &[])
        .await?
        .get(0))
}

/// Start `PROCESSES` consumers of `argv` with 3 workers each (where the example has a
/// `WORKERS` setting), a visibility timeout of 1 s, exiting once the queue is empty.
fn start(ctx: &Ctx, argv: &[PathBuf], env: &[(&str, &str)]) -> Result<Vec<Consumer>> {
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/{}",
        ctx.cluster.port, ctx.db
    );
    let mut consumers = Vec::new();
    for _ in 0..PROCESSES {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(root())
            .env("DATABASE_URL", &url)
            .env("WORKERS", "3")
            .env("VISIBILITY_TIMEOUT_S", "1")
            .env("EXIT_WHEN_EMPTY", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {argv:?}"))?;
        let pid = child.id().context("no pid")?;
        let stdout = drain(child.stdout.take().expect("piped"));
        let stderr = drain(child.stderr.take().expect("piped"));
        consumers.push(Consumer {
            child,
            pid,
            stdout,
            stderr,
        });
    }
    Ok(consumers)
}

/// Kill the first consumer with SIGKILL once `done()` reaches a quarter of the jobs:
/// whatever it had received but not acknowledged must be delivered again and done by the
/// others. Returns `done()` at the kill, or `None` if the consumer had finished already.
async fn kill_first_at_a_quarter<F, Fut>(consumers: &mut [Consumer], done: F) -> Result<Option<i64>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<i64>>,
{
    let started = Instant::now();
    loop {
        let done = done().await?;
        if consumers[0].child.try_wait()?.is_some() {
            return Ok(None); // already finished: nothing to kill
        }
        if done >= JOBS / 4 {
            consumers[0].child.start_kill()?;
            return Ok(Some(done));
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("fewer than {} jobs done after 120 s", JOBS / 4);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait for every consumer; the survivors must exit successfully and print a summary line
/// `<name> summary key=n ...`. Returns the survivors' summed counts and every log.
async fn finish(
    consumers: Vec<Consumer>,
    killed: bool,
    name: &str,
) -> Result<(HashMap<String, u64>, String)> {
    let mut totals = HashMap::new();
    let mut logs = String::new();
    for (i, mut consumer) in consumers.into_iter().enumerate() {
        let status =
            match tokio::time::timeout(Duration::from_secs(120), consumer.child.wait()).await {
                Ok(s) => s?,
                Err(_) => {
                    consumer.child.start_kill()?;
                    bail!("consumer {i} of {name} still running after 120 s");
                }
            };
        let (out, err) = (consumer.stdout.await?, consumer.stderr.await?);
        logs.push_str(&format!(
            "--- consumer {i}: {status}\n{out}{}\n",
            err.lines().take(20).collect::<Vec<_>>().join("\n")
        ));
        if i == 0 && killed {
            continue;
        }
        if !status.success() {
            bail!("consumer {i} of {name} failed: {status}\n{logs}");
        }
        let Some(summary) = out.lines().find_map(|l| l.split_once(" summary ")) else {
            bail!("consumer {i} printed no summary\n{logs}");
        };
        for field in summary.1.split_whitespace() {
            if let Some((key, Ok(n))) = field.split_once('=').map(|(k, v)| (k, v.parse::<u64>())) {
                *totals.entry(key.to_string()).or_default() += n;
            }
        }
    }
    Ok((totals, logs))
}

fn killed_text(killed_at: Option<i64>) -> String {
    match killed_at {
        Some(n) => format!("one killed after {n} jobs"),
        None => "none killed (the first finished early)".into(),
    }
}

async fn run(ctx: &Ctx, example: &Example) -> Result<()> {
    let argv = command(example).await?;
    let c = ctx.connect().await?;
    let messages = prepare(&c, FAULTS).await?;
    let started = Instant::now();
    let mut consumers = start(ctx, &argv, &[])?;
    let receipts = || async {
        Ok(c.query_one("SELECT count(*) FROM receipts", &[])
            .await?
            .get::<_, i64>(0))
    };
    let killed_at = kill_first_at_a_quarter(&mut consumers, receipts).await?;
    let (totals, logs) = finish(consumers, killed_at.is_some(), example.name).await?;
    let elapsed = started.elapsed();

    let check = async {
        let row = c
            .query_one(
                &format!(
                    "SELECT count(*), count(DISTINCT job_id), \
                       (SELECT count(*) FROM generate_series(1, {JOBS}) j \
                        WHERE NOT EXISTS (SELECT FROM receipts WHERE job_id = 'job-' || j)), \
                       queue.pending(), \
                       (SELECT count(*) FROM dedup.processed), \
                       (SELECT last_value FROM test_insert_attempts), \
                       (SELECT last_value FROM test_commit_attempts) \
                     FROM receipts"
                ),
                &[],
            )
            .await?;
        let got: [i64; 7] = std::array::from_fn(|i| row.get(i));
        ensure_eq(got[0], JOBS, "effect rows")?;
        ensure_eq(got[1], JOBS, "distinct jobs in the effect table")?;
        ensure_eq(got[2], 0, "jobs never done")?;
        ensure_eq(got[3], 0, "messages never acknowledged")?;
        ensure_eq(got[4], JOBS, "claims")?;
        if got[5] < 17 || got[6] < 23 {
            bail!("too few attempts to inject every fault: {got:?}");
        }
        let [skipped, retried, failed] =
            ["skipped", "retried", "failed"].map(|k| totals.get(k).copied().unwrap_or(0));
        if skipped == 0 || retried == 0 || failed == 0 {
            bail!("the survivors skipped {skipped}, retried {retried}, failed {failed}: each should be > 0");
        }
        Ok(())
    };
    check
        .await
        .with_context(|| format!("{}:\n{logs}", example.name))?;
    let count = |k: &str| totals.get(k).copied().unwrap_or(0);
    println!(
        "  {}: {PROCESSES} processes, {messages} messages for {JOBS} jobs in {:.1} s; {}; \
         survivors: done={} skipped={} retried={} failed={}",
        example.name,
        elapsed.as_secs_f64(),
        killed_text(killed_at),
        count("done"),
        count("skipped"),
        count("retried"),
        count("failed"),
    );
    Ok(())
}

/// A lease example against the fake service; see the module comment for what it checks.
async fn run_leases(ctx: &Ctx, example: &Example) -> Result<()> {
    let Kind::Lease { heartbeat } = example.kind else {
        bail!("{} is not a lease example", example.name);
    };
    let argv = command(example).await?;
    let service = Service::start().await?;
    let c = ctx.connect().await?;
    let messages = prepare(&c, "").await?;
    let started = Instant::now();
    let mut consumers = start(
        ctx,
        &argv,
        &[("CHARGES_URL", &service.url), ("LEASE_S", LEASE_S)],
    )?;
    let killed_pid = consumers[0].pid;
    let charged = || async { Ok(service.charged() as i64) };
    let killed_at = kill_first_at_a_quarter(&mut consumers, charged).await?;
    let (totals, logs) = finish(consumers, killed_at.is_some(), example.name).await?;
    let elapsed = started.elapsed();
    let calls = service.calls();
    let charges = service.charges();

    // A call that did not get its caller an answer it could complete the lease with: the
    // caller was killed, or the service refused, lost the answer, or (for an example
    // without a heartbeat, whose call times out before its lease expires) answered slowly.
    let killed_name = format!("-{killed_pid}");
    let by_killed =
        |call: &fake_service::Call| killed_at.is_some() && call.consumer.ends_with(&killed_name);
    let unanswered = |call: &fake_service::Call| {
        by_killed(call)
            || matches!(call.fault, Fault::Refused | Fault::AnswerLost)
            || (call.fault == Fault::Slow && !heartbeat)
    };
    let mut repeats = 0; // calls after the charge: each a duplicate effect without the key
    let mut repeats_after_kill = 0;
    let check = async {
        let mut by_key: HashMap<&str, Vec<&fake_service::Call>> = HashMap::new();
        for call in &calls {
            by_key.entry(&call.key).or_default().push(call);
        }
        for j in 1..=JOBS {
            let key = format!("job-{j}");
            let calls = by_key.get(key.as_str()).map(Vec::as_slice).unwrap_or(&[]);
            let Some(first) = calls.iter().position(|c| c.charged) else {
                bail!("{key} was never charged; its calls: {calls:?}");
            };
            ensure_eq(
                calls.iter().filter(|c| c.charged).count(),
                1,
                &format!("charges of {key}"),
            )?;
            // Every call after the charge repeats it, which is harmless only thanks to the
            // key. It must follow calls that all went unanswered: a survivor that got the
            // answer completes the lease, and no one else calls while it holds the lease.
            for (i, call) in calls.iter().enumerate().skip(first + 1) {
                repeats += 1;
                if let Some(answered) = calls[first..i].iter().find(|c| !unanswered(c)) {
                    bail!(
                        "{key}: call {i} ({call:?}) repeats the charge after {answered:?} \
                         was answered; its calls: {calls:?}"
                    );
                }
                if calls[first..i].iter().any(|c| by_killed(c)) {
                    repeats_after_kill += 1;
                }
            }
        }
        ensure_eq(charges.len() as i64, JOBS, "jobs charged")?;
        let row = c
            .query_one(
                "SELECT queue.pending(), \
                   (SELECT count(*) FROM dedup.processed WHERE lease_expires_at IS NOT NULL), \
                   (SELECT count(*) FROM dedup.processed \
                     WHERE scope = 'charges' AND lease_expires_at IS NULL), \
                   (SELECT json_object_agg(job_id, result->>'charge')::text FROM dedup.processed)",
                &[],
            )
            .await?;
        ensure_eq(row.get::<_, i64>(0), 0, "messages never acknowledged")?;
        ensure_eq(row.get::<_, i64>(1), 0, "leases not completed")?;
        ensure_eq(row.get::<_, i64>(2), JOBS, "jobs done in scope 'charges'")?;
        let results: HashMap<String, String> =
            serde_json::from_str(&row.get::<_, String>(3)).context("results")?;
        ensure_eq(&results, &charges, "results stored by complete, per job")?;
        for fault in [Fault::Refused, Fault::AnswerLost, Fault::Slow] {
            ensure!(
                calls.iter().any(|c| c.fault == fault),
                "no call was {fault:?}"
            );
        }
        let [skipped, busy, failed] =
            ["skipped", "busy", "failed"].map(|k| totals.get(k).copied().unwrap_or(0));
        if skipped == 0 || busy == 0 || failed == 0 {
            bail!("the survivors skipped {skipped}, were told busy {busy}, failed {failed}: each should be > 0");
        }
        Ok(())
    };
    check
        .await
        .with_context(|| format!("{}:\n{logs}", example.name))?;
    let count = |k: &str| totals.get(k).copied().unwrap_or(0);
    println!(
        "  {}: {PROCESSES} processes, {messages} messages for {JOBS} jobs in {:.1} s; {}; \
         {} calls, {JOBS} charges, {repeats} repeated calls absorbed by the key \
         ({repeats_after_kill} after the killed consumer's); \
         survivors: done={} skipped={} busy={} failed={}",
        example.name,
        elapsed.as_secs_f64(),
        killed_text(killed_at),
        calls.len(),
        count("done"),
        count("skipped"),
        count("busy"),
        count("failed"),
    );
    Ok(())
}

/// The text between the lines marking `[readme:NAME]` and `[/readme:NAME]` in `file`.
fn region(file: &str, text: &str, name: &str) -> Result<String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_end().ends_with(&format!("[readme:{name}]")))
        .with_context(|| format!("{file} has no [readme:{name}] region"))?;
    let len = lines[start + 1..]
        .iter()
        .position(|l| l.trim_end().ends_with(&format!("[/readme:{name}]")))
        .with_context(|| format!("{file}: [readme:{name}] is not closed"))?;
    Ok(lines[start + 1..start + 1 + len].join("\n"))
}

/// docs/clients.md and the README show the examples' marked regions (`[readme:NAME]`, a
/// name kept from when the README showed them all), character for character, and no other
/// code in their examples sections; every region of every example is shown, and every
/// example shows at least one.
pub async fn clients_guide_shows_the_examples_as_they_run(_ctx: Ctx) -> Result<()> {
    let mut shown = Vec::new();
    for doc in ["docs/clients.md", "README.md"] {
        shown.extend(snippets_shown(doc)?);
    }
    // Every region in the examples is shown.
    for file in RUN_FILES {
        let text = std::fs::read_to_string(root().join(file))?;
        for l in text.lines() {
            if let Some(name) = l
                .trim_end()
                .split("[readme:")
                .nth(1)
                .and_then(|r| r.strip_suffix(']'))
            {
                if !shown.contains(&format!("{file}#{name}")) {
                    bail!("{file} marks the region {name} for the docs, which do not show it");
                }
            }
        }
    }
    for file in RUN_FILES {
        if !shown.iter().any(|s| s.starts_with(&format!("{file}#"))) {
            bail!("docs/clients.md shows nothing of {file}");
        }
    }
    Ok(())
}

/// The snippets of `doc`'s `<!-- examples -->` section, each checked against its file:
/// `PATH#NAME` of each.
fn snippets_shown(doc: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(root().join(doc))?;
    let (Some(s), Some(e)) = (
        text.find("<!-- examples -->"),
        text.find("<!-- /examples -->"),
    ) else {
        bail!("{doc} has no <!-- examples --> ... <!-- /examples --> section");
    };
    let lines: Vec<&str> = text[s..e].lines().collect();
    let mut shown = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(rest) = line.strip_prefix("<!-- snippet: ") {
            let target = rest.trim_end().trim_end_matches("-->").trim();
            let Some((file, name)) = target.split_once('#') else {
                bail!("{doc}: {line}: want <!-- snippet: PATH#NAME -->");
            };
            if !RUN_FILES.contains(&file) {
                bail!("{doc} shows {file}, which the tests do not run");
            }
            let Some(fence) = lines.get(i + 1).filter(|l| l.starts_with("```")) else {
                bail!("{doc}: {line} is not followed by a code block");
            };
            let len = lines[i + 2..]
                .iter()
                .position(|l| l.starts_with("```"))
                .with_context(|| format!("{doc}: the code block after {line} is not closed"))?;
            let block = lines[i + 2..i + 2 + len].join("\n");
            let source = std::fs::read_to_string(root().join(file))?;
            let want = region(file, &source, name)?;
            if block != want {
                bail!(
                    "{doc}'s snippet {file}#{name} differs from the file; replace the block after \
                     `{line}` (opened by {fence}) with:\n{want}"
                );
            }
            shown.push(format!("{file}#{name}"));
            i += 2 + len + 1;
            continue;
        }
        if line.starts_with("```") {
            bail!("{doc}'s examples section has a code block that is not a marked snippet: {line} (line {i} of the section)");
        }
        i += 1;
    }
    Ok(shown)
}
