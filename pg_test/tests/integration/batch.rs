//! Batch claims and offsets per partition: dedup.try_claim_many, dedup.advance,
//! dedup.position, over real connections.
use crate::common::{claim, ensure_eq, expect_sqlstate, Ctx};
use anyhow::{bail, ensure, Context, Result};
use dedup_pg_test::cluster;
use dedup_pg_test::{connect, wait_until_blocked};
use rand::seq::SliceRandom;
use std::collections::HashMap;

async fn claimed(c: &dedup_pg_test::Conn, sql: &str) -> Result<Vec<String>> {
    Ok(c.query(sql, &[])
        .await
        .with_context(|| sql.to_string())?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect())
}

/// The ids claimed, in array order, each once; the same jobs as try_claim's (42 and '42');
/// every bad input an error with its SQLSTATE, naming the element.
pub async fn try_claim_many_claims_each_job_once(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute("BEGIN").await?;
    let got = claimed(&c, "SELECT dedup.try_claim_many(ARRAY['b', 'a', 'b', 'c'])").await?;
    ensure_eq(got, vec!["b".into(), "a".into(), "c".into()], "first batch")?;
    let got = claimed(&c, "SELECT dedup.try_claim_many(ARRAY['c', 'd'])").await?;
    ensure_eq(
        got,
        vec!["d".to_string()],
        "second batch: c is this transaction's already",
    )?;
    c.batch_execute("COMMIT").await?;
    c.batch_execute("BEGIN").await?;
    let none = claimed(&c, "SELECT dedup.try_claim_many(ARRAY['a', 'b', 'c', 'd'])").await?;
    ensure_eq(none.len(), 0, "all done")?;
    // bigint and uuid: the jobs of their text.
    let r: Vec<i64> = c
        .query(
            "SELECT dedup.try_claim_many(ARRAY[42, 43, 42]::bigint[])",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(r, vec![42, 43], "bigint batch")?;
    let again: bool = c
        .query_one("SELECT dedup.try_claim('42')", &[])
        .await?
        .get(0);
    ensure_eq(again, false, "try_claim('42') after the batch claimed 42")?;
    let u: Vec<uuid::Uuid> = c
        .query(
            "SELECT dedup.try_claim_many(ARRAY['00000000-0000-0000-0000-00000000000A']::uuid[], 'u')",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(u.len(), 1, "uuid batch")?;
    let lower: bool = c
        .query_one(
            "SELECT dedup.try_claim('00000000-0000-0000-0000-00000000000a', 'u')",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(lower, false, "the uuid's canonical text")?;
    let empty = claimed(&c, "SELECT dedup.try_claim_many(ARRAY[]::text[])").await?;
    ensure_eq(empty.len(), 0, "empty array")?;
    c.batch_execute("COMMIT").await?;

    for (sql, state, names) in [
        (
            "SELECT dedup.try_claim_many(ARRAY['a', NULL])",
            "22004",
            "job_ids[2]",
        ),
        (
            "SELECT dedup.try_claim_many(NULL::text[])",
            "22004",
            "job_ids",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY['a'], NULL)",
            "22004",
            "scope",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY['x', 'y', ''])",
            "22023",
            "job_ids[3]",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY[repeat('x', 1025)])",
            "22001",
            "job_ids[1]",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY[1, NULL]::bigint[])",
            "22004",
            "job_ids[2]",
        ),
        (
            "SELECT dedup.try_claim_many(array_agg(g::text)) FROM generate_series(1, 10001) g",
            "54000",
            "10001 job ids",
        ),
    ] {
        match c.query(sql, &[]).await {
            Ok(_) => bail!("{sql}: no error"),
            Err(e) => {
                let db = e.as_db_error().context("a server error")?;
                ensure_eq(db.code().code(), state, sql)?;
                if !db.message().contains(names) || db.hint().is_none() {
                    bail!("{sql}: {} (hint {:?})", db.message(), db.hint());
                }
            }
        }
    }
    // Fingerprints: one per id (NULL: none); another fingerprint for a job claimed before,
    // or for a repeated id, is YD001; arrays of different lengths are 22023.
    c.batch_execute("BEGIN").await?;
    let got = claimed(
        &c,
        "SELECT dedup.try_claim_many(ARRAY['f1', 'f2', 'f3'], 'fp', ARRAY['a', 'b', NULL])",
    )
    .await?;
    ensure_eq(
        got,
        vec!["f1".into(), "f2".into(), "f3".into()],
        "batch with fingerprints",
    )?;
    c.batch_execute("COMMIT").await?;
    let same = claimed(
        &c,
        "SELECT dedup.try_claim_many(ARRAY['f1', 'f3'], 'fp', ARRAY['a', 'z'])",
    )
    .await?;
    ensure_eq(
        same.len(),
        0,
        "the same fingerprints (and one where none was stored)",
    )?;
    for (sql, state) in [
        (
            "SELECT dedup.try_claim_many(ARRAY['f1', 'f2'], 'fp', ARRAY['a', 'other'])",
            "YD001",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY['n1', 'n1'], 'fp', ARRAY['a', 'b'])",
            "YD001",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY[7, 8]::bigint[], 'fp', ARRAY['a'])",
            "22023",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY['x'], 'fp', ARRAY[''])",
            "22023",
        ),
        (
            "SELECT dedup.try_claim_many(ARRAY['x'], 'fp', NULL::text[])",
            "22004",
        ),
    ] {
        let got = expect_sqlstate(c.query(sql, &[]).await, sql)?;
        ensure_eq(got.as_str(), state, sql)?;
    }
    // The mismatch is raised before any row is returned, however few the caller reads.
    c.batch_execute("BEGIN; SELECT dedup.try_claim('g2', 'fp', 'z'); COMMIT")
        .await?;
    let limited = expect_sqlstate(
        c.query(
            "SELECT * FROM dedup.try_claim_many(ARRAY['g1', 'g2'], 'fp', ARRAY['a', 'b']) LIMIT 1",
            &[],
        )
        .await,
        "a mismatch behind LIMIT 1",
    )?;
    ensure_eq(limited.as_str(), "YD001", "a mismatch behind LIMIT 1")?;
    // A repeated id is claimed with its first fingerprint that is not NULL.
    c.batch_execute(
        "BEGIN; SELECT dedup.try_claim_many(ARRAY['n2', 'n2'], 'fp', ARRAY[NULL, 'a']); COMMIT",
    )
    .await?;
    let other = expect_sqlstate(
        c.query("SELECT dedup.try_claim('n2', 'fp', 'b')", &[])
            .await,
        "n2 with another fingerprint",
    )?;
    ensure_eq(other.as_str(), "YD001", "n2 was claimed with fingerprint a")?;
    // Outside a transaction block: one WARNING per call, as try_claim (the native library
    // only: SQL cannot tell a transaction block from a one-statement transaction).
    c.take_notices();
    c.batch_execute("SELECT dedup.try_claim_many(ARRAY['w1', 'w2', 'w3'])")
        .await?;
    let warnings = c.take_notices().len();
    let want = usize::from(cluster::edition() == cluster::Edition::Native);
    ensure_eq(warnings, want, "warnings outside a transaction block")?;
    Ok(())
}

