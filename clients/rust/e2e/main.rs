//! The tests of dedup-client against a real server, built by test.sh as a fresh Cargo
//! project whose dependency is the crate by its path (as a user's project would have it).
//!
//! `e2e suite`: every test, one line each (`ok - name` or `not ok - name: why`).
//! `e2e worker DRIVER DB NAME TASKS`: one worker process of the end-to-end test: takes
//! messages from the table queue, runs each job with run_once, acknowledges after COMMIT.
//!
//! Environment: DEDUP_TEST_HOST (socket directory, default /tmp), DEDUP_TEST_PORT (default
//! 55434), DEDUP_TEST_USER (default postgres).
use dedup_client::sqlx as dsx;
use dedup_client::tokio_postgres as dpg;
use dedup_client::{
    Error, Isolation, LeaseOptions, LeaseOutcome, LeaseStatus, Outcome, RunOptions,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};
use std::future::Future;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_postgres::{Client, NoTls};

type TestResult = Result<(), String>;

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// `?` for anything Display-able inside a test.
trait Context<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::error::Error> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| {
            // The whole chain: tokio-postgres says "db error" and keeps the server's
            // message in the source.
            let mut text = format!("{what}: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            text
        })
    }
}

fn host() -> String {
    std::env::var("DEDUP_TEST_HOST").unwrap_or_else(|_| "/tmp".into())
}
fn port() -> u16 {
    std::env::var("DEDUP_TEST_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(55434)
}
fn user() -> String {
    std::env::var("DEDUP_TEST_USER").unwrap_or_else(|_| "postgres".into())
}

async fn connect_as(db: &str, app: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::Config::new()
        .host(host())
        .port(port())
        .user(user())
        .dbname(db)
        .application_name(app)
        .connect(NoTls)
        .await
        .ctx(&format!("connect to {db}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

async fn connect(db: &str) -> Result<Client, String> {
    connect_as(db, "dedup-client-test").await
}

async fn pool_as(db: &str, app: &str, size: u32) -> Result<PgPool, String> {
    let options = PgConnectOptions::new()
        .host(&host())
        .port(port())
        .username(&user())
        .database(db)
        .application_name(app);
    PgPoolOptions::new()
        .max_connections(size)
        .connect_with(options)
        .await
        .ctx(&format!("sqlx pool on {db}"))
}

/// A new database with the extension and the test tables.
async fn fresh_database(name: &str, schema: &str) -> Result<(), String> {
    let admin = connect("postgres").await?;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin.batch_execute(&sql).await.ctx(&sql)?;
    }
    let db = connect(name).await?;
    db.batch_execute("CREATE EXTENSION dedup")
        .await
        .ctx("CREATE EXTENSION dedup")?;
    db.batch_execute(schema).await.ctx("schema")?;
    Ok(())
}

/// Tables of the unit-level tests: `effects`, whose triggers raise the errors listed in
/// `injections` (a per-row sequence counts the attempts, surviving the rollbacks).
const TEST_SCHEMA: &str = r#"
CREATE TABLE effects (job text NOT NULL, via text NOT NULL);
CREATE TABLE injections (job text PRIMARY KEY, sqlstate text NOT NULL, times int NOT NULL,
                         at text NOT NULL CHECK (at IN ('insert', 'commit')), seq regclass NOT NULL);
CREATE FUNCTION inject(p_job text, p_sqlstate text, p_times int, p_at text DEFAULT 'insert')
RETURNS void LANGUAGE plpgsql AS $$
DECLARE s text := 'inj_' || md5(p_job);
BEGIN
  EXECUTE format('CREATE SEQUENCE %I', s);
  INSERT INTO injections VALUES (p_job, p_sqlstate, p_times, p_at, s::regclass);
END $$;
CREATE FUNCTION attempts(p_job text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM %s',
                 (SELECT seq FROM injections WHERE job = p_job)) INTO n;
  RETURN n;
END $$;
CREATE FUNCTION injected() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE i injections;
BEGIN
  SELECT * INTO i FROM injections WHERE job = NEW.job AND at = TG_ARGV[0];
  IF FOUND AND nextval(i.seq) <= i.times THEN
    RAISE EXCEPTION 'injected % for job % (at %)', i.sqlstate, NEW.job, i.at
      USING ERRCODE = i.sqlstate;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER at_insert BEFORE INSERT ON effects FOR EACH ROW EXECUTE FUNCTION injected('insert');
CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION injected('commit');
"#;

const DB: &str = "dedup_client_test";

async fn count(c: &Client, sql: &str) -> Result<i64, String> {
    c.query_one(sql, &[])
        .await
        .ctx(sql)
        .map(|row| row.get::<_, i64>(0))
}

async fn effects_of(c: &Client, job: &str) -> Result<i64, String> {
    c.query_one("SELECT count(*) FROM effects WHERE job = $1", &[&job])
        .await
        .ctx("count effects")
        .map(|row| row.get(0))
}

fn expect_invalid<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, Error>,
    argument: &str,
    sqlstate: &str,
) -> TestResult {
    match r {
        Err(e @ Error::InvalidArgument { argument: a, .. }) if a == argument => {
            check!(
                e.sqlstate() == Some(sqlstate),
                "{what}: SQLSTATE {:?}, expected {sqlstate} ({e})",
                e.sqlstate()
            );
            check!(
                e.to_string().contains(argument),
                "{what}: message {e} does not name {argument}"
            );
            Ok(())
        }
        other => Err(format!(
            "{what}: expected InvalidArgument({argument}, {sqlstate}), got {other:?}"
        )),
    }
}

fn expect_sqlstate<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, Error>,
    sqlstate: &str,
) -> TestResult {
    match r {
        Err(e) if e.sqlstate() == Some(sqlstate) => Ok(()),
        Err(e) => Err(format!(
            "{what}: expected SQLSTATE {sqlstate}, got {:?}: {e}",
            e.sqlstate()
        )),
        Ok(v) => Err(format!(
            "{what}: expected SQLSTATE {sqlstate}, got Ok({v:?})"
        )),
    }
}

// ---------------------------------------------------------------------------------------
// The tests

async fn version_matches_the_extension() -> TestResult {
    let c = connect(DB).await?;
    let v: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'dedup'",
            &[],
        )
        .await
        .ctx("extversion")?
        .get(0);
    check!(
        v == dedup_client::VERSION,
        "extension {v}, crate {}",
        dedup_client::VERSION
    );
    Ok(())
}

