//! dedup on a real Citus cluster: a coordinator and two workers on loopback ports,
//! dedup and Citus on each, claims made from every node over real connections.
//!
//! A custom harness like tests/integration.rs: one cluster for the whole suite, the tests
//! one after another (each its own tables and job ids), non-zero exit if any failed.
//! `scripts/test.sh` runs it on the major Citus is built for (scripts/citus.sh).
//! `cargo test -p dedup-pg-test --test citus -- NAME` runs the tests whose name contains NAME.
use anyhow::{bail, ensure, Context, Result};
use dedup_pg_test::citus::{CitusCluster, DB};
use dedup_pg_test::cluster;
use dedup_pg_test::experiment::redis_server::RedisServer;
use dedup_pg_test::experiment::report;
use dedup_pg_test::experiment::run::Experiment;
use dedup_pg_test::experiment::Config;
use dedup_pg_test::{connect, connect_when_up, sqlstate, Conn};
use futures_util::future::BoxFuture;
use rand::seq::SliceRandom;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The role the docs ("Scaling out with Citus") tell users to give their consumers: LOGIN
/// and the grants on dedup.processed listed there, plus its own effect tables.
const APP: &str = "app";
const APP_GRANTS: &str =
    "GRANT SELECT (scope, job_id, processed_at, fingerprint, result, lease_expires_at), \
           INSERT (scope, job_id, fingerprint, processed_at), UPDATE (result) \
        ON dedup.processed TO app";

/// The placements of dedup.processed's shards (citus_shards leaves out tables that belong
/// to an extension).
const PLACEMENTS: &str = "SELECT s.shardid, n.nodeport FROM pg_dist_shard AS s \
     JOIN pg_dist_placement AS p USING (shardid) JOIN pg_dist_node AS n USING (groupid) \
     WHERE s.logicalrelid = 'dedup.processed'::regclass";

type Cc = Arc<Mutex<CitusCluster>>;
type TestFn = fn(Cc) -> BoxFuture<'static, Result<()>>;

macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), |cc| Box::pin($name(cc)))),*]
    };
}

const TESTS: &[(&str, TestFn)] = tests![
    distribute_refuses_claims_it_cannot_move_and_keeps_the_others,
    generations_and_citus_exclude_each_other,
    thirty_two_connections_over_three_nodes_claim_each_id_once,
    claim_and_effect_commit_together_colocated_or_not,
    results_fingerprints_and_errors_through_citus,
    set_result_after_rolling_back_the_claim_is_refused,
    consumer_grant_is_what_its_own_claims_need,
    a_claim_whose_conflict_vanishes_is_an_error_not_false,
    killed_worker_backend_mid_transaction_leaves_neither,
    worker_stopped_immediately_around_commit_prepared,
    shard_move_while_claims_arrive,
    leases_across_nodes_and_pruning_of_every_shard,
    stats_per_node_and_for_the_cluster,
    batches_and_offsets_on_citus,
    experiment_with_consumers_on_every_node,
];

fn dsns(cc: &Cc) -> Vec<String> {
    cc.lock().unwrap().dsns()
}

async fn node(cc: &Cc, i: usize) -> Result<Conn> {
    let dsn = dsns(cc)[i].clone();
    connect(&dsn).await
}

async fn node_as(cc: &Cc, i: usize, user: &str) -> Result<Conn> {
    let dsn = format!("{} user={user}", dsns(cc)[i]);
    connect(&dsn).await
}

async fn one_bool(c: &Conn, sql: &str) -> Result<bool> {
    Ok(c.query_one(sql, &[])
        .await
        .with_context(|| sql.to_string())?
        .get(0))
}

async fn one_i64(c: &Conn, sql: &str) -> Result<i64> {
    Ok(c.query_one(sql, &[])
        .await
        .with_context(|| sql.to_string())?
        .get(0))
}

fn state_of<T: std::fmt::Debug>(r: Result<T, tokio_postgres::Error>, what: &str) -> Result<String> {
    match r {
        Ok(v) => bail!("{what}: expected an error, got {v:?}"),
        Err(e) => Ok(format!(
            "{} {}",
            sqlstate(&e).unwrap_or("-"),
            e.as_db_error().map(|d| d.message()).unwrap_or_default()
        )),
    }
}

