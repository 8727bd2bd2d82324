//! Copies that ran again because their claim had expired (src/expired/): a scope with a
//! short retention, claims pruned, then copies of some of them and new jobs. The copies are
//! counted, new jobs are not (beyond the stated false-positive rate), the look-back bound
//! holds, a clean restart keeps the summaries, a crash or a damaged file forgets them, and
//! a dropped database's keys are forgotten. Each test runs a cluster of its own with
//! `shared_preload_libraries = 'dedup'`.
use crate::common::{ensure_eq, Ctx};
use crate::stats::{as_consumer, preloaded};
use anyhow::{bail, Result};
use dedup_pg_test::cluster::Cluster;
use dedup_pg_test::{connect, connect_when_up, Conn};
use std::time::Duration;

/// Claim `ids` (a SQL set of text) in `scope`, in one statement (one transaction), and say
/// how many returned true.
async fn claim_all(c: &Conn, scope: &str, ids: &str) -> Result<i64> {
    Ok(c.query_one(
        &format!(
            "SELECT count(*) FILTER (WHERE dedup.try_claim(id, '{scope}')) FROM {ids} AS t(id)"
        ),
        &[],
    )
    .await?
    .get(0))
}

/// (expired_duplicates, expired_duplicate_after_max in seconds) of `consumer` in `scope`.
async fn expired(c: &Conn, scope: &str, consumer: &str) -> Result<(i64, f64)> {
    let (n, after, _) = expired_and_expected(c, scope, consumer).await?;
    Ok((n, after))
}

/// The same, and expired_duplicates_expected.
async fn expired_and_expected(c: &Conn, scope: &str, consumer: &str) -> Result<(i64, f64, f64)> {
    let rows = c
        .query(
            "SELECT expired_duplicates, extract(epoch FROM expired_duplicate_after_max)::float8, \
                    expired_duplicates_expected \
               FROM dedup.stats WHERE datname = current_database() AND scope = $1 AND consumer = $2",
            &[&scope, &consumer],
        )
        .await?;
    Ok(rows
        .first()
        .map_or((0, 0.0, 0.0), |r| (r.get(0), r.get(1), r.get(2))))
}

/// Claims of `n` jobs named `prefix-1` .. `prefix-n` in `scope`, then pruned once their
/// retention (2 seconds) has passed since a horizon after them: all `n` of them.
async fn claim_and_prune(c: &Conn, scope: &str, prefix: &str, n: i64) -> Result<()> {
    c.batch_execute(&format!(
        "SELECT dedup.set_retention('{scope}', '2 seconds')"
    ))
    .await?;
    let taken = claim_all(c, scope, &ids(prefix, 1, n)).await?;
    ensure_eq(taken, n, "claims taken")?;
    // A prune marks a horizon now; a retention later, the claims made before it go
    // (retention::a_claim_is_kept_its_retention_from_commit).
    c.batch_execute(&format!("SELECT dedup.prune('{scope}')"))
        .await?;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let pruned: i64 = c
        .query_one(&format!("SELECT dedup.prune('{scope}')"), &[])
        .await?
        .get(0);
    ensure_eq(pruned, n, "claims pruned")
}

/// A cluster of its own (`name`, preloaded, `settings` besides), database `app` with the
/// extension, and a session there as consumer `admin`.
async fn cluster_with_app(name: &str, settings: &[(&str, &str)]) -> Result<(Cluster, Conn)> {
    let mut opts = preloaded(name);
    for (k, v) in settings {
        opts = opts.set(k, v);
    }
    let cluster = Cluster::start(opts)?;
    cluster.create_db_with_extension("app")?;
    let admin = as_consumer(&cluster, "app", "admin").await?;
    Ok((cluster, admin))
}

/// The SQL set of `prefix-from` .. `prefix-to`.
fn ids(prefix: &str, from: i64, to: i64) -> String {
    format!("(SELECT '{prefix}-' || g FROM generate_series({from}, {to}) AS g)")
}

/// The false-positive rate a new job meets now in this database: one minus the chance of
/// missing every summary that holds its keys.
async fn stated_rate(c: &Conn) -> Result<f64> {
    Ok(c.query_one(
        "SELECT 1 - coalesce(exp(sum(ln(1 - false_positive_rate))), 1) FROM dedup.expired_summaries() \
          WHERE in_lookback AND (SELECT oid FROM pg_database WHERE datname = current_database()) = ANY (databases)",
        &[],
    )
    .await?
    .get(0))
}