async fn bad_input_tokio_postgres() -> TestResult {
    let mut c = connect(DB).await?;
    let long_job = "j".repeat(1025);
    let long_scope = "s".repeat(129);
    {
        let tx = c.transaction().await.ctx("begin")?;
        expect_invalid(
            "empty job id",
            dpg::claim(&tx, "", "bad").await,
            "job_id",
            "22023",
        )?;
        expect_invalid(
            "long job id",
            dpg::claim(&tx, &long_job, "bad").await,
            "job_id",
            "22001",
        )?;
        expect_invalid(
            "NUL job id",
            dpg::claim(&tx, "a\0b", "bad").await,
            "job_id",
            "22021",
        )?;
        expect_invalid(
            "empty scope",
            dpg::claim(&tx, "j", "").await,
            "scope",
            "22023",
        )?;
        expect_invalid(
            "long scope",
            dpg::claim(&tx, "j", &long_scope).await,
            "scope",
            "22001",
        )?;
        // Nothing was sent: the transaction is not aborted, and the longest id is fine.
        check!(
            dpg::claim(&tx, &long_job[..1024], "bad")
                .await
                .ctx("1024-byte id")?,
            "a 1024-byte job id was not claimed"
        );
        tx.rollback().await.ctx("rollback")?;
    }
    // The server's own errors come through with their SQLSTATE and hint.
    {
        let tx = c.transaction().await.ctx("begin")?;
        tx.batch_execute("SET TRANSACTION READ ONLY")
            .await
            .ctx("read only")?;
        let r = dpg::claim(&tx, "j", "bad").await;
        let e = r
            .as_ref()
            .err()
            .map(|e| (e.to_string(), e.hint().map(str::to_owned)));
        expect_sqlstate("claim in a read-only transaction", r, "25006")?;
        let (text, hint) = e.unwrap();
        check!(text.contains("read-only"), "message: {text}");
        check!(
            hint.is_some_and(|h| h.contains("READ WRITE")),
            "no hint in {text}"
        );
    }
    let calls = AtomicU32::new(0);
    let calls = &calls;
    let r = dpg::run_once(&mut c, "", "bad", &RunOptions::new(), |_tx| {
        Box::pin(async move {
            calls.fetch_add(1, Relaxed);
            Ok(())
        })
    })
    .await;
    expect_invalid("run_once with an empty job id", r, "job_id", "22023")?;
    check!(calls.load(Relaxed) == 0, "the effect ran for a bad job id");
    let zero = LeaseOptions::duration(Duration::ZERO);
    expect_invalid(
        "zero lease",
        dpg::lease(&c, "j", "bad", &zero).await,
        "duration",
        "22023",
    )?;
    let fp = LeaseOptions::default().fingerprint("");
    expect_invalid(
        "empty fingerprint",
        dpg::lease(&c, "j", "bad", &fp).await,
        "fingerprint",
        "22023",
    )?;
    expect_invalid(
        "long lease scope",
        dpg::lease(&c, "j", &long_scope, &LeaseOptions::default()).await,
        "scope",
        "22001",
    )?;
    let eight_days = LeaseOptions::duration(Duration::from_secs(8 * 86400));
    expect_sqlstate(
        "lease longer than the retention",
        dpg::lease(&c, "j", "bad", &eight_days).await,
        "22023",
    )?;
    Ok(())
}

async fn bad_input_sqlx() -> TestResult {
    let pool = pool_as(DB, "dedup-client-test", 2).await?;
    let long_job = "j".repeat(1025);
    let long_scope = "s".repeat(129);
    let mut tx = pool.begin().await.ctx("begin")?;
    expect_invalid(
        "empty job id",
        dsx::claim(&mut tx, "", "bad").await,
        "job_id",
        "22023",
    )?;
    expect_invalid(
        "long job id",
        dsx::claim(&mut tx, &long_job, "bad").await,
        "job_id",
        "22001",
    )?;
    expect_invalid(
        "NUL job id",
        dsx::claim(&mut tx, "a\0b", "bad").await,
        "job_id",
        "22021",
    )?;
    expect_invalid(
        "empty scope",
        dsx::claim(&mut tx, "j", "").await,
        "scope",
        "22023",
    )?;
    expect_invalid(
        "long scope",
        dsx::claim(&mut tx, "j", &long_scope).await,
        "scope",
        "22001",
    )?;
    check!(
        dsx::claim(&mut tx, &long_job[..1024], "bad-sqlx")
            .await
            .ctx("1024-byte id")?,
        "a 1024-byte job id was not claimed"
    );
    tx.rollback().await.ctx("rollback")?;
    let mut tx = pool.begin().await.ctx("begin")?;
    (&mut *tx)
        .execute("SET TRANSACTION READ ONLY")
        .await
        .ctx("read only")?;
    let r = dsx::claim(&mut tx, "j", "bad").await;
    let text = r
        .as_ref()
        .err()
        .map(|e| (e.to_string(), e.hint().map(str::to_owned)));
    expect_sqlstate("claim in a read-only transaction", r, "25006")?;
    let (text, hint) = text.unwrap();
    check!(text.contains("read-only"), "message: {text}");
    check!(
        hint.is_some_and(|h| h.contains("READ WRITE")),
        "no hint in {text}"
    );
    drop(tx);
    let r = dsx::run_once(&pool, &long_scope, "", &RunOptions::new(), |_tx| {
        Box::pin(async move { Ok(()) })
    })
    .await;
    expect_invalid("run_once with an empty scope", r, "scope", "22023")?;
    let zero = LeaseOptions::duration(Duration::ZERO);
    expect_invalid(
        "zero lease",
        dsx::lease(&pool, "j", "bad", &zero).await,
        "duration",
        "22023",
    )?;
    let eight_days = LeaseOptions::duration(Duration::from_secs(8 * 86400));
    expect_sqlstate(
        "lease longer than the retention",
        dsx::lease(&pool, "j", "bad", &eight_days).await,
        "22023",
    )?;
    Ok(())
}