/// 16 connections claim overlapping batches of 50 of the same 400 ids, each batch in a
/// random order, each batch with its effect in one transaction: no deadlock, every id
/// claimed once.
pub async fn overlapping_batches_in_any_order_never_deadlock(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    admin
        .batch_execute("CREATE TABLE batch_effects (job_id text PRIMARY KEY)")
        .await?;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let dsn = ctx.dsn();
        tasks.push(tokio::spawn(async move {
            let c = connect(&dsn).await?;
            c.batch_execute("SET deadlock_timeout = '50ms'").await?;
            let mut won = Vec::new();
            for _ in 0..40 {
                let mut ids: Vec<String> = (0..400).map(|i| format!("ob-{i}")).collect();
                ids.shuffle(&mut rand::rng());
                ids.truncate(50);
                c.batch_execute("BEGIN").await?;
                let got: Vec<String> = c
                    .query(
                        "WITH c AS (SELECT dedup.try_claim_many($1::text[]) AS job_id) \
                         INSERT INTO batch_effects SELECT job_id FROM c RETURNING job_id",
                        &[&ids],
                    )
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                c.batch_execute("COMMIT").await?;
                won.extend(got);
            }
            Ok::<_, anyhow::Error>(won)
        }));
    }
    let mut winners: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for j in t.await?.context("a batch failed (a deadlock?)")? {
            *winners.entry(j).or_default() += 1;
        }
    }
    let twice = winners.values().filter(|n| **n > 1).count();
    ensure_eq(twice, 0, "ids won twice")?;
    let claims: i64 = admin
        .query_one(
            "SELECT count(*) FROM dedup.processed WHERE job_id LIKE 'ob-%'",
            &[],
        )
        .await?
        .get(0);
    let effects: i64 = admin
        .query_one("SELECT count(*) FROM batch_effects", &[])
        .await?
        .get(0);
    ensure_eq(
        (claims, effects),
        (winners.len() as i64, winners.len() as i64),
        "claims, effects",
    )?;
    if winners.len() < 350 {
        bail!("only {} of 400 ids were ever claimed", winners.len());
    }
    Ok(())
}

