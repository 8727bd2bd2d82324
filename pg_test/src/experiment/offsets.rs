//! The `offsets` strategy, and the example consumer of a partitioned log: one Redis
//! stream per partition, each read by one consumer at a time from the position the
//! database holds, the effects of a batch and `dedup.advance` of its partition in one
//! transaction.
//!
//! **The log.** Each job is published once, into partition `job % PARTITIONS` (a log's
//! producer writes a record once; duplicate *delivery* is the consumers' doing). Every
//! batch is delivered twice: read, processed, and read again from the same place, as a
//! consumer that rewinds (or a rebalance) would; and after the crash the consumer that
//! takes a partition over reads it again from the database's position. `dedup.advance`
//! makes every delivery after the first a no-op.
//!
//! **Entry ids as positions.** A Redis stream entry id is `<ms>-<seq>`. Its position is the
//! bigint `ms * 2^20 + seq` ([`position`]): increasing with the id, and back again with
//! [`entry_id`]; it holds while `seq < 2^20` (a million entries in one millisecond of one
//! stream) and `ms < 2^43` (until the year 2248).
//!
//! **Who reads a partition.** A task reads a partition while it holds the session advisory
//! lock (`EXPERIMENT_LOCK`, partition) on the connection it works on: a consumer that dies
//! loses its connections, and with them its locks and its open transactions together, so
//! another one takes its partitions over (it looks every [`TAKE_OVER_EVERY`]) and reads them
//! from their marks. Each batch is advanced with its first and last positions
//! (`dedup.advance(stream, partition, first, last)`): a batch of which any entry is done
//! already does nothing. At the start each consumer takes
//! its share (partition `p` goes to consumer `p % consumers`); a task per partition it
//! holds reads that partition in order.
use super::consumer::{ConsumerArgs, Stats};
use super::Config;
use anyhow::{bail, Context, Result};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamReadOptions, StreamReadReply};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Partitions of the log: twenty per consumer of the guide's three, as many as the 60
/// handler tasks of the other strategies (a log's parallelism is its partitions: each is
/// processed in order, by one task).
pub const PARTITIONS: u32 = 60;
/// Entries read per batch (and per transaction).
pub const BATCH: usize = 10;
/// The first key of the advisory locks that say who reads a partition.
pub const EXPERIMENT_LOCK: i32 = 0x6465_6475; // "dedu"
/// How often a consumer tries to take over partitions nobody holds.
pub const TAKE_OVER_EVERY: Duration = Duration::from_millis(250);

/// The Redis stream of partition `p`.
pub fn stream(p: u32) -> String {
    format!("jobs-{p}")
}

/// The `dedup.advance` stream name of a run: the run's scope, so runs never meet.
pub fn db_stream(scope: &str) -> String {
    format!("{scope}/jobs")
}

/// The position of a stream entry id `<ms>-<seq>`: `ms * 2^20 + seq`.
pub fn position(id: &str) -> Result<i64> {
    let (ms, seq) = id.split_once('-').context("an entry id is <ms>-<seq>")?;
    let (ms, seq): (i64, i64) = (ms.parse()?, seq.parse()?);
    if !(0..1 << 20).contains(&seq) || !(0..1 << 43).contains(&ms) {
        bail!("entry id {id} is outside the positions a bigint maps");
    }
    Ok(ms << 20 | seq)
}

/// The entry id of a position (the inverse of [`position`]).
pub fn entry_id(position: i64) -> String {
    format!("{}-{}", position >> 20, position & ((1 << 20) - 1))
}

/// Publish every job once, into its partition; the positions of each partition's entries,
/// in order.
pub async fn publish(r: &mut MultiplexedConnection, cfg: &Config) -> Result<Vec<Vec<i64>>> {
    let mut positions = vec![Vec::new(); PARTITIONS as usize];
    let jobs: Vec<u32> = (1..=cfg.jobs).collect();
    for chunk in jobs.chunks(500) {
        let mut pipe = redis::pipe();
        for job in chunk {
            pipe.cmd("XADD")
                .arg(stream(job % PARTITIONS))
                .arg("*")
                .arg("job")
                .arg(job);
        }
        let ids: Vec<String> = pipe.query_async(r).await?;
        for (job, id) in chunk.iter().zip(ids) {
            positions[(job % PARTITIONS) as usize].push(position(&id)?);
        }
    }
    Ok(positions)
}