async fn claim_tokio_postgres() -> TestResult {
    let mut c = connect(DB).await?;
    let scope = "claims-pg";
    let tx = c.transaction().await.ctx("begin")?;
    check!(
        dpg::claim(&tx, "c-1", scope).await.ctx("claim")?,
        "first claim not fresh"
    );
    check!(
        !dpg::claim(&tx, "c-1", scope).await.ctx("claim")?,
        "second claim in one transaction fresh"
    );
    tx.commit().await.ctx("commit")?;
    let tx = c.transaction().await.ctx("begin")?;
    check!(
        !dpg::claim(&tx, "c-1", scope).await.ctx("claim")?,
        "redelivered copy fresh"
    );
    check!(
        dpg::claim(&tx, "c-1", "claims-pg-other")
            .await
            .ctx("claim")?,
        "other scope not fresh"
    );
    check!(
        dpg::claim(&tx, "c-2", scope).await.ctx("claim")?,
        "c-2 not fresh"
    );
    tx.rollback().await.ctx("rollback")?;
    let tx = c.transaction().await.ctx("begin")?;
    check!(
        dpg::claim(&tx, "c-2", scope).await.ctx("claim")?,
        "a rolled-back claim stayed"
    );
    // bigint and text: 42 and "42" are one job, "042" another.
    check!(
        dpg::claim(&tx, 42i64, scope).await.ctx("claim 42")?,
        "42 not fresh"
    );
    check!(
        !dpg::claim(&tx, "42", scope).await.ctx("claim '42'")?,
        "'42' fresh after 42"
    );
    check!(
        dpg::claim(&tx, "042", scope).await.ctx("claim '042'")?,
        "'042' not fresh"
    );
    // uuid: the job of its canonical text.
    let u = uuid::Uuid::parse_str("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11").unwrap();
    check!(
        dpg::claim(&tx, u, scope).await.ctx("claim uuid")?,
        "uuid not fresh"
    );
    check!(
        !dpg::claim(&tx, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", scope)
            .await
            .ctx("claim text")?,
        "canonical text fresh after the uuid"
    );
    tx.commit().await.ctx("commit")?;
    // A savepoint rolled back releases its claim.
    let mut tx = c.transaction().await.ctx("begin")?;
    {
        let sp = tx.transaction().await.ctx("savepoint")?;
        check!(
            dpg::claim(&sp, "c-3", scope).await.ctx("claim")?,
            "c-3 not fresh in savepoint"
        );
        sp.rollback().await.ctx("rollback to savepoint")?;
    }
    check!(
        dpg::claim(&tx, "c-3", scope).await.ctx("claim")?,
        "claim kept after rollback to savepoint"
    );
    tx.commit().await.ctx("commit")?;
    // A concurrent copy waits for the holder, then gets false.
    let tx = c.transaction().await.ctx("begin")?;
    check!(
        dpg::claim(&tx, "c-4", scope).await.ctx("claim")?,
        "c-4 not fresh"
    );
    let copy = tokio::spawn(async move {
        let mut other = connect(DB).await?;
        let tx = other.transaction().await.ctx("begin")?;
        let fresh = dpg::claim(&tx, "c-4", scope).await.ctx("copy's claim")?;
        tx.commit().await.ctx("commit")?;
        Ok::<_, String>(fresh)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    check!(!copy.is_finished(), "the copy did not wait for the holder");
    tx.commit().await.ctx("commit")?;
    let fresh = tokio::time::timeout(Duration::from_secs(10), copy)
        .await
        .ctx("the copy still waits")?
        .ctx("join")??;
    check!(!fresh, "the copy got true after the holder committed");
    Ok(())
}

async fn claim_sqlx() -> TestResult {
    let pool = pool_as(DB, "dedup-client-test", 2).await?;
    let scope = "claims-sqlx";
    let mut tx = pool.begin().await.ctx("begin")?;
    check!(
        dsx::claim(&mut tx, "c-1", scope).await.ctx("claim")?,
        "first claim not fresh"
    );
    check!(
        !dsx::claim(&mut tx, "c-1", scope).await.ctx("claim")?,
        "second claim fresh"
    );
    tx.commit().await.ctx("commit")?;
    let mut tx = pool.begin().await.ctx("begin")?;
    check!(
        !dsx::claim(&mut tx, "c-1", scope).await.ctx("claim")?,
        "redelivered copy fresh"
    );
    check!(
        dsx::claim(&mut tx, "c-2", scope).await.ctx("claim")?,
        "c-2 not fresh"
    );
    tx.rollback().await.ctx("rollback")?;
    let mut tx = pool.begin().await.ctx("begin")?;
    check!(
        dsx::claim(&mut tx, "c-2", scope).await.ctx("claim")?,
        "a rolled-back claim stayed"
    );
    check!(
        dsx::claim(&mut tx, 42i64, scope).await.ctx("claim 42")?,
        "42 not fresh"
    );
    check!(
        !dsx::claim(&mut tx, "42", scope).await.ctx("claim '42'")?,
        "'42' fresh after 42"
    );
    let u = uuid::Uuid::parse_str("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11").unwrap();
    check!(
        dsx::claim(&mut tx, u, scope).await.ctx("claim uuid")?,
        "uuid not fresh"
    );
    check!(
        !dsx::claim(&mut tx, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", scope)
            .await
            .ctx("claim")?,
        "canonical text fresh after the uuid"
    );
    {
        let mut sp = sqlx::Acquire::begin(&mut tx).await.ctx("savepoint")?;
        check!(
            dsx::claim(&mut sp, "c-3", scope).await.ctx("claim")?,
            "c-3 not fresh in savepoint"
        );
        sp.rollback().await.ctx("rollback to savepoint")?;
    }
    check!(
        dsx::claim(&mut tx, "c-3", scope).await.ctx("claim")?,
        "claim kept after rollback to savepoint"
    );
    tx.commit().await.ctx("commit")?;
    Ok(())
}

/// The effect of the run_once tests: one row in `effects`, counted per call.
struct Effect {
    calls: AtomicU32,
}

async fn run_once_tokio_postgres() -> TestResult {
    let mut c = connect(DB).await?;
    let admin = connect(DB).await?;
    let scope = "run-once-pg";
    admin
        .batch_execute(
            "SELECT inject('pg-40001', '40001', 1);
             SELECT inject('pg-40P01', '40P01', 2);
             SELECT inject('pg-P0001', 'P0001', 1);
             SELECT inject('pg-exhaust', '40001', 10);
             SELECT inject('pg-commit', '40001', 1, 'commit');",
        )
        .await
        .ctx("injections")?;
    let retries = Arc::new(AtomicU32::new(0));
    let counted = retries.clone();
    let options = RunOptions::new()
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .on_retry(move |_, _| {
            counted.fetch_add(1, Relaxed);
        });
    async fn run(
        c: &mut Client,
        job: &str,
        scope: &str,
        options: &RunOptions,
        effect: &Effect,
    ) -> Result<Outcome<&'static str>, Error> {
        dpg::run_once(c, job, scope, options, |tx| {
            effect.calls.fetch_add(1, Relaxed);
            Box::pin(async move {
                tx.execute("INSERT INTO effects (job, via) VALUES ($1, 'pg')", &[&job])
                    .await?;
                Ok("done")
            })
        })
        .await
    }
    // 40001 once: retried, the effect ran twice, one row; the copy is a Duplicate.
    for (job, calls, retried) in [("pg-40001", 2, 1), ("pg-40P01", 3, 2), ("pg-commit", 2, 1)] {
        let e = Effect {
            calls: AtomicU32::new(0),
        };
        let before = retries.load(Relaxed);
        let out = run(&mut c, job, scope, &options, &e).await.ctx(job)?;
        check!(out == Outcome::Ran("done"), "{job}: {out:?}");
        check!(
            e.calls.load(Relaxed) == calls,
            "{job}: effect called {} times",
            e.calls.load(Relaxed)
        );
        check!(
            retries.load(Relaxed) - before == retried,
            "{job}: on_retry not called {retried} times"
        );
        check!(
            effects_of(&admin, job).await? == 1,
            "{job}: not one effect row"
        );
        let again = run(&mut c, job, scope, &options, &e).await.ctx(job)?;
        check!(again == Outcome::Duplicate, "{job} again: {again:?}");
        check!(
            e.calls.load(Relaxed) == calls,
            "{job}: the effect ran for the copy"
        );
    }
    // Another error is not retried, and leaves no claim: the next delivery does the job.
    let e = Effect {
        calls: AtomicU32::new(0),
    };
    let r = run(&mut c, "pg-P0001", scope, &options, &e).await;
    expect_sqlstate("P0001", r, "P0001")?;
    check!(e.calls.load(Relaxed) == 1, "P0001 was retried");
    check!(
        effects_of(&admin, "pg-P0001").await? == 0,
        "a failed effect left a row"
    );
    let out = run(&mut c, "pg-P0001", scope, &options, &e)
        .await
        .ctx("P0001 again")?;
    check!(
        out.ran(),
        "the redelivery of a failed job did not run: {out:?}"
    );
    // Retries are bounded: 40001 ten times, three attempts.
    let e = Effect {
        calls: AtomicU32::new(0),
    };
    let r = run(
        &mut c,
        "pg-exhaust",
        scope,
        &options.clone().max_attempts(3),
        &e,
    )
    .await;
    check!(
        r.as_ref().is_err_and(|e| e.is_retryable()),
        "exhausted: {r:?}"
    );
    check!(
        e.calls.load(Relaxed) == 3,
        "exhausted after {} attempts",
        e.calls.load(Relaxed)
    );
    check!(
        count(
            &admin,
            "SELECT count(*) FROM dedup.processed WHERE job_id = 'pg-exhaust'"
        )
        .await?
            == 0,
        "an exhausted job left a claim"
    );
    // The effect's own error: not retried, rolled back.
    let r: Result<Outcome<()>, Error> = dpg::run_once(&mut c, "pg-own", scope, &options, |tx| {
        Box::pin(async move {
            tx.execute(
                "INSERT INTO effects (job, via) VALUES ('pg-own', 'pg')",
                &[],
            )
            .await?;
            Err(Error::effect("the effect's own failure"))
        })
    })
    .await;
    check!(matches!(r, Err(Error::Effect(_))), "own error: {r:?}");
    check!(
        effects_of(&admin, "pg-own").await? == 0,
        "a failed effect left a row"
    );
    // REPEATABLE READ, two copies at once: the second waits for the first's claim, gets
    // 40001 (committed after its snapshot), and its retry finds the claim: Duplicate.
    let rr = options.clone().isolation(Isolation::RepeatableRead);
    let before = retries.load(Relaxed);
    let claimed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow = |name: &'static str| {
        let (rr, claimed) = (rr.clone(), claimed.clone());
        tokio::spawn(async move {
            let mut c = connect(DB).await?;
            let claimed = &claimed;
            dpg::run_once(&mut c, "pg-rr", scope, &rr, |tx| {
                Box::pin(async move {
                    claimed.store(true, Relaxed); // the claim is made: let the copy start
                    tx.execute(
                        "INSERT INTO effects (job, via) VALUES ('pg-rr', $1)",
                        &[&name],
                    )
                    .await?;
                    tx.execute("SELECT pg_sleep(0.3)", &[]).await?;
                    Ok(name)
                })
            })
            .await
            .ctx(name)
        })
    };
    let first = slow("first");
    let wait = Instant::now();
    while !claimed.load(Relaxed) {
        check!(
            wait.elapsed() < Duration::from_secs(10),
            "RR: the first copy did not claim"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = slow("second");
    let (a, b) = (first.await.ctx("join")??, second.await.ctx("join")??);
    check!(
        a == Outcome::Ran("first") && b == Outcome::Duplicate,
        "RR copies: {a:?}, {b:?}"
    );
    check!(
        effects_of(&admin, "pg-rr").await? == 1,
        "RR: not one effect row"
    );
    check!(
        retries.load(Relaxed) > before,
        "RR: the second copy was not retried"
    );
    Ok(())
}

async fn run_once_sqlx() -> TestResult {
    let pool = pool_as(DB, "dedup-client-test", 3).await?;
    let admin = connect(DB).await?;
    let scope = "run-once-sqlx";
    admin
        .batch_execute(
            "SELECT inject('sx-40001', '40001', 1);
             SELECT inject('sx-40P01', '40P01', 2);
             SELECT inject('sx-P0001', 'P0001', 1);
             SELECT inject('sx-exhaust', '40001', 10);
             SELECT inject('sx-commit', '40001', 1, 'commit');",
        )
        .await
        .ctx("injections")?;
    let options = RunOptions::new().backoff(Duration::from_millis(5), Duration::from_millis(50));
    async fn run(
        pool: &PgPool,
        job: &str,
        scope: &str,
        options: &RunOptions,
        effect: &Effect,
    ) -> Result<Outcome<u64>, Error> {
        dsx::run_once(pool, job, scope, options, |tx| {
            effect.calls.fetch_add(1, Relaxed);
            Box::pin(async move {
                let done = sqlx::query("INSERT INTO effects (job, via) VALUES ($1, 'sqlx')")
                    .bind(job)
                    .execute(&mut **tx)
                    .await?;
                Ok(done.rows_affected())
            })
        })
        .await
    }
    for (job, calls) in [("sx-40001", 2), ("sx-40P01", 3), ("sx-commit", 2)] {
        let e = Effect {
            calls: AtomicU32::new(0),
        };
        let out = run(&pool, job, scope, &options, &e).await.ctx(job)?;
        check!(out == Outcome::Ran(1), "{job}: {out:?}");
        check!(
            e.calls.load(Relaxed) == calls,
            "{job}: effect called {} times",
            e.calls.load(Relaxed)
        );
        check!(
            effects_of(&admin, job).await? == 1,
            "{job}: not one effect row"
        );
        let again = run(&pool, job, scope, &options, &e).await.ctx(job)?;
        check!(again == Outcome::Duplicate, "{job} again: {again:?}");
        check!(
            e.calls.load(Relaxed) == calls,
            "{job}: the effect ran for the copy"
        );
    }
    let e = Effect {
        calls: AtomicU32::new(0),
    };
    expect_sqlstate(
        "P0001",
        run(&pool, "sx-P0001", scope, &options, &e).await,
        "P0001",
    )?;
    check!(e.calls.load(Relaxed) == 1, "P0001 was retried");
    check!(
        effects_of(&admin, "sx-P0001").await? == 0,
        "a failed effect left a row"
    );
    check!(
        run(&pool, "sx-P0001", scope, &options, &e)
            .await
            .ctx("again")?
            .ran(),
        "redelivery did not run"
    );
    let e = Effect {
        calls: AtomicU32::new(0),
    };
    let r = run(
        &pool,
        "sx-exhaust",
        scope,
        &options.clone().max_attempts(3),
        &e,
    )
    .await;
    check!(
        r.as_ref().is_err_and(|e| e.is_retryable()),
        "exhausted: {r:?}"
    );
    check!(
        e.calls.load(Relaxed) == 3,
        "exhausted after {} attempts",
        e.calls.load(Relaxed)
    );
    check!(
        count(
            &admin,
            "SELECT count(*) FROM dedup.processed WHERE job_id = 'sx-exhaust'"
        )
        .await?
            == 0,
        "an exhausted job left a claim"
    );
    let r: Result<Outcome<()>, Error> = dsx::run_once(&pool, "sx-own", scope, &options, |tx| {
        Box::pin(async move {
            sqlx::query("INSERT INTO effects (job, via) VALUES ('sx-own', 'sqlx')")
                .execute(&mut **tx)
                .await?;
            Err(Error::effect("the effect's own failure"))
        })
    })
    .await;
    check!(matches!(r, Err(Error::Effect(_))), "own error: {r:?}");
    check!(
        effects_of(&admin, "sx-own").await? == 0,
        "a failed effect left a row"
    );
    Ok(())
}

/// The claim rows of `job` in `scope`.
async fn claims_of(c: &Client, job: &str, scope: &str) -> Result<i64, String> {
    c.query_one(
        "SELECT count(*) FROM dedup.processed WHERE job_id = $1 AND scope = $2",
        &[&job, &scope],
    )
    .await
    .ctx("count claims")
    .map(|row| row.get(0))
}

/// An effect that ignores a failed statement leaves the transaction aborted: its COMMIT
/// ends in ROLLBACK without an error from the driver. run_once must not report that as
/// done (the caller would acknowledge a job that left nothing behind).
async fn aborted_effect_tokio_postgres() -> TestResult {
    let mut c = connect(DB).await?;
    let admin = connect(DB).await?;
    let scope = "aborted-pg";
    let calls = AtomicU32::new(0);
    let calls = &calls;
    let r: Result<Outcome<()>, Error> =
        dpg::run_once(&mut c, "ab-1", scope, &RunOptions::new(), |tx| {
            Box::pin(async move {
                calls.fetch_add(1, Relaxed);
                tx.execute("INSERT INTO effects (job, via) VALUES ('ab-1', 'pg')", &[])
                    .await?;
                // A bug of the effect: the failed statement (23502) is swallowed.
                let _ = tx
                    .execute("INSERT INTO effects (job, via) VALUES (NULL, 'pg')", &[])
                    .await;
                Ok(())
            })
        })
        .await;
    let retryable = r.as_ref().is_err_and(Error::is_retryable);
    expect_sqlstate("an effect that swallowed an error", r, "25P02")?;
    check!(!retryable, "an aborted transaction counted as retryable");
    check!(calls.load(Relaxed) == 1, "the aborted effect was retried");
    check!(
        claims_of(&admin, "ab-1", scope).await? == 0,
        "a claim committed"
    );
    check!(
        effects_of(&admin, "ab-1").await? == 0,
        "an effect row committed"
    );
    // The transaction was rolled back: the client works, and the redelivery runs the effect.
    let out = dpg::run_once(&mut c, "ab-1", scope, &RunOptions::new(), |tx| {
        Box::pin(async move {
            calls.fetch_add(1, Relaxed);
            tx.execute("INSERT INTO effects (job, via) VALUES ('ab-1', 'pg')", &[])
                .await?;
            Ok(())
        })
    })
    .await
    .ctx("the redelivery")?;
    check!(out.ran(), "the redelivery did not run: {out:?}");
    check!(
        effects_of(&admin, "ab-1").await? == 1 && claims_of(&admin, "ab-1", scope).await? == 1,
        "the redelivery left no effect or no claim"
    );
    Ok(())
}

async fn aborted_effect_sqlx() -> TestResult {
    let pool = pool_as(DB, "dedup-client-test", 1).await?;
    let admin = connect(DB).await?;
    let scope = "aborted-sqlx";
    let calls = AtomicU32::new(0);
    let calls = &calls;
    let r: Result<Outcome<()>, Error> =
        dsx::run_once(&pool, "ab-sx", scope, &RunOptions::new(), |tx| {
            Box::pin(async move {
                calls.fetch_add(1, Relaxed);
                sqlx::query("INSERT INTO effects (job, via) VALUES ('ab-sx', 'sqlx')")
                    .execute(&mut **tx)
                    .await?;
                // A bug of the effect: the failed statement (23502) is swallowed.
                let _ = sqlx::query("INSERT INTO effects (job, via) VALUES (NULL, 'sqlx')")
                    .execute(&mut **tx)
                    .await;
                Ok(())
            })
        })
        .await;
    let retryable = r.as_ref().is_err_and(Error::is_retryable);
    expect_sqlstate("an effect that swallowed an error", r, "25P02")?;
    check!(!retryable, "an aborted transaction counted as retryable");
    check!(calls.load(Relaxed) == 1, "the aborted effect was retried");
    check!(
        claims_of(&admin, "ab-sx", scope).await? == 0,
        "a claim committed"
    );
    check!(
        effects_of(&admin, "ab-sx").await? == 0,
        "an effect row committed"
    );
    // The pool's only connection is usable again, and the redelivery runs the effect.
    let out = dsx::run_once(&pool, "ab-sx", scope, &RunOptions::new(), |tx| {
        Box::pin(async move {
            calls.fetch_add(1, Relaxed);
            sqlx::query("INSERT INTO effects (job, via) VALUES ('ab-sx', 'sqlx')")
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
    })
    .await
    .ctx("the redelivery")?;
    check!(out.ran(), "the redelivery did not run: {out:?}");
    check!(
        effects_of(&admin, "ab-sx").await? == 1 && claims_of(&admin, "ab-sx", scope).await? == 1,
        "the redelivery left no effect or no claim"
    );
    Ok(())
}

fn is_json_with(result: &Option<String>, needle: &str) -> bool {
    result.as_deref().is_some_and(|r| r.contains(needle))
}

async fn leases_tokio_postgres() -> TestResult {
    let c = connect(DB).await?;
    let other = connect(DB).await?;
    let scope = "leases-pg";
    let thirty = LeaseOptions::duration(Duration::from_secs(30));
    // acquired, busy for a second caller, done after complete with the stored result.
    let LeaseStatus::Acquired(l) = dpg::lease(&c, "l-1", scope, &thirty).await.ctx("lease")? else {
        return Err("l-1 not acquired".into());
    };
    check!(
        l.expires_at() > SystemTime::now() + Duration::from_secs(20),
        "expiry {:?}",
        l.expires_at()
    );
    check!(l.lease_id().len() == 36, "lease id {}", l.lease_id());
    let busy = dpg::lease(&other, "l-1", scope, &thirty)
        .await
        .ctx("lease")?;
    check!(
        matches!(busy, LeaseStatus::Busy { .. }),
        "second caller: {busy:?}"
    );
    dpg::complete(&c, l, Some(r#"{"charge": "ch_1"}"#))
        .await
        .ctx("complete")?;
    match dpg::lease(&other, "l-1", scope, &thirty)
        .await
        .ctx("lease")?
    {
        LeaseStatus::Done { result, .. } if is_json_with(&result, "ch_1") => {}
        s => return Err(format!("after complete: {s:?}")),
    }
    // released: the next caller acquires at once.
    let LeaseStatus::Acquired(l) = dpg::lease(&c, "l-2", scope, &thirty).await.ctx("lease")? else {
        return Err("l-2 not acquired".into());
    };
    let first_id = l.lease_id().to_owned();
    dpg::release(&c, l).await.ctx("release")?;
    match dpg::lease(&other, "l-2", scope, &thirty)
        .await
        .ctx("lease")?
    {
        LeaseStatus::Acquired(l) if l.lease_id() != first_id => {
            dpg::release(&other, l).await.ctx("release")?
        }
        s => return Err(format!("after release: {s:?}")),
    }
    // expired and taken over: the old holder's complete and extend are YD002.
    let short = LeaseOptions::duration(Duration::from_millis(700));
    let LeaseStatus::Acquired(mut old) = dpg::lease(&c, "l-3", scope, &short).await.ctx("lease")?
    else {
        return Err("l-3 not acquired".into());
    };
    tokio::time::sleep(Duration::from_millis(900)).await;
    let LeaseStatus::Acquired(new) = dpg::lease(&other, "l-3", scope, &thirty)
        .await
        .ctx("lease")?
    else {
        return Err("expired l-3 not taken over".into());
    };
    let r = dpg::extend(&c, &mut old, Some(Duration::from_secs(30))).await;
    check!(
        r.as_ref().is_err_and(Error::is_lease_lost),
        "extend after takeover: {r:?}"
    );
    let r = dpg::complete(&c, old, None).await;
    check!(
        r.as_ref().is_err_and(Error::is_lease_lost),
        "complete after takeover: {r:?}"
    );
    dpg::complete(&other, new, None)
        .await
        .ctx("new holder's complete")?;
    // extend moves the expiry.
    let LeaseStatus::Acquired(mut l) = dpg::lease(&c, "l-4", scope, &short).await.ctx("lease")?
    else {
        return Err("l-4 not acquired".into());
    };
    let until = dpg::extend(&c, &mut l, Some(Duration::from_secs(60)))
        .await
        .ctx("extend")?;
    check!(
        until > SystemTime::now() + Duration::from_secs(50) && l.expires_at() == until,
        "extended to {until:?}"
    );
    dpg::complete(&c, l, None).await.ctx("complete")?;
    // run_leased: runs and stores the result; the copy gets it without running.
    let calls = AtomicU32::new(0);
    let effect = |_: &dedup_client::Lease| {
        calls.fetch_add(1, Relaxed);
        async { Ok(Some(r#"{"n": 1}"#.to_owned())) }
    };
    let out = dpg::run_leased(&c, "l-5", scope, &thirty, effect)
        .await
        .ctx("run_leased")?;
    check!(
        matches!(&out, LeaseOutcome::Ran { result } if is_json_with(result, "\"n\"")),
        "l-5: {out:?}"
    );
    let out = dpg::run_leased(&other, "l-5", scope, &thirty, effect)
        .await
        .ctx("run_leased")?;
    check!(
        matches!(&out, LeaseOutcome::Done { result } if is_json_with(result, "\"n\"")),
        "l-5 again: {out:?}"
    );
    check!(
        calls.load(Relaxed) == 1,
        "the effect ran {} times",
        calls.load(Relaxed)
    );
    // a failed effect releases the lease: the next caller acquires at once.
    let r = dpg::run_leased(&c, "l-6", scope, &thirty, |_| async {
        Err(Error::effect("HTTP 503"))
    })
    .await;
    check!(matches!(r, Err(Error::Effect(_))), "failed effect: {r:?}");
    match dpg::lease(&other, "l-6", scope, &thirty)
        .await
        .ctx("lease")?
    {
        LeaseStatus::Acquired(l) => dpg::release(&other, l).await.ctx("release")?,
        s => return Err(format!("after a failed effect: {s:?}")),
    }
    // the heartbeat: a 1.5 s lease, an effect of 3 s; a second caller at 2.2 s finds it busy.
    let hb = LeaseOptions::duration(Duration::from_millis(1500));
    let slow = dpg::run_leased(&c, "l-7", scope, &hb, |_| async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok(None)
    });
    let probe = async {
        tokio::time::sleep(Duration::from_millis(2200)).await;
        dpg::lease(&other, "l-7", scope, &thirty).await
    };
    let (out, probe) = tokio::join!(slow, probe);
    check!(
        matches!(probe, Ok(LeaseStatus::Busy { .. })),
        "during the heartbeat: {probe:?}"
    );
    check!(
        matches!(out, Ok(LeaseOutcome::Ran { .. })),
        "slow effect: {out:?}"
    );
    // a bigint job id is leased as its text: the same job for try_claim.
    let LeaseStatus::Acquired(l) = dpg::lease(&c, 7i64, scope, &thirty).await.ctx("lease 7")?
    else {
        return Err("7 not acquired".into());
    };
    let mut c2 = connect(DB).await?;
    let tx = c2.transaction().await.ctx("begin")?;
    expect_sqlstate(
        "try_claim of a leased job",
        dpg::claim(&tx, "7", scope).await,
        "55000",
    )?;
    drop(tx);
    dpg::complete(&c, l, None).await.ctx("complete 7")?;
    let tx = c2.transaction().await.ctx("begin")?;
    check!(
        !dpg::claim(&tx, 7i64, scope).await.ctx("claim 7")?,
        "a completed lease is not a claim"
    );
    Ok(())
}

async fn leases_sqlx() -> TestResult {
    let pool = pool_as(DB, "dedup-client-test", 3).await?;
    let scope = "leases-sqlx";
    let thirty = LeaseOptions::duration(Duration::from_secs(30));
    let LeaseStatus::Acquired(l) = dsx::lease(&pool, "l-1", scope, &thirty)
        .await
        .ctx("lease")?
    else {
        return Err("l-1 not acquired".into());
    };
    let busy = dsx::lease(&pool, "l-1", scope, &thirty)
        .await
        .ctx("lease")?;
    check!(
        matches!(busy, LeaseStatus::Busy { .. }),
        "second caller: {busy:?}"
    );
    dsx::complete(&pool, l, Some(r#"{"charge": "ch_1"}"#))
        .await
        .ctx("complete")?;
    match dsx::lease(&pool, "l-1", scope, &thirty)
        .await
        .ctx("lease")?
    {
        LeaseStatus::Done { result, .. } if is_json_with(&result, "ch_1") => {}
        s => return Err(format!("after complete: {s:?}")),
    }
    let short = LeaseOptions::duration(Duration::from_millis(700));
    let LeaseStatus::Acquired(mut old) =
        dsx::lease(&pool, "l-3", scope, &short).await.ctx("lease")?
    else {
        return Err("l-3 not acquired".into());
    };
    tokio::time::sleep(Duration::from_millis(900)).await;
    let LeaseStatus::Acquired(new) = dsx::lease(&pool, "l-3", scope, &thirty)
        .await
        .ctx("lease")?
    else {
        return Err("expired l-3 not taken over".into());
    };
    let r = dsx::extend(&pool, &mut old, None).await;
    check!(
        r.as_ref().is_err_and(Error::is_lease_lost),
        "extend after takeover: {r:?}"
    );
    let r = dsx::complete(&pool, old, None).await;
    check!(
        r.as_ref().is_err_and(Error::is_lease_lost),
        "complete after takeover: {r:?}"
    );
    // complete in the transaction of a database write that goes with the effect.
    let mut tx = pool.begin().await.ctx("begin")?;
    sqlx::query("INSERT INTO effects (job, via) VALUES ('l-3', 'sqlx-lease')")
        .execute(&mut *tx)
        .await
        .ctx("insert")?;
    dsx::complete(&mut *tx, new, None)
        .await
        .ctx("complete in a transaction")?;
    tx.commit().await.ctx("commit")?;
    let calls = AtomicU32::new(0);
    let effect = |_: &dedup_client::Lease| {
        calls.fetch_add(1, Relaxed);
        async { Ok(Some(r#"{"n": 2}"#.to_owned())) }
    };
    let out = dsx::run_leased(&pool, "l-5", scope, &thirty, effect)
        .await
        .ctx("run_leased")?;
    check!(
        matches!(&out, LeaseOutcome::Ran { result } if is_json_with(result, "2")),
        "l-5: {out:?}"
    );
    let out = dsx::run_leased(&pool, "l-5", scope, &thirty, effect)
        .await
        .ctx("run_leased")?;
    check!(
        matches!(&out, LeaseOutcome::Done { result } if is_json_with(result, "2")),
        "l-5 again: {out:?}"
    );
    check!(
        calls.load(Relaxed) == 1,
        "the effect ran {} times",
        calls.load(Relaxed)
    );
    let r = dsx::run_leased(&pool, "l-6", scope, &thirty, |_| async {
        Err(Error::effect("HTTP 503"))
    })
    .await;
    check!(matches!(r, Err(Error::Effect(_))), "failed effect: {r:?}");
    match dsx::lease(&pool, "l-6", scope, &thirty)
        .await
        .ctx("lease")?
    {
        LeaseStatus::Acquired(l) => dsx::release(&pool, l).await.ctx("release")?,
        s => return Err(format!("after a failed effect: {s:?}")),
    }
    Ok(())
}

/// Locks the row of lease `job` in `scope` from `after` to `until` (both counted from the
/// call) in a transaction of its own; `true` if meanwhile a session named `app` waited for
/// a lock (the heartbeat's UPDATE).
async fn hold_lease_row(
    job: &str,
    scope: &str,
    app: &str,
    after: Duration,
    until: Duration,
) -> Result<bool, String> {
    let start = tokio::time::Instant::now();
    let mut locker = connect(DB).await?;
    let watcher = connect(DB).await?;
    tokio::time::sleep_until(start + after).await;
    let tx = locker.transaction().await.ctx("begin")?;
    let locked = tx
        .execute(
            "SELECT FROM dedup.processed WHERE job_id = $1 AND scope = $2 FOR UPDATE",
            &[&job, &scope],
        )
        .await
        .ctx("lock the lease's row")?;
    check!(locked == 1, "no row to lock for {job}");
    let mut waited = false;
    while tokio::time::Instant::now() < start + until {
        waited |= count_with(
            &watcher,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
            app,
        )
        .await?
            > 0;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.ctx("commit")?;
    Ok(waited)
}

async fn count_with(c: &Client, sql: &str, arg: &str) -> Result<i64, String> {
    c.query_one(sql, &[&arg])
        .await
        .ctx(sql)
        .map(|row| row.get(0))
}

/// run_leased's heartbeat against the server. `run(job, lease, work, finished)` calls
/// run_leased in `scope` on a connection named `app` whose lock_timeout is 100 ms, with a
/// lease of `lease` and an effect that sleeps `work`, then sets `finished`.
async fn heartbeat_scenarios<R, Fut>(app: &str, scope: &str, run: R) -> TestResult
where
    R: Fn(&'static str, Duration, Duration, Arc<AtomicBool>) -> Fut,
    Fut: Future<Output = Result<LeaseOutcome, Error>>,
{
    let ms = Duration::from_millis;
    let admin = connect(DB).await?;
    // A heartbeat that fails (55P03: another session holds the lease's row, the UPDATE gives
    // up after 100 ms) is tried again at the next tick, and the effect runs to its end. A
    // 3 s lease, ticks at 1 s, 2 s, 3 s; the row locked from 0.3 s to 1.6 s.
    let finished = Arc::new(AtomicBool::new(false));
    let (out, waited) = tokio::join!(
        run("hb-1", ms(3000), ms(3500), finished.clone()),
        hold_lease_row("hb-1", scope, app, ms(300), ms(1600))
    );
    check!(
        waited?,
        "hb-1: the heartbeat did not wait for the locked row"
    );
    check!(
        matches!(&out, Ok(LeaseOutcome::Ran { .. })),
        "hb-1: a heartbeat that failed once (55P03) ended run_leased: {out:?}"
    );
    check!(finished.load(Relaxed), "hb-1: the effect did not finish");
    check!(
        claims_of(&admin, "hb-1", scope).await? == 1,
        "hb-1: no claim row"
    );
    // A heartbeat that fails until the lease would expire: run_leased gives up then, not
    // before, with the heartbeat's error, and drops the effect. A 1.2 s lease, ticks at
    // 0.4 s, 0.8 s, 1.2 s; the row locked from 0.1 s to 2.2 s.
    let finished = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let ((out, took), waited) = tokio::join!(
        async {
            let out = run("hb-2", ms(1200), ms(3000), finished.clone()).await;
            (out, start.elapsed())
        },
        hold_lease_row("hb-2", scope, app, ms(100), ms(2200))
    );
    check!(
        waited?,
        "hb-2: the heartbeat did not wait for the locked row"
    );
    expect_sqlstate("hb-2: a heartbeat failing until the expiry", out, "55P03")?;
    check!(
        took >= ms(1150),
        "hb-2: gave up after {took:?}, before the 1.2 s lease would expire"
    );
    check!(
        !finished.load(Relaxed),
        "hb-2: the effect ran on after the heartbeat gave up"
    );
    // YD002 (another caller holds the job: a new lease_id stands for the takeover): give up
    // at the first tick (0.5 s of a 1.5 s lease).
    let finished = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let ((out, took), stolen) = tokio::join!(
        async {
            let out = run("hb-3", ms(1500), ms(3000), finished.clone()).await;
            (out, start.elapsed())
        },
        async {
            tokio::time::sleep(ms(200)).await;
            admin
                .execute(
                    "UPDATE dedup.processed SET lease_id = gen_random_uuid() \
                      WHERE job_id = 'hb-3' AND scope = $1",
                    &[&scope],
                )
                .await
                .ctx("take hb-3 over")
        }
    );
    check!(stolen? == 1, "hb-3: no lease to take over");
    check!(
        out.as_ref().is_err_and(Error::is_lease_lost),
        "hb-3: a lost lease: {out:?}"
    );
    check!(
        took < ms(1200),
        "hb-3: gave up on a lost lease after {took:?}"
    );
    check!(
        !finished.load(Relaxed),
        "hb-3: the effect ran on after the lease was lost"
    );
    Ok(())
}

async fn heartbeat_tokio_postgres() -> TestResult {
    let app = "dedup-heartbeat-pg";
    let scope = "heartbeat-pg";
    let c = connect_as(DB, app).await?;
    c.batch_execute("SET lock_timeout = '100ms'")
        .await
        .ctx("lock_timeout")?;
    let c = &c;
    heartbeat_scenarios(app, scope, |job, lease, work, finished| async move {
        let options = LeaseOptions::duration(lease);
        dpg::run_leased(c, job, scope, &options, |_| async move {
            tokio::time::sleep(work).await;
            finished.store(true, Relaxed);
            Ok(Some(r#"{"hb": true}"#.to_owned()))
        })
        .await
    })
    .await
}

async fn heartbeat_sqlx() -> TestResult {
    let app = "dedup-heartbeat-sqlx";
    let scope = "heartbeat-sqlx";
    let options = PgConnectOptions::new()
        .host(&host())
        .port(port())
        .username(&user())
        .database(DB)
        .application_name(app)
        .options([("lock_timeout", "100ms")]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .ctx("sqlx pool")?;
    let pool = &pool;
    heartbeat_scenarios(app, scope, |job, lease, work, finished| async move {
        let options = LeaseOptions::duration(lease);
        dsx::run_leased(pool, job, scope, &options, |_| async move {
            tokio::time::sleep(work).await;
            finished.store(true, Relaxed);
            Ok(Some(r#"{"hb": true}"#.to_owned()))
        })
        .await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// End to end: a table queue, every job sent twice, three worker processes, one killed.

const JOBS: i64 = 300;
const TASKS_PER_WORKER: u32 = 2;
const VISIBILITY_MS: i64 = 2000;

const QUEUE_SCHEMA: &str = r#"
CREATE TABLE jobs (job_id text PRIMARY KEY);
-- The queue: a message taken is hidden until visible_at, and acknowledged (acked_at) after
-- the job's transaction committed. A worker killed before that leaves it to come back.
CREATE TABLE messages (msg_id bigserial PRIMARY KEY, job_id text NOT NULL,
                       visible_at timestamptz NOT NULL DEFAULT '-infinity',
                       deliveries int NOT NULL DEFAULT 0, acked_at timestamptz);
-- The effect: no unique key, so that a duplicate shows.
CREATE TABLE receipts (id bigserial PRIMARY KEY, job_id text NOT NULL, worker text NOT NULL);
-- Faults, at random: serialization failures, deadlocks, plain errors.
CREATE FUNCTION chaos() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r float8 := random();
BEGIN
  IF r < 0.04 THEN RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
  ELSIF r < 0.06 THEN RAISE EXCEPTION 'injected' USING ERRCODE = '40P01';
  ELSIF r < 0.07 THEN RAISE EXCEPTION 'injected plain failure';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER chaos BEFORE INSERT ON receipts FOR EACH ROW EXECUTE FUNCTION chaos();
"#;

const ACK: &str = "UPDATE messages SET acked_at = clock_timestamp() WHERE msg_id = $1";
const PENDING: &str = "SELECT count(*) FROM messages WHERE acked_at IS NULL";
const TAKE: &str = "UPDATE messages SET visible_at = clock_timestamp() + make_interval(secs => $1::float8 / 1000.0),
        deliveries = deliveries + 1
  WHERE msg_id = (SELECT msg_id FROM messages
                  WHERE acked_at IS NULL AND visible_at <= clock_timestamp()
                  ORDER BY msg_id LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING msg_id, job_id";

#[derive(Default)]
struct Stats {
    ran: AtomicU64,
    duplicate: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
}

fn worker_options(stats: &Arc<Stats>) -> RunOptions {
    let stats = stats.clone();
    RunOptions::new()
        .max_attempts(5)
        .backoff(Duration::from_millis(2), Duration::from_millis(50))
        .on_retry(move |_, _| {
            stats.retried.fetch_add(1, Relaxed);
        })
}

fn record(stats: &Stats, outcome: &Result<Outcome<()>, Error>, me: &str, job: &str) {
    match outcome {
        Ok(Outcome::Ran(())) => stats.ran.fetch_add(1, Relaxed),
        Ok(Outcome::Duplicate) => stats.duplicate.fetch_add(1, Relaxed),
        Err(e) => {
            eprintln!("{me}: job {job} left unacknowledged: {e}");
            stats.failed.fetch_add(1, Relaxed)
        }
    };
}

/// One task of a tokio-postgres worker: its own connection.
async fn pg_task(db: String, me: String, stats: Arc<Stats>) -> Result<(), String> {
    let mut c = connect_as(&db, &me).await?;
    let options = worker_options(&stats);
    loop {
        let taken = c
            .query_opt(TAKE, &[&(VISIBILITY_MS as f64)])
            .await
            .ctx("take")?;
        let Some(msg) = taken else {
            if count(&c, PENDING).await? == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (msg_id, job): (i64, String) = (msg.get(0), msg.get(1));
        let (job_ref, me_ref) = (job.as_str(), me.as_str());
        let outcome = dpg::run_once(&mut c, job_ref, "e2e", &options, |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO receipts (job_id, worker) VALUES ($1, $2)",
                    &[&job_ref, &me_ref],
                )
                .await?;
                tx.execute("SELECT pg_sleep(0.004)", &[]).await?;
                Ok(())
            })
        })
        .await;
        record(&stats, &outcome, &me, &job);
        if outcome.is_ok() {
            // Acknowledge only after the COMMIT.
            c.execute(ACK, &[&msg_id]).await.ctx("ack")?;
        }
    }
}

/// One task of a sqlx worker, sharing its process's pool.
async fn sqlx_task(pool: PgPool, me: String, stats: Arc<Stats>) -> Result<(), String> {
    let options = worker_options(&stats);
    loop {
        let taken: Option<(i64, String)> = sqlx::query_as(TAKE)
            .bind(VISIBILITY_MS as f64)
            .fetch_optional(&pool)
            .await
            .ctx("take")?;
        let Some((msg_id, job)) = taken else {
            let left: i64 = sqlx::query_scalar(PENDING)
                .fetch_one(&pool)
                .await
                .ctx("count")?;
            if left == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (job_ref, me_ref) = (job.as_str(), me.as_str());
        let outcome = dsx::run_once(&pool, job_ref, "e2e", &options, |tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO receipts (job_id, worker) VALUES ($1, $2)")
                    .bind(job_ref)
                    .bind(me_ref)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query("SELECT pg_sleep(0.004)")
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            })
        })
        .await;
        record(&stats, &outcome, &me, &job);
        if outcome.is_ok() {
            sqlx::query(ACK)
                .bind(msg_id)
                .execute(&pool)
                .await
                .ctx("ack")?;
        }
    }
}

async fn worker(driver: &str, db: &str, me: &str, tasks: u32) -> Result<(), String> {
    let stats = Arc::new(Stats::default());
    let mut handles = Vec::new();
    let pool = if driver == "sqlx" {
        Some(pool_as(db, me, tasks).await?)
    } else {
        None
    };
    for t in 0..tasks {
        let name = format!("{me}.{t}");
        let stats = stats.clone();
        handles.push(match &pool {
            Some(pool) => tokio::spawn(sqlx_task(pool.clone(), name, stats)),
            None => tokio::spawn(pg_task(db.to_owned(), name, stats)),
        });
    }
    for h in handles {
        h.await.ctx("join")??;
    }
    println!(
        "stats {me} ran={} duplicate={} failed={} retried={}",
        stats.ran.load(Relaxed),
        stats.duplicate.load(Relaxed),
        stats.failed.load(Relaxed),
        stats.retried.load(Relaxed)
    );
    Ok(())
}

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn stat(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(0)
}

async fn end_to_end(driver: &str) -> TestResult {
    let db = format!("dedup_client_e2e_{driver}");
    fresh_database(&db, QUEUE_SCHEMA).await?;
    let c = connect(&db).await?;
    // Each job twice, the copy four messages after the first.
    c.execute(
        "INSERT INTO jobs SELECT format('job-%s', i) FROM generate_series(1, $1::bigint) i",
        &[&JOBS],
    )
    .await
    .ctx("jobs")?;
    c.execute(
        "INSERT INTO messages (job_id)
         SELECT format('job-%s', i) FROM generate_series(1, $1::bigint) i, generate_series(0, 1) copy
          ORDER BY i + 4 * copy, copy",
        &[&JOBS],
    )
    .await
    .ctx("messages")?;
    let exe = std::env::current_exe().ctx("current_exe")?;
    let mut workers = Workers(Vec::new());
    for w in 0..3 {
        workers.0.push(
            Command::new(&exe)
                .args([
                    "worker",
                    driver,
                    &db,
                    &format!("w{w}"),
                    &TASKS_PER_WORKER.to_string(),
                ])
                .stdout(Stdio::piped())
                .stderr(match std::env::var_os("DEDUP_TEST_LOGS") {
                    Some(dir) => std::fs::File::create(
                        std::path::Path::new(&dir).join(format!("{db}-w{w}.log")),
                    )
                    .map_or(Stdio::null(), Stdio::from),
                    None => Stdio::null(),
                })
                .spawn()
                .ctx("spawn a worker")?,
        );
    }
    // Kill w0 with SIGKILL once a quarter of the jobs are done.
    let start = Instant::now();
    loop {
        let done = count(&c, "SELECT count(*) FROM receipts").await?;
        if done >= JOBS / 4 {
            break;
        }
        check!(
            start.elapsed() < Duration::from_secs(60),
            "only {done} jobs done after 60 s"
        );
        for (w, child) in workers.0.iter_mut().enumerate() {
            if let Some(status) = child.try_wait().ctx("wait")? {
                return Err(format!("worker w{w} ended early: {status}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let busy = count(
        &c,
        "SELECT count(*) FROM pg_stat_activity WHERE (application_name = 'w0' OR application_name LIKE 'w0.%') AND state <> 'idle'",
    )
    .await?;
    workers.0[0].kill().ctx("SIGKILL w0")?;
    workers.0[0].wait().ctx("wait w0")?;
    let left_at_kill = count(&c, PENDING).await?;
    check!(left_at_kill > 0, "w0 was killed after the queue drained");
    // The survivors drain the queue (the killed worker's message comes back after the
    // visibility timeout).
    let mut lines = Vec::new();
    for child in workers.0.iter_mut().skip(1) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(status) = child.try_wait().ctx("wait")? {
                check!(status.success(), "a worker failed: {status}");
                break;
            }
            check!(Instant::now() < deadline, "the queue did not drain in 90 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut out = String::new();
        use std::io::Read;
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .ctx("stdout")?;
        lines.push(out.trim().to_owned());
    }
    let missing = count(
        &c,
        "SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT FROM receipts r WHERE r.job_id = j.job_id)",
    )
    .await?;
    let duplicates = count(
        &c,
        "SELECT count(*) FROM (SELECT job_id FROM receipts GROUP BY job_id HAVING count(*) > 1) d",
    )
    .await?;
    let receipts = count(&c, "SELECT count(*) FROM receipts").await?;
    let unacked = count(&c, PENDING).await?;
    let redelivered = count(&c, "SELECT count(*) FROM messages WHERE deliveries > 1").await?;
    let by_w0 = count(&c, "SELECT count(*) FROM receipts WHERE worker LIKE 'w0.%'").await?;
    let claims = count(
        &c,
        "SELECT count(*) FROM dedup.processed WHERE scope = 'e2e'",
    )
    .await?;
    let sum = |key| lines.iter().map(|l| stat(l, key)).sum::<u64>();
    println!(
        "# {driver}: {JOBS} jobs x 2 messages; w0 killed after {by_w0} receipts with {busy} \
         connection(s) busy and {left_at_kill} messages left; survivors: ran={} duplicate={} \
         failed={} retried={}; {redelivered} messages delivered more than once; {:.1} s",
        sum("ran"),
        sum("duplicate"),
        sum("failed"),
        sum("retried"),
        start.elapsed().as_secs_f64()
    );
    check!(
        missing == 0 && duplicates == 0 && receipts == JOBS,
        "{missing} jobs missing, {duplicates} jobs done more than once ({receipts} receipts for {JOBS} jobs)"
    );
    check!(unacked == 0, "{unacked} messages left");
    check!(claims == JOBS, "{claims} claims for {JOBS} jobs");
    check!(by_w0 > 0, "the killed worker had done nothing");
    check!(sum("duplicate") > 0, "the survivors skipped no duplicate");
    check!(
        sum("retried") > 0,
        "the survivors retried nothing (faults are injected)"
    );
    check!(
        redelivered > 0,
        "no message was delivered again (one was taken by the killed worker)"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------

async fn run_test<F: Future<Output = TestResult>>(
    name: &str,
    f: F,
    failed: &mut u32,
    passed: &mut u32,
) {
    let start = Instant::now();
    let r = match tokio::time::timeout(Duration::from_secs(180), f).await {
        Ok(r) => r,
        Err(_) => Err("timed out after 180 s".into()),
    };
    match r {
        Ok(()) => {
            *passed += 1;
            println!("ok - {name} ({:.1} s)", start.elapsed().as_secs_f64());
        }
        Err(why) => {
            *failed += 1;
            println!("not ok - {name}: {why}");
        }
    }
}

async fn suite(only: Option<&str>) -> ExitCode {
    if let Err(e) = fresh_database(DB, TEST_SCHEMA).await {
        println!("not ok - setup: {e}");
        return ExitCode::FAILURE;
    }
    let (mut failed, mut passed) = (0, 0);
    macro_rules! test {
        ($name:literal, $f:expr) => {
            if only.is_none_or(|o| $name.contains(o)) {
                run_test($name, $f, &mut failed, &mut passed).await;
            }
        };
    }
    test!(
        "version_matches_the_extension",
        version_matches_the_extension()
    );
    test!("bad_input_tokio_postgres", bad_input_tokio_postgres());
    test!("bad_input_sqlx", bad_input_sqlx());
    test!("claim_tokio_postgres", claim_tokio_postgres());
    test!("claim_sqlx", claim_sqlx());
    test!("run_once_tokio_postgres", run_once_tokio_postgres());
    test!("run_once_sqlx", run_once_sqlx());
    test!(
        "aborted_effect_tokio_postgres",
        aborted_effect_tokio_postgres()
    );
    test!("aborted_effect_sqlx", aborted_effect_sqlx());
    test!("leases_tokio_postgres", leases_tokio_postgres());
    test!("leases_sqlx", leases_sqlx());
    test!("heartbeat_tokio_postgres", heartbeat_tokio_postgres());
    test!("heartbeat_sqlx", heartbeat_sqlx());
    test!("end_to_end_tokio_postgres", end_to_end("tokio_postgres"));
    test!("end_to_end_sqlx", end_to_end("sqlx"));
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["suite"] => rt.block_on(suite(None)),
        ["suite", only] => rt.block_on(suite(Some(only))),
        ["worker", driver, db, me, tasks] => {
            let tasks = tasks.parse().unwrap_or(TASKS_PER_WORKER);
            match rt.block_on(worker(driver, db, me, tasks)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{me}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: e2e suite [NAME] | e2e worker tokio_postgres|sqlx DB NAME TASKS");
            ExitCode::from(2)
        }
    }
}