async fn pos(c: &dedup_pg_test::Conn, p: i32) -> Result<Option<i64>> {
    Ok(c.query_one("SELECT dedup.position('orders', $1)", &[&p])
        .await?
        .get(0))
}

/// dedup.positions(stream) gives every partition's mark of a stream, in partition order,
/// to a role with no grant of its own, with the marks this transaction raised; only that
/// stream's; none for a stream never advanced; and refuses what position() refuses.
pub async fn positions_gives_every_partitions_mark(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute(
        "SELECT dedup.advance('orders', 2, 40), dedup.advance('orders', 0, 7),
                dedup.advance('orders', 11, 3), dedup.advance('refunds', 0, 99)",
    )
    .await?;
    let (_, consumer) = crate::common::unprivileged(&ctx, "positions_consumer", "").await?;
    let marks = |rows: Vec<tokio_postgres::Row>| -> Vec<(i32, i64)> {
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    ensure_eq(
        marks(
            consumer
                .query("SELECT * FROM dedup.positions('orders')", &[])
                .await?,
        ),
        vec![(0, 7), (2, 40), (11, 3)],
        "the marks of orders, in partition order",
    )?;
    ensure_eq(
        marks(
            consumer
                .query(
                    "SELECT partition, position FROM dedup.positions('never')",
                    &[],
                )
                .await?,
        ),
        vec![],
        "a stream never advanced",
    )?;
    // Raised in this transaction: seen by it, as position() sees it.
    c.batch_execute("BEGIN; SELECT dedup.advance('orders', 2, 41)")
        .await?;
    ensure_eq(
        marks(
            c.query("SELECT * FROM dedup.positions('orders')", &[])
                .await?,
        ),
        vec![(0, 7), (2, 41), (11, 3)],
        "with this transaction's mark",
    )?;
    c.batch_execute("ROLLBACK").await?;
    for (arg, state) in [
        ("NULL", "22004"),
        ("''", "22023"),
        ("repeat('s', 129)", "22001"),
    ] {
        let what = format!("positions({arg})");
        let got = expect_sqlstate(
            consumer
                .query(&format!("SELECT * FROM dedup.positions({arg})"), &[])
                .await,
            &what,
        )?;
        ensure_eq(got.as_str(), state, &what)?;
    }
    Ok(())
}

/// dedup.advance raises a partition's mark once per position, in the caller's
/// transaction; position() reads it; a second consumer of the partition waits for the
/// first and then compares with what it committed; bad input is refused.
pub async fn advance_raises_each_partition_once(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    ensure_eq(pos(&c, 0).await?, None, "no mark yet")?;
    for (p, position, want) in [
        (0, 5i64, true),
        (0, 5, false),
        (0, 3, false),
        (0, 9, true),
        (1, 0, true),
    ] {
        c.batch_execute("BEGIN").await?;
        let got: bool = c
            .query_one("SELECT dedup.advance('orders', $1, $2)", &[&p, &position])
            .await?
            .get(0);
        c.batch_execute("COMMIT").await?;
        ensure_eq(got, want, &format!("advance(orders, {p}, {position})"))?;
    }
    ensure_eq(pos(&c, 0).await?, Some(9), "mark of partition 0")?;
    ensure_eq(pos(&c, 1).await?, Some(0), "mark of partition 1")?;
    // A batch: its first and last positions. False when any of it is done.
    for (first, last, want) in [
        (0i64, 9i64, true),
        (5, 15, false),
        (10, 15, true),
        (16, 16, true),
    ] {
        c.batch_execute("BEGIN").await?;
        let got: bool = c
            .query_one(
                "SELECT dedup.advance('orders', 5, $1, $2)",
                &[&first, &last],
            )
            .await?
            .get(0);
        c.batch_execute("COMMIT").await?;
        ensure_eq(got, want, &format!("advance(orders, 5, {first}, {last})"))?;
    }
    ensure_eq(pos(&c, 5).await?, Some(16), "mark of partition 5")?;
    let backwards = expect_sqlstate(
        c.query("SELECT dedup.advance('orders', 5, 30, 20)", &[])
            .await,
        "first after last",
    )?;
    ensure_eq(
        backwards.as_str(),
        "22023",
        "first_position after last_position",
    )?;
    // Rolled back with the effects.
    c.batch_execute("BEGIN; SELECT dedup.advance('orders', 0, 20); ROLLBACK")
        .await?;
    ensure_eq(pos(&c, 0).await?, Some(9), "after a rollback")?;

    // A rebalance: two consumers of partition 2.
    let a = ctx.connect().await?;
    let b = ctx.connect().await?;
    a.batch_execute("BEGIN; SELECT dedup.advance('orders', 2, 10)")
        .await?;
    let b_pid = b.pid;
    let waiting = tokio::spawn(async move {
        let r: bool = b
            .query_one("SELECT dedup.advance('orders', 2, 10)", &[])
            .await?
            .get(0);
        Ok::<_, anyhow::Error>(r)
    });
    wait_until_blocked(&c, b_pid).await?;
    a.batch_execute("COMMIT").await?;
    ensure_eq(
        waiting.await??,
        false,
        "the second consumer after the first committed 10",
    )?;

    for (sql, state) in [
        ("SELECT dedup.advance(NULL, 0, 1)", "22004"),
        ("SELECT dedup.advance('s', NULL, 1)", "22004"),
        ("SELECT dedup.advance('s', 0, NULL)", "22004"),
        ("SELECT dedup.advance('', 0, 1)", "22023"),
        ("SELECT dedup.advance('s', -1, 1)", "22023"),
        ("SELECT dedup.advance('s', 0, -1)", "22023"),
        ("SELECT dedup.advance(repeat('s', 129), 0, 1)", "22001"),
        ("SELECT dedup.position(NULL, 0)", "22004"),
    ] {
        let got = expect_sqlstate(c.query(sql, &[]).await, sql)?;
        ensure_eq(got.as_str(), state, sql)?;
    }
    // A read-only transaction cannot advance.
    c.batch_execute("BEGIN READ ONLY").await?;
    let ro = expect_sqlstate(
        c.query("SELECT dedup.advance('orders', 0, 100)", &[]).await,
        "read only",
    )?;
    c.batch_execute("ROLLBACK").await?;
    ensure_eq(ro.as_str(), "25006", "advance in a read-only transaction")?;
    // Any role may advance and read positions; nobody writes the table directly.
    let (_, app) = crate::common::unprivileged(&ctx, "offsets", "").await?;
    app.batch_execute("BEGIN; SELECT dedup.advance('app', 0, 1); COMMIT")
        .await?;
    let direct = expect_sqlstate(
        app.query("DELETE FROM dedup.offsets", &[]).await,
        "DELETE as app",
    )?;
    ensure_eq(direct.as_str(), "42501", "the table is the extension's")?;
    Ok(())
}

/// Before the fix any role could move any stream's marks, and
/// `advance(stream, 0, 9223372036854775807)` made every later entry of that partition
/// "done" for ever. A stream belongs to the role that first advanced it: another role's
/// advance of it (a partition it has, a new one, the batch form) is refused with 42501
/// naming the stream and its owner, and moves nothing; a member of the owner and a
/// superuser advance it; an administrator gives it to another role with an UPDATE; a role
/// racing the owner's first advance of a new stream waits for it and is then refused.
pub async fn only_a_streams_owner_advances_it(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let (a_role, a) = crate::common::unprivileged(&ctx, "stream_a", "").await?;
    let (b_role, b) = crate::common::unprivileged(&ctx, "stream_b", "").await?;
    let (_, member) =
        crate::common::unprivileged(&ctx, "stream_m", &format!("GRANT {a_role} TO {{role}};"))
            .await?;
    ensure_eq(
        claim(&a, "SELECT dedup.advance('s', 0, 10)").await?,
        true,
        "the first advance of s, by a",
    )?;
    for sql in [
        "SELECT dedup.advance('s', 0, 11)",
        "SELECT dedup.advance('s', 1, 5)",
        "SELECT dedup.advance('s', 0, 11, 9223372036854775807)",
        "SELECT dedup.advance('s', 2, 0, 9223372036854775807)",
    ] {
        let e = match b.query(sql, &[]).await {
            Ok(rows) => bail!("{sql} as b: expected 42501, got {} rows", rows.len()),
            Err(e) => e,
        };
        let db = e
            .as_db_error()
            .with_context(|| format!("{sql} as b: {e}"))?;
        ensure_eq(db.code().code(), "42501", &format!("{sql} as b"))?;
        ensure!(
            db.message().contains("stream 's'") && db.message().contains(a_role.as_str()),
            "{sql} as b: the message names the stream and its owner: {}",
            db.message()
        );
        ensure!(
            db.hint()
                .is_some_and(|h| h.contains("UPDATE dedup.offsets SET owner")),
            "{sql} as b: the hint says how to give the stream away: {:?}",
            db.hint()
        );
    }
    ensure_eq(
        pos_of(&b, "s", 0).await?,
        Some(10),
        "s/0 after b's attempts",
    )?;
    ensure_eq(pos_of(&b, "s", 1).await?, None, "s/1 after b's attempts")?;
    ensure_eq(pos_of(&b, "s", 2).await?, None, "s/2 after b's attempts")?;

    // A member of a advances s, and the partition it adds is a's too.
    ensure_eq(
        claim(&member, "SELECT dedup.advance('s', 0, 11)").await?,
        true,
        "a member of a advances s/0",
    )?;
    ensure_eq(
        claim(&member, "SELECT dedup.advance('s', 1, 0, 5)").await?,
        true,
        "a member of a adds s/1",
    )?;
    ensure_eq(
        claim(&a, "SELECT dedup.advance('s', 1, 6)").await?,
        true,
        "a advances the partition its member added",
    )?;
    let owners: Vec<String> = admin
        .query(
            "SELECT owner::text FROM dedup.offsets WHERE stream = 's' ORDER BY partition",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ensure_eq(owners, vec![a_role.clone(), a_role], "owners of s")?;
    // A superuser passes; an administrator gives the stream to b.
    ensure_eq(
        claim(&admin, "SELECT dedup.advance('s', 0, 12)").await?,
        true,
        "a superuser advances s/0",
    )?;
    admin
        .batch_execute(&format!(
            "UPDATE dedup.offsets SET owner = '{b_role}' WHERE stream = 's'"
        ))
        .await?;
    ensure_eq(
        claim(&b, "SELECT dedup.advance('s', 0, 13)").await?,
        true,
        "b advances s once it is b's",
    )?;
    ensure_eq(
        expect_sqlstate(
            a.query("SELECT dedup.advance('s', 0, 14)", &[]).await,
            "a after s was given to b",
        )?
        .as_str(),
        "42501",
        "a after s was given to b",
    )?;

    // A race for a new stream: b's first advance of another partition of t waits for a's
    // uncommitted first advance, then sees a's row and is refused.
    a.batch_execute("BEGIN; SELECT dedup.advance('t', 0, 1)")
        .await?;
    let b_pid = b.pid;
    let racing = tokio::spawn(async move {
        let r = b
            .query("SELECT dedup.advance('t', 1, 9223372036854775807)", &[])
            .await;
        (b, r)
    });
    wait_until_blocked(&admin, b_pid).await?;
    a.batch_execute("COMMIT").await?;
    let (b, raced) = racing.await?;
    ensure_eq(
        expect_sqlstate(raced, "b racing a's first advance of t")?.as_str(),
        "42501",
        "b racing a's first advance of t",
    )?;
    ensure_eq(pos_of(&b, "t", 1).await?, None, "t/1 after the race")?;
    ensure_eq(pos_of(&b, "t", 0).await?, Some(1), "t/0 after the race")?;
    Ok(())
}

async fn pos_of(c: &dedup_pg_test::Conn, stream: &str, p: i32) -> Result<Option<i64>> {
    Ok(c.query_one("SELECT dedup.position($1, $2)", &[&stream, &p])
        .await?
        .get(0))
}