/// How far the consumers got: (entries at or below their partition's mark, whether every
/// mark reached its partition's last entry).
pub async fn progress(
    pg: &tokio_postgres::Client,
    scope: &str,
    positions: &[Vec<i64>],
) -> Result<(u64, bool)> {
    let mut marks = vec![None; positions.len()];
    for row in pg
        .query(
            "SELECT partition, position FROM dedup.offsets WHERE stream = $1",
            &[&db_stream(scope)],
        )
        .await?
    {
        let (p, mark): (i32, i64) = (row.get(0), row.get(1));
        if let Some(m) = marks.get_mut(p as usize) {
            *m = Some(mark);
        }
    }
    let mut covered = 0u64;
    let mut done = true;
    for (entries, mark) in positions.iter().zip(marks) {
        let n = mark.map_or(0, |m| entries.partition_point(|&e| e <= m));
        covered += n as u64;
        done &= n == entries.len();
    }
    Ok((covered, done))
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    reclaimed: AtomicU64,
    effects: AtomicU64,
    skipped: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn report(&self) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = Stats {
            delivered: g(&self.delivered),
            reclaimed: g(&self.reclaimed),
            effects: g(&self.effects),
            skipped: g(&self.skipped),
            busy: 0,
            errors: g(&self.errors),
        };
        println!("stats {}", serde_json::to_string(&s).unwrap_or_default());
    }
}

/// One delivery of a batch of partition `p`: in one transaction, `dedup.advance` to the
/// batch's last position, and only if it raised the mark, the effects. Returns whether the
/// effects ran.
async fn deliver(
    pg: &tokio_postgres::Client,
    args: &ConsumerArgs,
    p: u32,
    batch: &[(i64, i64)],
) -> Result<bool> {
    let (Some(&(first, _)), Some(&(last, _))) = (batch.first(), batch.last()) else {
        return Ok(false);
    };
    pg.batch_execute("BEGIN").await?;
    // The batch's first and last positions: false if any of it is done already (by
    // another consumer of the partition, during a take-over), not only all of it.
    let raised: bool = pg
        .query_one(
            "SELECT dedup.advance($1, $2, $3, $4)",
            &[&db_stream(&args.scope), &(p as i32), &first, &last],
        )
        .await?
        .get(0);
    if !raised {
        // Delivered before: at or below the partition's mark.
        pg.batch_execute("ROLLBACK").await?;
        return Ok(false);
    }
    for (_, job) in batch {
        if !args.work.is_zero() {
            tokio::time::sleep(args.work).await;
        }
        pg.execute(
            "INSERT INTO effects (job_id, consumer) VALUES ($1, $2)",
            &[job, &args.name],
        )
        .await?;
    }
    pg.batch_execute("COMMIT").await?;
    Ok(true)
}

/// The next batch of partition `p` after the database's mark: (position, job) pairs.
async fn read_batch(
    pg: &tokio_postgres::Client,
    r: &mut MultiplexedConnection,
    scope: &str,
    p: u32,
) -> Result<Vec<(i64, i64)>> {
    let mark: Option<i64> = pg
        .query_one(
            "SELECT dedup.position($1, $2)",
            &[&db_stream(scope), &(p as i32)],
        )
        .await?
        .get(0);
    let after = mark.map_or_else(|| "0-0".to_string(), entry_id);
    let reply: StreamReadReply = r
        .xread_options(
            &[stream(p)],
            &[after],
            &StreamReadOptions::default().count(BATCH),
        )
        .await?;
    let mut batch = Vec::new();
    for key in reply.keys {
        for entry in key.ids {
            let job: i64 = entry.get("job").context("an entry without a job")?;
            batch.push((position(&entry.id)?, job));
        }
    }
    Ok(batch)
}

use redis::AsyncCommands;