/// Generations are not available on Citus (0.7.0): claims routed by Citus go to the
/// distributed dedup.processed and never look in a generation, so a copy of a job claimed
/// in one would be claimed again. `use_generations()` refuses in a database with the citus
/// extension, distributed yet or not (0A000), on the coordinator and on a worker, and
/// `distribute()` refuses a database that uses generations (55000), also one whose
/// `use_generations()` is still open (it waits for it). Claims go on.
async fn generations_and_citus_exclude_each_other(cc: Cc) -> Result<()> {
    for i in 0..2usize {
        let c = node(&cc, i).await?;
        let said = state_of(
            c.query("SELECT dedup.use_generations()", &[]).await,
            "use_generations() where dedup.processed is distributed",
        )?;
        ensure!(
            said.starts_with("0A000") && said.contains("not available on Citus"),
            "use_generations() on node {i} of a distributed claim table: {said}"
        );
        ensure!(
            one_i64(&c, "SELECT count(*) FROM dedup.generations").await? == 0,
            "dedup.generations on node {i} after the refusal"
        );
    }
    let coord = node(&cc, 0).await?;
    ensure!(
        one_bool(&coord, "SELECT dedup.try_claim('gen-refused', 'citus-gen')").await?,
        "a claim after the refusals"
    );
    ensure!(
        !one_bool(&coord, "SELECT dedup.try_claim('gen-refused', 'citus-gen')").await?,
        "its copy"
    );

    // A database with the citus extension whose claim table is not distributed yet: the
    // claims would go into generations, and then past them once it is.
    // One statement each: CREATE DATABASE runs in no transaction block.
    for db in ["gen_citus", "gen_first"] {
        coord
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await?;
    }
    let (citus_dsn, first_dsn) = {
        let g = cc.lock().unwrap();
        (
            g.coordinator.dsn("gen_citus"),
            g.coordinator.dsn("gen_first"),
        )
    };
    let c = connect(&citus_dsn).await?;
    c.batch_execute("CREATE EXTENSION citus; CREATE EXTENSION dedup")
        .await?;
    let said = state_of(
        c.query("SELECT dedup.use_generations()", &[]).await,
        "use_generations() with Citus created, the claim table not distributed",
    )?;
    ensure!(
        said.starts_with("0A000"),
        "use_generations() with Citus created, not distributed: {said}"
    );
    ensure!(
        one_i64(&c, "SELECT count(*) FROM dedup.generations").await? == 0,
        "dedup.generations after that refusal"
    );

    // Generations first, Citus after: distribute() refuses.
    let c = connect(&first_dsn).await?;
    c.batch_execute("CREATE EXTENSION dedup").await?;
    c.query("SELECT dedup.use_generations()", &[]).await?;
    c.batch_execute("CREATE EXTENSION citus").await?;
    let said = state_of(
        c.query("SELECT dedup.distribute()", &[]).await,
        "distribute() in a database that uses generations",
    )?;
    ensure!(
        said.starts_with("55000") && said.contains("uses generations"),
        "distribute() in a database that uses generations: {said}"
    );
    ensure!(
        one_i64(
            &c,
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'dedup.processed'::regclass"
        )
        .await?
            == 0,
        "dedup.processed distributed after the refusal"
    );
    drop(c);

    // The two at once: use_generations() open while the citus extension is created and
    // distribute() called. distribute() waits for it, then refuses.
    let race_dsn = cc.lock().unwrap().coordinator.dsn("gen_race");
    coord.batch_execute("CREATE DATABASE gen_race").await?;
    let a = connect(&race_dsn).await?;
    a.batch_execute("CREATE EXTENSION dedup").await?;
    let b = connect(&race_dsn).await?;
    b.batch_execute("BEGIN; SELECT dedup.use_generations()")
        .await?;
    a.batch_execute("CREATE EXTENSION citus").await?;
    let distributing = tokio::spawn(async move {
        let r = a.query("SELECT dedup.distribute()", &[]).await;
        state_of(r, "distribute() beside an open use_generations()")
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        !distributing.is_finished(),
        "distribute() did not wait for the open use_generations()"
    );
    b.batch_execute("COMMIT").await?;
    let said = distributing.await??;
    ensure!(
        said.starts_with("55000") && said.contains("uses generations"),
        "distribute() after use_generations() committed beside it: {said}"
    );
    drop(b);

    // distribute() in REPEATABLE READ: its snapshot predates the wait for the catalog's
    // lock, so it would not see a use_generations() that committed meanwhile: refused.
    let c = connect(&citus_dsn).await?;
    let said = state_of(
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT dedup.distribute()")
            .await,
        "distribute() in REPEATABLE READ",
    )?;
    ensure!(
        said.starts_with("55000") && said.contains("READ COMMITTED"),
        "distribute() in REPEATABLE READ: {said}"
    );
    drop(c);

    // use_generations() looks for the citus extension again once its INSERT holds the
    // catalog: one created while it waited for a lock on dedup.generations is seen.
    let recheck_dsn = cc.lock().unwrap().coordinator.dsn("gen_recheck");
    coord.batch_execute("CREATE DATABASE gen_recheck").await?;
    let x = connect(&recheck_dsn).await?;
    x.batch_execute("CREATE EXTENSION dedup").await?;
    x.batch_execute("BEGIN; LOCK TABLE dedup.generations IN SHARE MODE")
        .await?;
    let b = connect(&recheck_dsn).await?;
    let turning_on = tokio::spawn(async move {
        let r = b.query("SELECT dedup.use_generations()", &[]).await;
        state_of(
            r,
            "use_generations() past a citus extension created while it waited",
        )
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        !turning_on.is_finished(),
        "use_generations() did not wait for the lock on dedup.generations"
    );
    x.batch_execute("CREATE EXTENSION citus; COMMIT").await?;
    let said = turning_on.await??;
    ensure!(
        said.starts_with("0A000"),
        "use_generations() past a citus extension created while it waited: {said}"
    );
    drop(x);

    // A worker whose database turned generations on before the citus extension was created
    // there: distribute() on the coordinator refuses, naming it.
    let (coord_port, w_dsn, w_port, coord_w_dsn) = {
        let g = cc.lock().unwrap();
        (
            g.coordinator.port,
            g.workers[0].dsn("gen_worker"),
            g.workers[0].port,
            g.coordinator.dsn("gen_worker"),
        )
    };
    coord.batch_execute("CREATE DATABASE gen_worker").await?;
    let w1 = node(&cc, 1).await?;
    w1.batch_execute("CREATE DATABASE gen_worker").await?;
    let w = connect(&w_dsn).await?;
    w.batch_execute("CREATE EXTENSION dedup").await?;
    w.query("SELECT dedup.use_generations()", &[]).await?;
    w.batch_execute("CREATE EXTENSION citus").await?;
    let c = connect(&coord_w_dsn).await?;
    c.batch_execute("CREATE EXTENSION citus; CREATE EXTENSION dedup")
        .await?;
    c.query(
        &format!("SELECT pg_catalog.citus_set_coordinator_host('127.0.0.1', {coord_port})"),
        &[],
    )
    .await?;
    c.query(
        &format!("SELECT pg_catalog.citus_add_node('127.0.0.1', {w_port})"),
        &[],
    )
    .await?;
    let said = state_of(
        c.query("SELECT dedup.distribute()", &[]).await,
        "distribute() with a worker that uses generations",
    )?;
    ensure!(
        said.starts_with("55000") && said.contains("workers use generations"),
        "distribute() with a worker that uses generations: {said}"
    );
    drop(c);
    drop(w);
    w1.batch_execute("DROP DATABASE gen_worker WITH (FORCE)")
        .await?;
    for db in [
        "gen_citus",
        "gen_first",
        "gen_race",
        "gen_recheck",
        "gen_worker",
    ] {
        coord
            .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
            .await?;
    }
    Ok(())
}

/// Before distribution a claim on a worker lands in that worker's own table: distribute()
/// refuses to hide it. Claims on the coordinator move to the shards. Then the test tables.
async fn distribute_refuses_claims_it_cannot_move_and_keeps_the_others(cc: Cc) -> Result<()> {
    let coord = node(&cc, 0).await?;
    let w1 = node(&cc, 1).await?;
    coord
        .batch_execute(
            "BEGIN; SELECT dedup.try_claim('pre-1'); SELECT dedup.try_claim('pre-2'); COMMIT",
        )
        .await?;
    // Before distribution a worker refuses claims (they would stay on it, unseen by the
    // other nodes: two effects for one job, as on 0.5.0) ...
    let local = state_of(
        w1.query("SELECT dedup.try_claim('worker-local')", &[])
            .await,
        "a claim on a worker before distribution",
    )?;
    ensure!(
        local.starts_with("55000"),
        "claim on a worker before distribution: {local}"
    );
    let lease = state_of(
        w1.query("SELECT dedup.lease('worker-local')", &[]).await,
        "a lease on a worker before distribution",
    )?;
    ensure!(
        lease.starts_with("55000"),
        "lease on a worker before distribution: {lease}"
    );
    // ... but an older version took them: one is there, written as 0.5.0 did.
    w1.batch_execute(
        "INSERT INTO dedup.processed (scope, job_id) VALUES ('default', 'worker-local')",
    )
    .await?;
    let refused = state_of(
        coord.query("SELECT dedup.distribute()", &[]).await,
        "distribute with a worker's own claim",
    )?;
    ensure!(
        refused.starts_with("55000") && refused.contains("Citus cannot move"),
        "refusal: {refused}"
    );
    w1.batch_execute("DELETE FROM ONLY dedup.processed").await?;
    let on_worker = state_of(
        w1.query("SELECT dedup.distribute()", &[]).await,
        "distribute on a worker",
    )?;
    ensure!(
        on_worker.starts_with("55000") && on_worker.contains("worker"),
        "on a worker: {on_worker}"
    );
    coord.batch_execute("SELECT dedup.distribute()").await?;
    // Again: a NOTICE, nothing else.
    coord.batch_execute("SELECT dedup.distribute()").await?;
    let notices = coord.take_notices();
    ensure!(
        notices
            .iter()
            .any(|n| n.message().contains("already distributed")),
        "second call: {:?}",
        notices.iter().map(|n| n.message()).collect::<Vec<_>>()
    );
    let kinds: Vec<String> = coord
        .query(
            "SELECT logicalrelid::text || ':' || partmethod::text FROM pg_dist_partition \
              WHERE logicalrelid::text LIKE 'dedup.%' ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure!(
        kinds == ["dedup.processed:h", "dedup.scope_retention:n"],
        "distribution: {kinds:?}"
    );
    for i in 0..3 {
        let c = node(&cc, i).await?;
        let n = one_i64(
            &c,
            "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'pre-%'",
        )
        .await?;
        ensure!(
            n == 2,
            "node {i} sees {n} of the 2 claims made before distribution"
        );
        c.batch_execute("BEGIN").await?;
        ensure!(
            !one_bool(&c, "SELECT dedup.try_claim('pre-1')").await?,
            "node {i}: pre-1 claimed again"
        );
        c.batch_execute("COMMIT").await?;
    }
    // The coordinator's shell holds nothing of its own any more.
    let local = one_i64(
        &coord,
        "SET citus.enable_manual_changes_to_shards = on; \
         SELECT count(*) FROM ONLY dedup.processed",
    )
    .await
    .unwrap_or(0);
    ensure!(
        local == 0,
        "the coordinator's local table kept {local} rows"
    );

    // The tables of the other tests: effects colocated with the claims (text COLLATE "C"),
    // effects that are not (bigint key, their own colocation group), and the consumer role.
    for sql in [
        "CREATE TABLE effects_c (job_id text COLLATE \"C\" PRIMARY KEY, node int NOT NULL)".to_string(),
        "SELECT create_distributed_table('effects_c', 'job_id', colocate_with => 'dedup.processed')".to_string(),
        "CREATE TABLE effects_n (id bigint PRIMARY KEY, job_id text NOT NULL, node int NOT NULL)".to_string(),
        "SELECT create_distributed_table('effects_n', 'id', colocate_with => 'none')".to_string(),
        format!("CREATE ROLE {APP} LOGIN"),
        APP_GRANTS.to_string(),
        format!("GRANT SELECT, INSERT, DELETE ON effects_c, effects_n TO {APP}"),
    ] {
        coord.batch_execute(&sql).await.with_context(|| sql.clone())?;
    }
    Ok(())
}

/// 32 connections, spread over the coordinator and both workers, claim the same 2,000 ids
/// in shuffled orders, each claim with its effect in one transaction: one winner per id.
async fn thirty_two_connections_over_three_nodes_claim_each_id_once(cc: Cc) -> Result<()> {
    let dsns = dsns(&cc);
    let mut tasks = Vec::new();
    for i in 0..32usize {
        let dsn = format!("{} user={APP}", dsns[i % 3]);
        tasks.push(tokio::spawn(async move {
            let c = connect(&dsn).await?;
            let mut ids: Vec<u32> = (0..2000).collect();
            ids.shuffle(&mut rand::rng());
            let mut won = Vec::new();
            for id in ids {
                let job = format!("c32-{id}");
                c.batch_execute("BEGIN").await?;
                let got: bool = c
                    .query_one("SELECT dedup.try_claim($1)", &[&job])
                    .await?
                    .get(0);
                if got {
                    c.execute(
                        "INSERT INTO effects_c (job_id, node) VALUES ($1, $2)",
                        &[&job, &((i % 3) as i32)],
                    )
                    .await?;
                    won.push(job);
                }
                c.batch_execute("COMMIT").await?;
            }
            Ok::<_, anyhow::Error>(won)
        }));
    }
    let mut winners: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for job in t.await?? {
            *winners.entry(job).or_default() += 1;
        }
    }
    let twice = winners.values().filter(|n| **n > 1).count();
    ensure!(
        winners.len() == 2000 && twice == 0,
        "{} ids won, {twice} more than once",
        winners.len()
    );
    let coord = node(&cc, 0).await?;
    let effects = one_i64(
        &coord,
        "SELECT count(*) FROM effects_c WHERE job_id LIKE 'c32-%'",
    )
    .await?;
    let claims = one_i64(
        &coord,
        "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'c32-%'",
    )
    .await?;
    ensure!(
        effects == 2000 && claims == 2000,
        "effects {effects}, claims {claims}"
    );
    let by_node: Vec<i64> = coord
        .query(
            "SELECT count(*) FROM effects_c WHERE job_id LIKE 'c32-%' GROUP BY node ORDER BY node",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    println!("  effects won through coordinator, worker 1, worker 2: {by_node:?}");
    ensure!(by_node.len() == 3, "some node won nothing: {by_node:?}");
    Ok(())
}

/// ROLLBACK leaves neither claim nor effect, COMMIT both: on a colocated effect table (one
/// shard, one node) and on one that is not (Citus's two-phase commit), from each node.
async fn claim_and_effect_commit_together_colocated_or_not(cc: Cc) -> Result<()> {
    for i in 0..3usize {
        let c = node_as(&cc, i, APP).await?;
        for (k, table) in [(0, "effects_c"), (1, "effects_n")] {
            let insert = if k == 0 {
                "INSERT INTO effects_c (job_id, node) VALUES ($1, 0)".to_string()
            } else {
                format!(
                    "INSERT INTO effects_n (id, job_id, node) VALUES ({}, $1, 0)",
                    900_000 + i * 10
                )
            };
            let job = format!("tx-{i}-{table}");
            c.batch_execute("BEGIN").await?;
            ensure!(c
                .query_one("SELECT dedup.try_claim($1)", &[&job])
                .await?
                .get::<_, bool>(0));
            c.execute(insert.as_str(), &[&job]).await?;
            c.batch_execute("ROLLBACK").await?;
            let both = format!(
                "SELECT (SELECT count(*) FROM dedup.processed WHERE job_id = '{job}') * 10 + \
                        (SELECT count(*) FROM {table} WHERE job_id = '{job}')"
            );
            ensure!(
                one_i64(&c, &both).await? == 0,
                "node {i} {table}: something survived ROLLBACK"
            );
            c.batch_execute("BEGIN").await?;
            ensure!(c
                .query_one("SELECT dedup.try_claim($1)", &[&job])
                .await?
                .get::<_, bool>(0));
            c.execute(insert.as_str(), &[&job]).await?;
            c.batch_execute("COMMIT").await?;
            ensure!(
                one_i64(&c, &both).await? == 11,
                "node {i} {table}: claim and effect not both committed"
            );
            c.batch_execute("BEGIN").await?;
            ensure!(!c
                .query_one("SELECT dedup.try_claim($1)", &[&job])
                .await?
                .get::<_, bool>(0));
            c.batch_execute("COMMIT").await?;
        }
    }
    // The app role cannot forge a claim's time or delete one.
    let app = node_as(&cc, 0, APP).await?;
    let forged = state_of(
        app.execute(
            "UPDATE dedup.processed SET processed_at = now() - interval '1 year'",
            &[],
        )
        .await,
        "UPDATE processed_at as app",
    )?;
    ensure!(
        forged.starts_with("42501"),
        "forging processed_at: {forged}"
    );
    let deleted = state_of(
        app.execute("DELETE FROM dedup.processed", &[]).await,
        "DELETE as app",
    )?;
    ensure!(deleted.starts_with("42501"), "deleting claims: {deleted}");
    Ok(())
}

/// set_result and claim_result in the claim's transaction, fingerprints (YD001) and bad
/// input, through Citus and as the consumer role.
async fn results_fingerprints_and_errors_through_citus(cc: Cc) -> Result<()> {
    for i in 0..3usize {
        let c = node_as(&cc, i, APP).await?;
        let job = format!("res-{i}");
        c.batch_execute("BEGIN").await?;
        ensure!(c
            .query_one("SELECT dedup.try_claim($1, 'default', 'fp-a')", &[&job])
            .await?
            .get::<_, bool>(0));
        c.execute(
            "INSERT INTO effects_c (job_id, node) VALUES ($1, 0)",
            &[&job],
        )
        .await?;
        c.execute("SELECT dedup.set_result($1, '{\"n\": 7}')", &[&job])
            .await?;
        c.batch_execute("COMMIT").await?;
        let other = (i + 1) % 3;
        let d = node_as(&cc, other, APP).await?;
        d.batch_execute("BEGIN").await?;
        ensure!(!d
            .query_one("SELECT dedup.try_claim($1, 'default', 'fp-a')", &[&job])
            .await?
            .get::<_, bool>(0));
        let r: String = d
            .query_one("SELECT result::text FROM dedup.claim_result($1)", &[&job])
            .await?
            .get(0);
        ensure!(r == r#"{"n": 7}"#, "claim_result from node {other}: {r}");
        d.batch_execute("COMMIT").await?;
        let mismatch = state_of(
            d.query("SELECT dedup.try_claim($1, 'default', 'fp-b')", &[&job])
                .await,
            "another fingerprint",
        )?;
        ensure!(
            mismatch.starts_with("YD001"),
            "fingerprint mismatch: {mismatch}"
        );
        // set_result on a job this transaction did not claim.
        let not_here = state_of(
            d.query("SELECT dedup.set_result($1, '{}')", &[&job]).await,
            "set_result of another transaction's claim",
        )?;
        ensure!(
            !not_here.starts_with("XX"),
            "set_result not claimed here: {not_here}"
        );
        let empty = state_of(d.query("SELECT dedup.try_claim('')", &[]).await, "empty id")?;
        ensure!(empty.starts_with("22023"), "empty job id: {empty}");
    }
    Ok(())
}

/// A claim rolled back to a savepoint is not this transaction's any more: after another
/// transaction claimed the job and stored its result, set_result here is refused (55000)
/// and the other transaction's result stays. (Before the subtransaction callback, the
/// UPDATE went through and replaced it.)
async fn set_result_after_rolling_back_the_claim_is_refused(cc: Cc) -> Result<()> {
    let a = node_as(&cc, 0, APP).await?;
    let b = node_as(&cc, 1, APP).await?;
    a.batch_execute("BEGIN; SAVEPOINT s; SELECT dedup.try_claim('sp-1'); ROLLBACK TO SAVEPOINT s")
        .await?;
    b.batch_execute("BEGIN").await?;
    ensure!(
        one_bool(&b, "SELECT dedup.try_claim('sp-1')").await?,
        "b's claim"
    );
    b.batch_execute("SELECT dedup.set_result('sp-1', '{\"by\": \"b\"}'); COMMIT")
        .await?;
    let refused = state_of(
        a.query("SELECT dedup.set_result('sp-1', '{\"by\": \"a\"}')", &[])
            .await,
        "set_result of a claim rolled back to a savepoint",
    )?;
    a.batch_execute("ROLLBACK").await?;
    let kept: String = b
        .query_one("SELECT result->>'by' FROM dedup.claim_result('sp-1')", &[])
        .await?
        .get(0);
    ensure!(kept == "b", "the stored result is {kept:?}'s");
    ensure!(refused.starts_with("55000"), "refusal: {refused}");
    // A claim kept through RELEASE SAVEPOINT is still this transaction's.
    a.batch_execute(
        "BEGIN; SAVEPOINT s; SELECT dedup.try_claim('sp-2'); RELEASE SAVEPOINT s; \
         SELECT dedup.set_result('sp-2', '{}'); COMMIT",
    )
    .await
    .context("set_result after RELEASE SAVEPOINT")?;
    Ok(())
}

/// The consumer's grant (docs/citus.md, Grants) is the columns its own claims use, and no
/// more. As APP, on every node: a claim, a duplicate, `set_result` and `claim_result` work;
/// reading `lease_id` (by name, `*`, the whole row, or in a WHERE) is refused, so the lease
/// a superuser holds cannot be completed by APP, whose only way left is a guess (YD002);
/// inserting a lease that never ends, or a row with a result, is refused. And the grant is
/// not wider than the claim needs on `processed_at`: a role without `INSERT
/// (processed_at)` cannot claim, because the statement Citus sends to the shard names the
/// column's default. (With the grant of 0.6.0's docs, the first refusal failed: APP read
/// the lease id and completed the lease with a result of its own.)
async fn consumer_grant_is_what_its_own_claims_need(cc: Cc) -> Result<()> {
    let coord = node(&cc, 0).await?;
    // A lease the superuser holds, in a transaction of its own (as on Citus it must be).
    let row = coord
        .query_one(
            "SELECT status, lease_id FROM dedup.lease('hijack', 'default', interval '1 hour')",
            &[],
        )
        .await?;
    ensure!(row.get::<_, String>(0) == "acquired", "the holder's lease");
    let lease_id: uuid::Uuid = row.get::<_, Option<uuid::Uuid>>(1).context("a lease id")?;
    for i in 0..3usize {
        let app = node_as(&cc, i, APP).await?;
        let job = format!("grant-{i}");
        app.batch_execute("BEGIN").await?;
        ensure!(
            app.query_one("SELECT dedup.try_claim($1, 'default', 'fp-g')", &[&job])
                .await
                .with_context(|| format!("node {i}: a claim as {APP}"))?
                .get::<_, bool>(0),
            "node {i}: {job} not claimed"
        );
        app.execute("SELECT dedup.set_result($1, '{\"ok\": 1}')", &[&job])
            .await
            .with_context(|| format!("node {i}: set_result as {APP}"))?;
        app.batch_execute("COMMIT").await?;
        app.batch_execute("BEGIN").await?;
        ensure!(
            !app.query_one("SELECT dedup.try_claim($1, 'default', 'fp-g')", &[&job])
                .await
                .with_context(|| format!("node {i}: a duplicate as {APP}"))?
                .get::<_, bool>(0),
            "node {i}: {job} claimed twice"
        );
        let r: String = app
            .query_one("SELECT result::text FROM dedup.claim_result($1)", &[&job])
            .await
            .with_context(|| format!("node {i}: claim_result as {APP}"))?
            .get(0);
        ensure!(r == r#"{"ok": 1}"#, "node {i}: claim_result {r}");
        app.batch_execute("COMMIT").await?;
        for sql in [
            "SELECT lease_id FROM dedup.processed WHERE job_id = 'hijack'".to_string(),
            "SELECT * FROM dedup.processed LIMIT 1".to_string(),
            "SELECT p::text FROM dedup.processed AS p LIMIT 1".to_string(),
            "SELECT count(*) FROM dedup.processed WHERE lease_id IS NOT NULL".to_string(),
            format!(
                "INSERT INTO dedup.processed (scope, job_id, lease_id, lease_expires_at) \
                 VALUES ('default', 'never-ends-{i}', '00000000-0000-4000-8000-000000000001', 'infinity')"
            ),
            format!(
                "INSERT INTO dedup.processed (scope, job_id, lease_expires_at) \
                 VALUES ('default', 'never-ends-{i}', 'infinity')"
            ),
            format!(
                "INSERT INTO dedup.processed (scope, job_id, result) \
                 VALUES ('default', 'injected-{i}', '{{\"forged\": 1}}')"
            ),
            "UPDATE dedup.processed SET lease_expires_at = 'infinity' WHERE job_id = 'hijack'"
                .to_string(),
            // A claim stamped far ahead would never be pruned (row-level security).
            format!(
                "INSERT INTO dedup.processed (scope, job_id, processed_at) \
                 VALUES ('default', 'future-{i}', now() + interval '2 days')"
            ),
        ] {
            let refused = state_of(app.execute(sql.as_str(), &[]).await, &sql)?;
            ensure!(
                refused.starts_with("42501"),
                "node {i}, as {APP}: {sql}: {refused}"
            );
        }
        // Without the lease id, APP can only guess it.
        let guessed = state_of(
            app.execute(
                "SELECT dedup.complete('hijack', '00000000-0000-4000-8000-000000000002', '{\"forged\": 1}')",
                &[],
            )
            .await,
            "complete with a guessed lease id",
        )?;
        ensure!(
            guessed.starts_with("YD002"),
            "node {i}: a guessed lease id: {guessed}"
        );
    }
    // A stored result is its claimer's: APP's UPDATE (result), from any node, reaches only
    // the claims its own transaction made (row-level security on every shard), not another
    // role's, nor its own of an earlier transaction.
    coord
        .batch_execute(
            "BEGIN; SELECT dedup.try_claim('other-res'); \
             SELECT dedup.set_result('other-res', '{\"by\": \"owner\"}'); COMMIT",
        )
        .await?;
    for i in 0..3usize {
        let app = node_as(&cc, i, APP).await?;
        for job in ["other-res".to_string(), format!("grant-{i}")] {
            let n = app
                .execute(
                    "UPDATE dedup.processed SET result = '{\"forged\": 1}' WHERE job_id = $1",
                    &[&job],
                )
                .await
                .with_context(|| format!("node {i}: UPDATE of {job} as {APP}"))?;
            ensure!(n == 0, "node {i}: {APP} overwrote the result of {job}");
        }
        // Its own claim, in the same transaction: the UPDATE set_result makes.
        app.batch_execute("BEGIN").await?;
        let job = format!("own-{i}");
        app.query_one("SELECT dedup.try_claim($1)", &[&job]).await?;
        let n = app
            .execute(
                "UPDATE dedup.processed SET result = '{\"own\": 1}' WHERE job_id = $1",
                &[&job],
            )
            .await?;
        app.batch_execute("COMMIT").await?;
        ensure!(n == 1, "node {i}: {APP} updated {n} rows of its own claim");
    }
    let results: Vec<String> = coord
        .query(
            "SELECT job_id || '=' || result::text FROM dedup.processed \
              WHERE job_id IN ('other-res', 'grant-0', 'grant-1', 'grant-2') ORDER BY job_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure!(
        results
            == [
                r#"grant-0={"ok": 1}"#,
                r#"grant-1={"ok": 1}"#,
                r#"grant-2={"ok": 1}"#,
                r#"other-res={"by": "owner"}"#
            ],
        "stored results after {APP}'s UPDATEs: {results:?}"
    );

    // The holder's lease is untouched: it completes, and its result is the one stored.
    coord
        .execute(
            "SELECT dedup.complete('hijack', $1, '{\"by\": \"holder\"}')",
            &[&lease_id],
        )
        .await
        .context("the holder completes its lease")?;
    let by: String = coord
        .query_one(
            "SELECT result->>'by' FROM dedup.claim_result('hijack')",
            &[],
        )
        .await?
        .get(0);
    ensure!(by == "holder", "the stored result is {by:?}'s");
    let never = one_i64(
        &coord,
        "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'never-ends-%' OR job_id LIKE 'injected-%' OR job_id LIKE 'future-%'",
    )
    .await?;
    ensure!(never == 0, "{never} rows inserted by hand");

    // processed_at's default reaches the shard named: without INSERT (processed_at), no claim.
    const NARROW: &str = "app_no_time";
    coord
        .batch_execute(&format!("CREATE ROLE {NARROW} LOGIN"))
        .await?;
    // A statement of its own: Citus makes and changes roles over one connection per node,
    // which a transaction that also changed a distributed table cannot.
    coord
        .batch_execute(&format!(
            "GRANT SELECT (scope, job_id, processed_at, fingerprint, result, lease_expires_at),
                   INSERT (scope, job_id, fingerprint), UPDATE (result)
                ON dedup.processed TO {NARROW}"
        ))
        .await?;
    let narrow = async {
        let c = node_as(&cc, 0, NARROW).await?;
        c.batch_execute("BEGIN").await?;
        let r = c.query_one("SELECT dedup.try_claim('no-time')", &[]).await;
        c.batch_execute("ROLLBACK").await?;
        let refused = state_of(
            r.map(|row| row.get::<_, bool>(0)),
            "a claim without INSERT (processed_at)",
        )
        .context(
            "Citus did not send processed_at's default to the shard: INSERT (processed_at) is not \
                 needed; take it out of the grant (docs/citus.md, APP_GRANTS)",
        )?;
        ensure!(
            refused.starts_with("42501"),
            "a claim without INSERT (processed_at): {refused}"
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    coord
        .batch_execute(&format!("REVOKE ALL ON dedup.processed FROM {NARROW}"))
        .await?;
    coord.batch_execute(&format!("DROP ROLE {NARROW}")).await?;
    narrow
}

/// A claim whose INSERT meets a claim of the job that is gone again when the claim reads
/// it, every time it tries: before, `try_claim` returned false with no claim anywhere (a
/// lost job: the caller skips a job nobody did); now it raises 40001 and counts nothing,
/// and so does `try_claim_many`. Deterministic through two triggers on the job's shard
/// placement, on the worker holding it, each `SECURITY DEFINER` (APP may not delete):
/// BEFORE INSERT (for each row) inserts the same key first, in the routed INSERT's own
/// transaction, so that INSERT conflicts and does nothing; AFTER INSERT (for each
/// statement, which fires with no row inserted) deletes it again, so the INSPECT that
/// follows in the same transaction finds nothing. Both act at trigger depth 1 only: their
/// own INSERT and DELETE fire them too, one level down. From the coordinator (the statement
/// runs on the worker's backend) and from the worker holding the shard (local execution).
async fn a_claim_whose_conflict_vanishes_is_an_error_not_false(cc: Cc) -> Result<()> {
    const JOB: &str = "vanishing";
    const SCOPE: &str = "vanish";
    let coord = node(&cc, 0).await?;
    let row = coord
        .query_one(
            &format!(
                "{PLACEMENTS} AND s.shardid = get_shard_id_for_distribution_column('dedup.processed', $1::text)"
            ),
            &[&JOB],
        )
        .await?;
    let (shard, port): (i64, i32) = (row.get(0), row.get(1));
    let holder = cc
        .lock()
        .unwrap()
        .nodes()
        .position(|n| n.port as i32 == port)
        .context("the node holding the job's shard")?;
    let w = node(&cc, holder).await?;
    w.batch_execute(&format!(
        "SET citus.enable_ddl_propagation = off;
         SET citus.enable_manual_changes_to_shards = on;
         CREATE FUNCTION public.vanish_first() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
           SET search_path = pg_catalog, pg_temp SET citus.enable_manual_changes_to_shards = on AS $f$
         BEGIN
             IF pg_trigger_depth() = 1 AND NEW.job_id = '{JOB}' AND NEW.scope = '{SCOPE}' THEN
                 EXECUTE format('INSERT INTO %I.%I (scope, job_id) VALUES ($1, $2)', TG_TABLE_SCHEMA, TG_TABLE_NAME)
                   USING NEW.scope, NEW.job_id;
             END IF;
             RETURN NEW;
         END $f$;
         CREATE FUNCTION public.vanish_after() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
           SET search_path = pg_catalog, pg_temp SET citus.enable_manual_changes_to_shards = on AS $f$
         BEGIN
             IF pg_trigger_depth() = 1 THEN
                 EXECUTE format('DELETE FROM %I.%I WHERE job_id = $1 AND scope = $2', TG_TABLE_SCHEMA, TG_TABLE_NAME)
                   USING '{JOB}', '{SCOPE}';
             END IF;
             RETURN NULL;
         END $f$;
         CREATE TRIGGER vanish_first BEFORE INSERT ON dedup.processed_{shard}
           FOR EACH ROW EXECUTE FUNCTION public.vanish_first();
         CREATE TRIGGER vanish_after AFTER INSERT ON dedup.processed_{shard}
           FOR EACH STATEMENT EXECUTE FUNCTION public.vanish_after();"
    ))
    .await
    .context("the triggers on the job's shard placement")?;
    let checks = async {
        for (i, sql) in [
            (0, "SELECT dedup.try_claim($1::text, $2::text)::text"),
            (0, "SELECT dedup.try_claim_many(ARRAY[$1::text], $2::text)::text"),
            (holder, "SELECT dedup.try_claim($1::text, $2::text)::text"),
        ] {
            let app = node_as(&cc, i, APP).await?;
            app.batch_execute("BEGIN").await?;
            let r = app.query(sql, &[&JOB, &SCOPE]).await;
            let outcome = match r {
                Ok(rows) => {
                    let said: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
                    let there = one_i64(
                        &app,
                        &format!("SELECT count(*) FROM dedup.processed WHERE job_id = '{JOB}'"),
                    )
                    .await?;
                    app.batch_execute("ROLLBACK").await?;
                    bail!("node {i}: {sql} answered {said:?} with {there} claims of the job behind it")
                }
                Err(e) => e,
            };
            app.batch_execute("ROLLBACK").await?;
            let got = format!(
                "{} {}",
                sqlstate(&outcome).unwrap_or("-"),
                outcome.as_db_error().map(|d| d.message()).unwrap_or_default()
            );
            ensure!(
                got.starts_with("40001") && got.contains(JOB) && got.contains("nothing was claimed"),
                "node {i}: {sql}: {got}"
            );
        }
        // Nothing counted on any node: neither a claim nor a duplicate (before, a duplicate).
        let counted = one_i64(
            &coord,
            &format!(
                "SELECT coalesce(sum(claims + duplicates + busy), 0)::int8 FROM dedup.cluster_stats() \
                  WHERE scope = '{SCOPE}'"
            ),
        )
        .await?;
        ensure!(counted == 0, "{counted} outcomes counted in scope {SCOPE}");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    w.batch_execute(&format!(
        "DROP TRIGGER vanish_first ON dedup.processed_{shard};
         DROP TRIGGER vanish_after ON dedup.processed_{shard};
         DROP FUNCTION public.vanish_first();
         DROP FUNCTION public.vanish_after();"
    ))
    .await
    .context("dropping the triggers")?;
    checks?;
    // Without the triggers, the job is claimed as any other.
    let app = node_as(&cc, 0, APP).await?;
    app.batch_execute("BEGIN").await?;
    ensure!(
        one_bool(&app, &format!("SELECT dedup.try_claim('{JOB}', '{SCOPE}')")).await?,
        "{JOB} not claimed once the triggers are gone"
    );
    app.batch_execute("ROLLBACK").await?;
    Ok(())
}

/// The backends of a worker killed with SIGKILL while a transaction that claimed a job
/// there (with its effect) is open: after the worker's crash recovery, neither survives,
/// and the job can be claimed again.
async fn killed_worker_backend_mid_transaction_leaves_neither(cc: Cc) -> Result<()> {
    let coord = node(&cc, 0).await?;
    // A job whose shard is on worker 1.
    let w1_port = cc.lock().unwrap().workers[0].port as i32;
    let job: String = coord
        .query_one(
            "SELECT j FROM generate_series(1, 1000) AS g, LATERAL (SELECT 'kill-' || g AS j) AS x \
              WHERE (SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) \
                      WHERE p.shardid = get_shard_id_for_distribution_column('dedup.processed', j)) = $1 \
              LIMIT 1",
            &[&w1_port],
        )
        .await?
        .get(0);
    let app = node_as(&cc, 0, APP).await?;
    app.batch_execute("BEGIN").await?;
    ensure!(app
        .query_one("SELECT dedup.try_claim($1)", &[&job])
        .await?
        .get::<_, bool>(0));
    app.execute(
        "INSERT INTO effects_c (job_id, node) VALUES ($1, 0)",
        &[&job],
    )
    .await?;
    // SIGKILL every backend on worker 1 that is inside a transaction (ours among them).
    let w1 = node(&cc, 1).await?;
    let pids: Vec<i32> = w1
        .query(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' \
               AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure!(!pids.is_empty(), "no open transaction on worker 1");
    for pid in &pids {
        // SAFETY: a plain kill(2) of a server process of ours.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let committed = app.batch_execute("COMMIT").await;
    ensure!(
        committed.is_err(),
        "COMMIT succeeded after its worker backend was killed"
    );
    let w1 = connect_when_up(&dsns(&cc)[1]).await?;
    drop(w1);
    let coord = connect_when_up(&dsns(&cc)[0]).await?;
    // The coordinator's connections to the restarted worker come back.
    let deadline = Instant::now() + Duration::from_secs(60);
    let both = format!(
        "SELECT (SELECT count(*) FROM dedup.processed WHERE job_id = '{job}') * 10 + \
                (SELECT count(*) FROM effects_c WHERE job_id = '{job}')"
    );
    let n = loop {
        match one_i64(&coord, &both).await {
            Ok(n) => break n,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => return Err(e),
        }
    };
    ensure!(n == 0, "after the kill: claims*10 + effects = {n}");
    coord.batch_execute("BEGIN").await?;
    ensure!(
        one_bool(&coord, &format!("SELECT dedup.try_claim('{job}')")).await?,
        "reclaim after kill"
    );
    coord.batch_execute("COMMIT").await?;
    Ok(())
}

/// Transactions whose claim and effect are on different workers (two-phase commit) run
/// while worker 2 is stopped with `-m immediate`, some before their PREPARE, some between
/// PREPARE and COMMIT PREPARED, some during it. After the restart and Citus's recovery of
/// prepared transactions: every job has its claim and its effect, or neither; every COMMIT
/// the client saw succeed has both.
async fn worker_stopped_immediately_around_commit_prepared(cc: Cc) -> Result<()> {
    let dsns = dsns(&cc);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..8i64 {
        let dsn = dsns[0].clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(c) = connect(&dsn).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let job = format!("2pc-{t}-{n}");
                    let id = 1_000_000 * (t + 1) + n;
                    let r = async {
                        c.batch_execute("BEGIN").await?;
                        let got: bool = c
                            .query_one("SELECT dedup.try_claim($1)", &[&job])
                            .await?
                            .get(0);
                        if got {
                            c.execute(
                                "INSERT INTO effects_n (id, job_id, node) VALUES ($1, $2, 0)",
                                &[&id, &job],
                            )
                            .await?;
                        }
                        c.batch_execute("COMMIT").await?;
                        Ok::<_, tokio_postgres::Error>(got)
                    }
                    .await;
                    match r {
                        Ok(true) => committed.push(job),
                        Ok(false) => {}
                        Err(_) => break,
                    }
                }
            }
            committed
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    {
        let mut g = cc.lock().unwrap();
        g.workers[1].stop("immediate")?;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    {
        let mut g = cc.lock().unwrap();
        g.workers[1].start_again()?;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut committed = Vec::new();
    for t in tasks {
        committed.extend(t.await?);
    }
    let coord = connect_when_up(&dsns[0]).await?;
    // Citus's maintenance daemon recovers every second here; ask once more to be sure.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = coord
            .query_one("SELECT recover_prepared_transactions()", &[])
            .await;
        let pending = one_i64(
            &coord,
            "SELECT sum(result::int8)::int8 FROM run_command_on_workers('SELECT count(*) FROM pg_prepared_xacts')",
        )
        .await
        .unwrap_or(1);
        if r.is_ok() && pending == 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "prepared transactions never recovered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rows = coord
        .query(
            "SELECT coalesce(p.job_id, e.job_id), p.job_id IS NOT NULL, e.job_id IS NOT NULL \
               FROM (SELECT job_id FROM dedup.processed WHERE job_id LIKE '2pc-%') AS p \
               FULL JOIN (SELECT job_id FROM effects_n WHERE job_id LIKE '2pc-%') AS e USING (job_id)",
            &[],
        )
        .await?;
    let mut halves = Vec::new();
    let mut present = std::collections::HashSet::new();
    for r in &rows {
        let (job, claim, effect): (String, bool, bool) = (r.get(0), r.get(1), r.get(2));
        if claim != effect {
            halves.push(job.clone());
        }
        present.insert(job);
    }
    let lost: Vec<_> = committed.iter().filter(|j| !present.contains(*j)).collect();
    println!(
        "  {} transactions committed, {} jobs with claim and effect, {} half-done, {} committed but missing",
        committed.len(),
        rows.len(),
        halves.len(),
        lost.len()
    );
    ensure!(
        committed.len() > 50,
        "too few transactions ran: {}",
        committed.len()
    );
    ensure!(
        halves.is_empty(),
        "claim without effect or effect without claim: {halves:?}"
    );
    ensure!(lost.is_empty(), "committed but missing: {lost:?}");
    Ok(())
}

/// Shards of dedup.processed (with their colocated effects) move to the other worker while
/// 8 connections keep claiming, new ids and ids already claimed: no claim is lost, no id
/// is won twice.
async fn shard_move_while_claims_arrive(cc: Cc) -> Result<()> {
    let dsns = dsns(&cc);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let dsn = format!("{} user={APP}", dsns[t % 3]);
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let c = connect(&dsn).await?;
            let mut won = Vec::new();
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                // Each id is tried by two tasks (t and t ^ 1).
                let job = format!("move-{}-{k}", t / 2);
                c.batch_execute("BEGIN").await?;
                let got: bool = c
                    .query_one("SELECT dedup.try_claim($1)", &[&job])
                    .await?
                    .get(0);
                if got {
                    c.execute(
                        "INSERT INTO effects_c (job_id, node) VALUES ($1, 0)",
                        &[&job],
                    )
                    .await?;
                    won.push(job);
                }
                c.batch_execute("COMMIT").await?;
            }
            Ok::<_, anyhow::Error>(won)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let coord = node(&cc, 0).await?;
    let (w1, w2) = {
        let g = cc.lock().unwrap();
        (g.workers[0].port as i32, g.workers[1].port as i32)
    };
    let shards: Vec<i64> = coord
        .query(
            &format!("{PLACEMENTS} AND n.nodeport = $1 ORDER BY s.shardid LIMIT 2"),
            &[&w1],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure!(!shards.is_empty(), "no shard on worker 1");
    for s in &shards {
        coord
            .execute(
                "SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3, shard_transfer_mode => 'force_logical')",
                &[s, &w1, &w2],
            )
            .await
            .with_context(|| format!("moving shard {s}"))?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut winners: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for job in t.await?? {
            *winners.entry(job).or_default() += 1;
        }
    }
    let twice: Vec<_> = winners
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(j, _)| j.clone())
        .collect();
    let claims = one_i64(
        &coord,
        "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'move-%'",
    )
    .await?;
    let effects = one_i64(
        &coord,
        "SELECT count(*) FROM effects_c WHERE job_id LIKE 'move-%'",
    )
    .await?;
    let moved =
        one_i64(
            &coord,
            &format!(
            "SELECT count(*) FROM ({PLACEMENTS}) AS x WHERE shardid IN ({}) AND nodeport = {w2}",
            shards.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")
        ),
        )
        .await?;
    println!(
        "  moved {moved} shard(s) while {} jobs were won; {claims} claims, {effects} effects",
        winners.len()
    );
    ensure!(moved == shards.len() as i64, "the shards did not move");
    ensure!(twice.is_empty(), "won twice: {twice:?}");
    ensure!(
        claims == winners.len() as i64 && effects == claims,
        "claims {claims}, effects {effects}, winners {}",
        winners.len()
    );
    Ok(())
}

/// 200 claims `<prefix>-N` of the scope 'old' (a 1-hour retention), aged by hand past it:
/// the background workers (`who`) must prune them from every shard within 60 s.
async fn aged_claims_are_pruned(coord: &Conn, prefix: &str, who: &str) -> Result<()> {
    coord
        .batch_execute(&format!(
            "BEGIN; SELECT dedup.try_claim('{prefix}-' || g, 'old') FROM generate_series(1, 200) g; COMMIT;
             UPDATE dedup.processed SET processed_at = now() - interval '2 hours' WHERE job_id LIKE '{prefix}-%';"
        ))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = one_i64(
            coord,
            &format!("SELECT count(*) FROM dedup.processed WHERE job_id LIKE '{prefix}-%'"),
        )
        .await?;
        if n == 0 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{who} left {n} expired claims");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A lease taken on the coordinator expires and is taken over on a worker, once; the
/// take-over completes. Then expired claims, on shards of both workers, are pruned by
/// dedup.prune() on each node and by each node's worker; running leases stay.
async fn leases_across_nodes_and_pruning_of_every_shard(cc: Cc) -> Result<()> {
    let coord = node(&cc, 0).await?;
    let w1 = node(&cc, 1).await?;
    let w2 = node(&cc, 2).await?;
    let first = coord
        .query_one(
            "SELECT status, lease_id FROM dedup.lease('lease-1', 'default', interval '3 seconds')",
            &[],
        )
        .await?;
    ensure!(first.get::<_, String>(0) == "acquired", "first lease");
    let busy: String = w1
        .query_one("SELECT status FROM dedup.lease('lease-1')", &[])
        .await?
        .get(0);
    ensure!(busy == "busy", "second holder while the lease runs: {busy}");
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let mut takers = Vec::new();
    for c in [&w1, &w2] {
        let r = c
            .query_one("SELECT status, lease_id FROM dedup.lease('lease-1')", &[])
            .await?;
        takers.push((r.get::<_, String>(0), r.get::<_, Option<uuid::Uuid>>(1)));
    }
    let acquired: Vec<_> = takers.iter().filter(|(s, _)| s == "acquired").collect();
    ensure!(acquired.len() == 1, "take-overs after expiry: {takers:?}");
    let lease_id = acquired[0].1.expect("a lease id");
    w2.execute(
        "SELECT dedup.complete('lease-1', $1, '{\"ok\": true}')",
        &[&lease_id],
    )
    .await?;
    let done: String = coord
        .query_one("SELECT status FROM dedup.lease('lease-1')", &[])
        .await?
        .get(0);
    ensure!(done == "done", "after complete: {done}");

    // Old claims on every shard of a scope with a 1-hour retention; one running lease.
    coord
        .batch_execute(
            "SELECT dedup.set_retention('old', interval '1 hour');
             BEGIN; SELECT dedup.try_claim('old-' || g, 'old') FROM generate_series(1, 400) g; COMMIT;
             SELECT dedup.lease('old-lease', 'old', interval '30 minutes');",
        )
        .await?;
    let retention: String = w2
        .query_one("SELECT dedup.retention('old')::text", &[])
        .await?
        .get(0);
    ensure!(
        retention == "01:00:00",
        "retention seen on worker 2: {retention}"
    );
    let placements = one_i64(
        &coord,
        &format!("SELECT count(DISTINCT nodeport) FROM ({PLACEMENTS}) AS x"),
    )
    .await?;
    ensure!(placements == 2, "shards on {placements} nodes");
    // Each worker's background pass (every 2 s here) would prune the aged claims too. A
    // transaction on each worker takes the prune lock first (a dedup.prune() that finds
    // nothing expired yet; it waits for a pass in progress) and holds it, so no pass
    // starts until that transaction's own dedup.prune() below has counted what it deleted.
    for (i, c) in [&w1, &w2].into_iter().enumerate() {
        c.batch_execute("BEGIN").await?;
        let n = one_i64(c, "SELECT dedup.prune('old')").await?;
        ensure!(
            n == 0,
            "worker {} pruned {n} claims that had not expired",
            i + 1
        );
    }
    coord
        .batch_execute(
            "UPDATE dedup.processed SET processed_at = now() - interval '2 hours' WHERE scope = 'old'",
        )
        .await?;
    // dedup.prune() on each node deletes what that node's shards hold, bounded per batch.
    let mut deleted = 0;
    for (i, c) in [&coord, &w1, &w2].into_iter().enumerate() {
        let n = one_i64(c, "SELECT dedup.prune('old')").await?;
        println!("  dedup.prune('old') on node {i}: {n}");
        if i == 0 {
            ensure!(n == 0, "the coordinator holds no shard, pruned {n}");
        } else {
            ensure!(n > 0, "worker {i} pruned nothing");
            c.batch_execute("COMMIT").await?;
        }
        deleted += n;
    }
    ensure!(deleted == 400, "pruned {deleted} of 400");
    let left: Vec<String> = coord
        .query(
            "SELECT job_id FROM dedup.processed WHERE scope = 'old'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure!(left == ["old-lease"], "left after the prune: {left:?}");

    // The background workers: claims aged by hand disappear from both workers' shards.
    aged_claims_are_pruned(&coord, "bg", "the workers").await?;
    for (i, c) in [&w1, &w2].into_iter().enumerate() {
        let by: String = c
            .query_one(
                "SELECT coalesce(max(pruned_by), '') FROM dedup.prune_status",
                &[],
            )
            .await?
            .get(0);
        ensure!(!by.is_empty(), "worker {} recorded no pass", i + 1);
    }
    let still = one_i64(
        &coord,
        "SELECT count(*) FROM dedup.processed WHERE job_id = 'old-lease'",
    )
    .await?;
    ensure!(still == 1, "the running lease was pruned");

    // Again with a dedup.prune_role that is not a superuser, holding the grants of the docs
    // (docs/reference/settings.md): the row-level security dedup.distribute() put on every
    // shard lets a role that may DELETE claims lock them first, as a pass does.
    const PRUNER: &str = "citus_pruner";
    const LOCAL_GRANTS: &str = "SELECT, INSERT, UPDATE ON dedup._prune_status TO citus_pruner; \
         GRANT SELECT, DELETE ON dedup.forgotten TO citus_pruner; \
         GRANT SELECT, INSERT, DELETE ON dedup._horizons TO citus_pruner; \
         GRANT EXECUTE ON FUNCTION dedup._mark_horizon(float8), dedup._horizon(timestamptz) \
               TO citus_pruner";
    coord
        .batch_execute(&format!("CREATE ROLE {PRUNER} LOGIN"))
        .await?;
    coord
        .batch_execute(&format!(
            "GRANT SELECT, UPDATE, DELETE ON dedup.processed TO {PRUNER}"
        ))
        .await?;
    for c in [&coord, &w1, &w2] {
        c.batch_execute(&format!("GRANT {LOCAL_GRANTS}")).await?;
        c.batch_execute(&format!("ALTER SYSTEM SET dedup.prune_role = '{PRUNER}'"))
            .await?;
        c.batch_execute("SELECT pg_reload_conf()").await?;
    }
    let by_role = async {
        aged_claims_are_pruned(&coord, "role", &format!("the workers, as {PRUNER},")).await?;
        for (i, c) in [&w1, &w2].into_iter().enumerate() {
            let role: String = c
                .query_one("SELECT current_setting('dedup.prune_role')", &[])
                .await?
                .get(0);
            ensure!(role == PRUNER, "worker {}: prune_role {role:?}", i + 1);
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    for c in [&coord, &w1, &w2] {
        c.batch_execute("ALTER SYSTEM RESET dedup.prune_role")
            .await?;
        c.batch_execute("SELECT pg_reload_conf()").await?;
        c.batch_execute(&format!(
            "REVOKE ALL ON dedup._prune_status, dedup.forgotten, dedup._horizons FROM {PRUNER}; \
             REVOKE EXECUTE ON FUNCTION dedup._mark_horizon(float8), dedup._horizon(timestamptz) \
                    FROM {PRUNER}"
        ))
        .await?;
    }
    coord
        .batch_execute(&format!("REVOKE ALL ON dedup.processed FROM {PRUNER}"))
        .await?;
    coord.batch_execute(&format!("DROP ROLE {PRUNER}")).await?;
    by_role
}

/// try_claim_many through Citus, from a worker; offsets on the coordinator, in a
/// transaction with a distributed effect; refused on a worker (55000).
async fn batches_and_offsets_on_citus(cc: Cc) -> Result<()> {
    let w2 = node_as(&cc, 2, APP).await?;
    w2.batch_execute("BEGIN").await?;
    let got: Vec<String> = w2
        .query(
            "SELECT dedup.try_claim_many(ARRAY['bc-1', 'bc-2', 'bc-1'])",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    w2.batch_execute("COMMIT").await?;
    ensure!(got == ["bc-1", "bc-2"], "batch from worker 2: {got:?}");
    let coord = node(&cc, 0).await?;
    let again: i64 = coord
        .query_one(
            "SELECT count(*) FROM dedup.try_claim_many(ARRAY['bc-1', 'bc-2', 'bc-3'])",
            &[],
        )
        .await?
        .get(0);
    ensure!(
        again == 1,
        "only bc-3 is new on the coordinator, got {again}"
    );
    coord
        .batch_execute(
            "BEGIN; SELECT dedup.advance('log', 0, 10);
             INSERT INTO effects_c (job_id, node) VALUES ('log-0-10', 0); COMMIT;",
        )
        .await?;
    let mark: i64 = coord
        .query_one("SELECT dedup.position('log', 0)", &[])
        .await?
        .get(0);
    ensure!(mark == 10, "mark on the coordinator: {mark}");
    let w1 = node(&cc, 1).await?;
    let refused = state_of(
        w1.query("SELECT dedup.advance('log', 0, 11)", &[]).await,
        "advance on a worker",
    )?;
    ensure!(
        refused.starts_with("55000"),
        "advance on a worker: {refused}"
    );
    Ok(())
}

/// Each node counts the claims made through it; dedup.cluster_stats() shows all of them.
async fn stats_per_node_and_for_the_cluster(cc: Cc) -> Result<()> {
    for i in 0..3usize {
        let c = node(&cc, i).await?;
        c.batch_execute(&format!(
            "SET application_name = 'stats-node-{i}'; BEGIN; \
             SELECT dedup.try_claim('st-{i}-' || g, 'stats') FROM generate_series(1, {n}) g; \
             SELECT dedup.try_claim('st-{i}-1', 'stats'); COMMIT;",
            n = 5 + i
        ))
        .await?;
    }
    let coord = node(&cc, 0).await?;
    let rows = coord
        .query(
            "SELECT nodeport, claims, duplicates FROM dedup.cluster_stats() \
              WHERE scope = 'stats' ORDER BY nodeport",
            &[],
        )
        .await?;
    let got: Vec<(i32, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let ports: Vec<i32> = cc.lock().unwrap().nodes().map(|n| n.port as i32).collect();
    let mut want: Vec<(i32, i64, i64)> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, 5 + i as i64, 1))
        .collect();
    want.sort();
    ensure!(got == want, "cluster_stats: {got:?}, want {want:?}");
    Ok(())
}

/// The guide's experiment, try-claim strategy, without and with a SIGKILL of a consumer:
/// three consumers, one on each node, 0 duplicates and 0 missing.
async fn experiment_with_consumers_on_every_node(cc: Cc) -> Result<()> {
    let coord = node(&cc, 0).await?;
    coord
        .batch_execute(
            "CREATE TABLE effects (job_id bigint NOT NULL, consumer text NOT NULL, \
                                   at timestamptz NOT NULL DEFAULT clock_timestamp());
             SELECT create_distributed_table('effects', 'job_id', colocate_with => 'none');
             CREATE TABLE processed (job_id bigint PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
             SELECT create_distributed_table('processed', 'job_id', colocate_with => 'effects');",
        )
        .await?;
    let redis = RedisServer::start().await?;
    let config = Config {
        jobs: 900,
        runs: 1,
        crash_after: Duration::from_millis(500),
        strategies: vec!["try-claim".to_string()],
        ..Config::default()
    };
    let dsns = dsns(&cc);
    let exp = Experiment {
        config: config.clone(),
        pg_dsn: dsns[0].clone(),
        consumer_dsns: dsns,
        redis_url: redis.url(),
        consumer_exe: PathBuf::from(env!("CARGO_BIN_EXE_experiment")),
    };
    let runs = exp
        .run_matrix(|r| println!("  {}", report::run_summary(r).replace('\n', "\n  ")))
        .await?;
    ensure!(runs.len() == 2, "runs: {}", runs.len());
    for r in &runs {
        ensure!(r.drained, "a run did not drain");
        ensure!(
            r.duplicates == 0 && r.missing == 0,
            "crash={}: {} duplicates, {} missing",
            r.crash,
            r.duplicates,
            r.missing
        );
    }
    ensure!(runs.iter().any(|r| r.crashed()), "no run had a crash");
    Ok(())
}

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    cluster::stop_all_on_signal();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let cc = match CitusCluster::start() {
        Ok(c) => Arc::new(Mutex::new(c)),
        Err(e) => {
            eprintln!("could not start the Citus cluster: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "running the Citus tests against a coordinator and 2 workers (ports {:?}), database {DB}",
        cc.lock()
            .unwrap()
            .nodes()
            .map(|n| n.port)
            .collect::<Vec<_>>()
    );
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, test) in TESTS {
        // The first test distributes the claim table: the others need it.
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) && ran > 0 {
            continue;
        }
        ran += 1;
        let started = Instant::now();
        let fut = test(cc.clone());
        let result = runtime.block_on(async {
            match tokio::time::timeout(Duration::from_secs(300), tokio::spawn(fut)).await {
                Ok(Ok(r)) => r,
                Ok(Err(join)) => Err(anyhow::anyhow!("panicked: {join}")),
                Err(_) => Err(anyhow::anyhow!("timed out after 300 s")),
            }
        });
        match result {
            Ok(()) => println!(
                "test {name} ... ok ({:.1}s)",
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                println!(
                    "test {name} ... FAILED ({:.1}s)\n{e:#}\n",
                    started.elapsed().as_secs_f64()
                );
                failed.push(*name);
            }
        }
    }
    drop(runtime);
    if !failed.is_empty() {
        let g = cc.lock().unwrap();
        for n in g.nodes() {
            println!(
                "server log of port {} (last lines):\n{}",
                n.port,
                n.log_tail(25)
            );
        }
    }
    drop(cc);
    println!(
        "\ncitus: {} passed, {} failed{}",
        ran - failed.len(),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(": {}", failed.join(", "))
        }
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