/// 1,000 claims pruned; then 300 copies of them, 20,000 new jobs, the same ids in another
/// scope and another database. Exactly the 300 copies are counted (a Bloom filter has no
/// false negatives; at 1,000 keys its false-positive rate is below one in a billion), each
/// at most the time since the earliest expiry, and suggest_retention() reads them.
pub async fn copies_after_expiry_are_counted_and_new_jobs_are_not(_ctx: Ctx) -> Result<()> {
    let cluster = Cluster::start(preloaded("expired"))?;
    for db in ["app", "other"] {
        cluster.create_db_with_extension(db)?;
    }
    // The other database has keys of its own in the same summary (other ids), so that a
    // claim there looks in it: the database is part of the key.
    let other_admin = as_consumer(&cluster, "other", "admin").await?;
    let admin = as_consumer(&cluster, "app", "admin").await?;
    // One after the other: a prune's horizon is the oldest transaction running in the whole
    // cluster, so one database's claims in flight hold back the other's first horizon (run
    // at the same time, the other database's claims were sometimes not pruned).
    claim_and_prune(&admin, "short", "old", 1000).await?;
    claim_and_prune(&other_admin, "short", "elsewhere", 10).await?;
    let (keys, not_kept): (i64, i64) = admin
        .query_one(
            "SELECT sum(keys)::int8, sum(not_kept)::int8 FROM dedup.expired_summaries()",
            &[],
        )
        .await?
        .get_pair();
    ensure_eq((keys, not_kept), (1010, 0), "keys in the summaries")?;
    let shared: i64 = admin
        .query_one(
            "SELECT count(*) FROM dedup.expired_summaries() WHERE cardinality(databases) = 2",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(shared, 1, "a summary that holds both databases' keys")?;
    let rate = stated_rate(&admin).await?;
    if rate > 1e-6 {
        bail!("a false-positive rate of {rate} at 1,000 keys");
    }

    let x = as_consumer(&cluster, "app", "consumer-x").await?;
    ensure_eq(
        claim_all(&x, "short", &ids("old", 1, 300)).await?,
        300,
        "copies of pruned jobs run again (their claims are gone)",
    )?;
    ensure_eq(
        claim_all(&x, "short", &ids("new", 1, 20_000)).await?,
        20_000,
        "new jobs",
    )?;
    let (n, after, expected) = expired_and_expected(&x, "short", "consumer-x").await?;
    ensure_eq(n, 300, "expired duplicates counted")?;
    // 20,300 look-ups at a rate below 10^-9 each.
    if !(0.0..1e-3).contains(&expected) {
        bail!("expired_duplicates_expected {expected}");
    }
    // The copies came about a second after their claims expired (claimed, 2 s retention,
    // 3.5 s wait); the bound is from the earliest expiry of the summary.
    if !(0.5..30.0).contains(&after) {
        bail!("expired_duplicate_after_max of {after} s");
    }
    // The same ids in another scope, and in another database: other keys.
    ensure_eq(
        claim_all(&x, "elsewhere", &ids("old", 1, 300)).await?,
        300,
        "the same ids in another scope",
    )?;
    ensure_eq(
        expired(&x, "elsewhere", "consumer-x").await?.0,
        0,
        "expired duplicates in another scope",
    )?;
    let y = as_consumer(&cluster, "other", "consumer-x").await?;
    claim_all(&y, "short", &ids("old", 1, 300)).await?;
    let (n, _, expected) = expired_and_expected(&y, "short", "consumer-x").await?;
    ensure_eq(n, 0, "expired duplicates in another database")?;
    if expected <= 0.0 {
        bail!("the other database's claims did not look (expected {expected})");
    }
    // Copies through try_claim_many are counted each; a duplicate (the claim is there
    // again now) is not an expired duplicate.
    let batch: i64 = x
        .query_one(
            "SELECT count(*) FROM dedup.try_claim_many(ARRAY(SELECT 'old-' || g FROM generate_series(301, 400) g), 'short')",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(batch, 100, "copies claimed through try_claim_many")?;
    claim_all(&x, "short", &ids("old", 1, 400)).await?;
    ensure_eq(
        expired(&x, "short", "consumer-x").await?.0,
        400,
        "expired duplicates after a batch of copies and then duplicates of them all",
    )?;
    // The retention that would have caught them: at least the retention and the time past
    // it, half again.
    let (retention, suggested): (f64, f64) = admin
        .query_one(
            "SELECT extract(epoch FROM retention)::float8, extract(epoch FROM suggested)::float8 \
               FROM dedup.suggest_retention() WHERE scope = 'short'",
            &[],
        )
        .await?
        .get_pair();
    ensure_eq(retention, 2.0, "the scope's retention")?;
    if suggested < 1.5 * (2.0 + after) - 0.001 {
        bail!("suggested {suggested} s for copies up to {after} s past a retention of 2 s");
    }
    Ok(())
}

/// A summary stops taking keys at its capacity: with `dedup.expired_memory` of 64 kB (128
/// blocks a slot), 5,000 claims pruned leave some not kept, and the rate new jobs are
/// counted at stays near the stated one, at most 0.1%: of 20,000 new jobs, a count within
/// Poisson bounds of the stated rate (before the cap, the filter would fill past 3%).
pub async fn a_full_summary_holds_its_false_positive_rate(_ctx: Ctx) -> Result<()> {
    let (cluster, admin) =
        cluster_with_app("expired-full", &[("dedup.expired_memory", "64kB")]).await?;
    claim_and_prune(&admin, "short", "old", 5000).await?;
    let (keys, not_kept, capacity): (i64, i64, i64) = {
        let r = admin
            .query_one(
                "SELECT sum(keys)::int8, sum(not_kept)::int8, max(capacity) FROM dedup.expired_summaries()",
                &[],
            )
            .await?;
        (r.get(0), r.get(1), r.get(2))
    };
    ensure_eq(
        (keys, keys + not_kept),
        (capacity, 5000),
        "keys kept up to the capacity",
    )?;
    let rate = stated_rate(&admin).await?;
    if !(0.0005..=0.001).contains(&rate) {
        bail!("a full summary states a rate of {rate}");
    }
    let x = as_consumer(&cluster, "app", "consumer-x").await?;
    let new = 20_000;
    claim_all(&x, "short", &ids("new", 1, new)).await?;
    let (false_positives, _, counted_expected) =
        expired_and_expected(&x, "short", "consumer-x").await?;
    let expected = rate * new as f64;
    // The column adds each look-up's rate: the same number.
    if (counted_expected - expected).abs() > expected * 0.01 + 0.01 {
        bail!("expired_duplicates_expected {counted_expected}, the stated rate gives {expected}");
    }
    // Poisson: more than 5 standard deviations over happens about once in 3.5 million runs.
    let bound = expected + 5.0 * expected.sqrt() + 1.0;
    println!(
        "new jobs counted as expired duplicates: {false_positives} of {new} \
         (stated rate {rate:.5}, expected {expected:.1})"
    );
    if false_positives as f64 > bound {
        bail!("{false_positives} of {new} new jobs counted (stated rate {rate})");
    }
    // Copies of kept keys are still found.
    let kept_copies = claim_all(&x, "short", &ids("old", 1, 100)).await?;
    ensure_eq(kept_copies, 100, "copies claimed")?;
    let (n, _) = expired(&x, "short", "consumer-x").await?;
    if n < false_positives + 100 {
        bail!("copies of the first keys pruned not all counted: {n}");
    }
    Ok(())
}

/// A pruned claim is remembered for the look-back, then forgotten: with
/// `dedup.expired_lookback` of 10 s, copies right after the prune are counted and copies
/// 12.5 s later (past 10 s and a width, 10/7 s) are not.
pub async fn the_lookback_bound_holds(_ctx: Ctx) -> Result<()> {
    let (cluster, admin) =
        cluster_with_app("expired-lookback", &[("dedup.expired_lookback", "10s")]).await?;
    claim_and_prune(&admin, "short", "old", 200).await?;
    let x = as_consumer(&cluster, "app", "consumer-x").await?;
    claim_all(&x, "short", &ids("old", 1, 100)).await?;
    ensure_eq(
        expired(&x, "short", "consumer-x").await?.0,
        100,
        "copies within the look-back",
    )?;
    // 10 s and a width (10/7 s) after the prune, with margin.
    tokio::time::sleep(Duration::from_millis(12_500)).await;
    claim_all(&x, "short", &ids("old", 101, 200)).await?;
    ensure_eq(
        expired(&x, "short", "consumer-x").await?.0,
        100,
        "copies past the look-back",
    )?;
    let in_lookback: bool = admin
        .query_one(
            "SELECT bool_or(in_lookback) FROM dedup.expired_summaries()",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(in_lookback, false, "summaries in the look-back")?;
    Ok(())
}

/// A clean restart keeps the summaries (pg_stat/dedup_expired.stat); a damaged file is
/// refused whole, with a WARNING in the log, and the summaries start empty; a crash
/// forgets what was pruned since the last clean start.
pub async fn restart_keeps_the_summaries_and_a_crash_or_damage_forgets_them(
    _ctx: Ctx,
) -> Result<()> {
    let (mut cluster, admin) = cluster_with_app("expired-restart", &[]).await?;
    claim_and_prune(&admin, "short", "old", 300).await?;
    drop(admin);
    cluster.stop("fast")?;
    cluster.start_again()?;
    let x = as_consumer(&cluster, "app", "consumer-x").await?;
    claim_all(&x, "short", &ids("old", 1, 100)).await?;
    ensure_eq(
        expired(&x, "short", "consumer-x").await?.0,
        100,
        "copies counted after a clean restart",
    )?;
    drop(x);

    // One byte of the file changed: refused.
    cluster.stop("fast")?;
    let file = cluster.data.join("pg_stat/dedup_expired.stat");
    let mut bytes = std::fs::read(&file)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&file, &bytes)?;
    cluster.start_again()?;
    let x = as_consumer(&cluster, "app", "consumer-x").await?;
    claim_all(&x, "short", &ids("old", 101, 200)).await?;
    ensure_eq(
        expired(&x, "short", "consumer-x").await?.0,
        100,
        "copies counted after the file was damaged",
    )?;
    if !cluster.log_text().contains("dedup_expired.stat not loaded") {
        bail!("no WARNING that the damaged file was refused");
    }

    // Pruned after that start, then a crash: forgotten.
    let admin = as_consumer(&cluster, "app", "admin").await?;
    claim_and_prune(&admin, "before-the-crash", "crash", 50).await?;
    crate::common::kill9(x.pid)?;
    drop((x, admin));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = connect_when_up(&cluster.dsn("app")).await?;
    let keys: Option<i64> = c
        .query_one("SELECT sum(keys)::int8 FROM dedup.expired_summaries()", &[])
        .await?
        .get(0);
    ensure_eq(keys, None, "keys in the summaries after a crash")?;
    Ok(())
}

/// A dropped database is taken off every summary (the launcher checks, each interval);
/// the other databases stay.
pub async fn a_dropped_databases_keys_are_forgotten(_ctx: Ctx) -> Result<()> {
    let cluster = Cluster::start(preloaded("expired-dropped").set("dedup.prune_interval", "1s"))?;
    let mut oids = Vec::new();
    for db in ["gone", "kept"] {
        cluster.create_db_with_extension(db)?;
        let c = as_consumer(&cluster, db, "admin").await?;
        // The worker prunes them (every second).
        c.batch_execute("SELECT dedup.set_retention('short', '2 seconds')")
            .await?;
        claim_all(&c, "short", &ids("old", 1, 10)).await?;
        let oid: u32 = c
            .query_one(
                "SELECT oid FROM pg_database WHERE datname = current_database()",
                &[],
            )
            .await?
            .get(0);
        oids.push(oid);
    }
    let admin = connect(&cluster.dsn("kept")).await?;
    let listed = || async {
        let rows = admin
            .query(
                "SELECT DISTINCT unnest(databases) FROM dedup.expired_summaries()",
                &[],
            )
            .await?;
        let mut v: Vec<u32> = rows.iter().map(|r| r.get(0)).collect();
        v.sort_unstable();
        Ok::<_, anyhow::Error>(v)
    };
    let mut both = oids.clone();
    both.sort_unstable();
    crate::worker::eventually(30, "both databases' claims pruned", || async {
        Ok(listed().await? == both)
    })
    .await?;
    admin.batch_execute("DROP DATABASE gone").await?;
    crate::worker::eventually(20, "the dropped database forgotten", || async {
        Ok(listed().await? == vec![oids[1]])
    })
    .await?;
    Ok(())
}

trait Pair {
    fn get_pair<A, B>(&self) -> (A, B)
    where
        A: for<'a> tokio_postgres::types::FromSql<'a>,
        B: for<'a> tokio_postgres::types::FromSql<'a>;
}

impl Pair for tokio_postgres::Row {
    fn get_pair<A, B>(&self) -> (A, B)
    where
        A: for<'a> tokio_postgres::types::FromSql<'a>,
        B: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        (self.get(0), self.get(1))
    }
}

/// With `dedup.expired_memory = 0` nothing is remembered: copies of pruned claims are not
/// counted, and `dedup.expired_summaries()` says why (a WARNING naming the setting, not the
/// preloading the server has).
pub async fn without_memory_nothing_is_remembered_and_the_summaries_say_why(
    _ctx: Ctx,
) -> Result<()> {
    // (The cluster lives to the end of the test: dropping it stops the server.)
    let (_cluster, admin) =
        cluster_with_app("expired-off", &[("dedup.expired_memory", "0")]).await?;
    claim_and_prune(&admin, "short", "old", 10).await?;
    claim_all(&admin, "short", &ids("old", 1, 10)).await?;
    ensure_eq(
        expired(&admin, "short", "admin").await?.0,
        0,
        "copies counted with no memory",
    )?;
    admin.take_notices();
    let rows = admin
        .query("SELECT * FROM dedup.expired_summaries()", &[])
        .await?;
    ensure_eq(rows.len(), 0, "summaries")?;
    let warned = admin
        .take_notices()
        .iter()
        .any(|n| n.severity() == "WARNING" && n.message().contains("dedup.expired_memory is 0"));
    ensure_eq(warned, true, "a WARNING naming dedup.expired_memory")?;
    Ok(())
}

/// The ring turns: with `dedup.expired_lookback` of 7 s (a summary takes keys for 1 s), a
/// scope pruned every 1.2 s for 12 s fills all eight summaries and empties the oldest in
/// turn; copies of the jobs pruned last are counted, copies of the first ones (pruned more
/// than the look-back and a width ago, their summary emptied since) are not.
pub async fn the_ring_turns_and_forgets_the_oldest(_ctx: Ctx) -> Result<()> {
    let (cluster, admin) =
        cluster_with_app("expired-ring", &[("dedup.expired_lookback", "7s")]).await?;
    admin
        .batch_execute("SELECT dedup.set_retention('turn', '1 second')")
        .await?;
    let mut pruned = 0;
    for round in 0..10 {
        claim_all(&admin, "turn", &ids(&format!("r{round}"), 1, 20)).await?;
        let n: i64 = admin
            .query_one("SELECT dedup.prune('turn')", &[])
            .await?
            .get(0);
        pruned += n;
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    for _ in 0..2 {
        let n: i64 = admin
            .query_one("SELECT dedup.prune('turn')", &[])
            .await?
            .get(0);
        pruned += n;
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    ensure_eq(pruned, 200, "claims pruned")?;
    let (slots, keys): (i64, i64) = admin
        .query_one(
            "SELECT count(*), sum(keys)::int8 FROM dedup.expired_summaries()",
            &[],
        )
        .await?
        .get_pair();
    ensure_eq(slots, 8, "summaries in use")?;
    if keys >= pruned {
        bail!("{keys} keys in the summaries: none was emptied");
    }
    let x = as_consumer(&cluster, "app", "consumer-x").await?;
    // Round 0 was pruned about 12 s ago (round 1's prune), round 9 about 2.4 s ago.
    claim_all(&x, "turn", &ids("r0", 1, 20)).await?;
    ensure_eq(
        expired(&x, "turn", "consumer-x").await?.0,
        0,
        "copies of jobs pruned past the look-back",
    )?;
    claim_all(&x, "turn", &ids("r9", 1, 20)).await?;
    ensure_eq(
        expired(&x, "turn", "consumer-x").await?.0,
        20,
        "copies of jobs pruned within the look-back",
    )?;
    Ok(())
}