/// Read partition `p` until asked to stop, if this task gets its lock: each batch after the
/// database's mark, delivered twice (the second delivery finds the mark raised and does
/// nothing). The lock is taken on the connection that does the work, so that the lock and
/// the work end together (a consumer killed, a connection lost). Returns whether it held
/// the partition.
async fn read_partition(
    args: &ConsumerArgs,
    p: u32,
    mut r: MultiplexedConnection,
    counters: &Counters,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<bool> {
    let pg = crate::connect_when_up(&args.pg_dsn).await?;
    pg.batch_execute(&format!("SET application_name = '{}'", args.name))
        .await?;
    let got: bool = pg
        .query_one(
            "SELECT pg_try_advisory_lock($1, $2)",
            &[&EXPERIMENT_LOCK, &(p as i32)],
        )
        .await?
        .get(0);
    if !got {
        return Ok(false);
    }
    while !*stop.borrow() {
        let batch = read_batch(&pg, &mut r, &args.scope, p).await?;
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        for _ in 0..2 {
            counters
                .delivered
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            let n = batch.len() as u64;
            match deliver(&pg, args, p, &batch).await {
                Ok(true) => counters.effects.fetch_add(n, Ordering::Relaxed),
                Ok(false) => counters.skipped.fetch_add(n, Ordering::Relaxed),
                Err(e) => {
                    let _ = pg.batch_execute("ROLLBACK").await;
                    return Err(e);
                }
            };
        }
    }
    Ok(true)
}

/// The `consumer` subcommand for the `offsets` strategy: consumer `index` of `count`.
pub async fn main(args: ConsumerArgs, index: u32, count: u32) -> Result<()> {
    let client = redis::Client::open(args.redis_url.as_str())?;
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(10)));
    let r = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .context("connecting to Redis")?;
    // The connection that probes the partitions' locks (each partition's task holds its
    // partition's lock on its own connection, the one it works on).
    let locks = crate::connect_when_up(&args.pg_dsn).await?;
    locks
        .batch_execute(&format!("SET application_name = '{}'", args.name))
        .await?;
    let counters = Arc::new(Counters::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        let _ = stop_tx.send(true);
    });
    {
        let counters = counters.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                counters.report();
            }
        });
    }
    println!("ready");

    let started = Instant::now();
    // The partitions this consumer has a task for; a task that ends (its connection lost,
    // an error) leaves the set, and the partition can be taken again.
    let running: Arc<std::sync::Mutex<BTreeSet<u32>>> = Arc::default();
    let mut tasks = Vec::new();
    while !*stop.borrow() {
        // At first only this consumer's share; after a second, any partition nobody holds
        // (its consumer died).
        let share_only = started.elapsed() < Duration::from_secs(1);
        for p in 0..PARTITIONS {
            if running.lock().unwrap().contains(&p) || (share_only && p % count != index) {
                continue;
            }
            // A probe on this consumer's own connection, released at once: is the partition
            // free? The task then takes the lock on its own connection (and may lose a race
            // to another consumer, which is fine).
            let free: bool = locks
                .query_one(
                    "SELECT pg_try_advisory_lock($1, $2) AND pg_advisory_unlock($1, $2)",
                    &[&EXPERIMENT_LOCK, &(p as i32)],
                )
                .await?
                .get(0);
            if !free {
                continue;
            }
            running.lock().unwrap().insert(p);
            let (args, counters, r, stop, running) = (
                args.clone(),
                counters.clone(),
                r.clone(),
                stop.clone(),
                running.clone(),
            );
            let taken_over = p % count != index;
            tasks.push(tokio::spawn(async move {
                match read_partition(&args, p, r, &counters, stop).await {
                    Ok(held) => {
                        if held && taken_over {
                            counters.reclaimed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        eprintln!("{}: partition {p}: {e:#}", args.name);
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                running.lock().unwrap().remove(&p);
            }));
        }
        tokio::time::sleep(TAKE_OVER_EVERY).await;
    }
    for t in tasks {
        let _ = t.await;
    }
    counters.report();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_entry_ids() {
        for id in [
            "0-0",
            "1-0",
            "1700000000000-0",
            "1700000000000-1",
            "1700000000001-0",
        ] {
            assert_eq!(entry_id(position(id).unwrap()), id);
        }
        assert!(position("1700000000000-5").unwrap() < position("1700000000001-0").unwrap());
        assert!(position("1-1048576").is_err());
    }
}
