//! A soak: claims, batches, leases and offsets at a steady rate for a while, with the
//! worker pruning and the counters counting, while the server is disrupted every few
//! seconds in turn: a `pg_reload_conf()` with a changed setting, the launcher terminated,
//! a client backend killed (`SIGKILL`: the postmaster restarts every process), the
//! launcher killed the same way, and `pg_ctl restart -m immediate`.
//!
//! Every job is delivered twice, the second copy within three seconds of the first
//! delivery's acknowledgement, and a delivery that fails (its connection lost) is
//! delivered again; each partition's consumer rewinds a few positions from time to time.
//! Afterwards, with every delivery done:
//! - each claim's and each batch's job has exactly one effect, each partition's positions
//!   exactly one each, and each leased job one external effect, or more only when a holder
//!   lost its connection between the effect and `dedup.complete` (the documented repeat);
//! - no claim is older than its retention and 30 s (the worker pruned throughout);
//! - the counters count a final known workload exactly, and keep it across a clean
//!   restart (the counter file is written and read back, not refused);
//! - the resident memory of no dedup process or client backend grew by more than 2 MB
//!   over its life (sampled every 5 s);
//! - the server log has no ERROR, WARNING, FATAL or PANIC but those a disruption explains.
//!
//! `make test` runs a short form (`DEDUP_SOAK_SECS`, 55 s by default, a disruption every
//! `DEDUP_SOAK_EVERY` = 5 s, a retention of `DEDUP_SOAK_RETENTION` = 20 s). `scripts/soak.sh HOURS` runs the long form and prints the
//! same figures.
use crate::common::{ensure_eq, kill9, Ctx};
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::{connect, Conn};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CONSUMERS: usize = 4;
const BATCH: u64 = 5;
/// How long past its retention a claim may stay: the launcher is started again 10 s after it
/// was terminated, and in the short form a disruption comes every 5 s.
const PRUNE_MARGIN_SECS: i64 = 30;
/// Resident memory a process may gain over its life (its first sample to its last).
const RSS_GROWTH_KB: i64 = 2048;

#[derive(Clone, Copy, Debug)]
enum Work {
    Single(u64),
    Batch(u64),
    Lease(u64),
}

struct Delivery {
    work: Work,
    /// 1: the first delivery; 2: the redelivered copy.
    copy: u8,
}

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    claims: AtomicU64,
    duplicates: AtomicU64,
    batches: AtomicU64,
    leases: AtomicU64,
    advances: AtomicU64,
    retried: AtomicU64,
    reconnects: AtomicU64,
    lease_lost: AtomicU64,
}

struct Shared {
    /// Deliveries waiting, by when they are due (and a sequence number).
    queue: Mutex<BTreeMap<(Instant, u64), Delivery>>,
    seq: AtomicU64,
    next_job: AtomicU64,
    producing: AtomicBool,
    /// Per leased job: holders that lost their connection after starting the effect.
    uncertain: Mutex<HashMap<u64, u32>>,
    /// Errors no disruption explains.
    unexpected: Mutex<Vec<String>>,
    counts: Counts,
}

impl Shared {
    fn push(&self, due: Instant, d: Delivery) {
        let seq = self.seq.fetch_add(1, Relaxed);
        self.queue.lock().unwrap().insert((due, seq), d);
    }
    /// A due delivery; when draining, any delivery.
    fn take(&self) -> Option<Delivery> {
        let mut q = self.queue.lock().unwrap();
        let key = *q.keys().next()?;
        if key.0 > Instant::now() && self.producing.load(Relaxed) {
            return None;
        }
        q.remove(&key)
    }
    fn fresh(&self) -> Delivery {
        let n = self.next_job.fetch_add(1, Relaxed);
        let work = match n % 3 {
            0 => Work::Single(n),
            1 => Work::Batch(n),
            _ => Work::Lease(n),
        };
        Delivery { work, copy: 1 }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An error a disruption explains: the connection is gone, or the server is shutting
/// down, restarting or recovering.
fn disrupted(e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || match e.code().map(|c| c.code()) {
            None => true,
            Some(code) => code.starts_with("08") || code.starts_with("57P"),
        }
}

async fn connect_retrying(dsn: &str) -> Result<Conn> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match connect(dsn).await {
            Ok(c) => return Ok(c),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => return Err(e).context("the server did not come back in 120 s"),
        }
    }
}

/// One delivery: Ok(true) when acknowledged, Ok(false) to deliver it again later (a lease
/// held by another), Err when the connection failed under it.
async fn deliver(c: &Conn, shared: &Shared, d: &Delivery) -> Result<bool, tokio_postgres::Error> {
    let counts = &shared.counts;
    match d.work {
        Work::Single(n) => {
            let job = format!("s-{n}");
            c.batch_execute("BEGIN").await?;
            let fresh: bool = c
                .query_one("SELECT dedup.try_claim($1, 'soak')", &[&job])
                .await?
                .get(0);
            if fresh {
                c.execute("INSERT INTO effects VALUES ('single', $1)", &[&job])
                    .await?;
            }
            c.batch_execute("COMMIT").await?;
            let n = if fresh {
                &counts.claims
            } else {
                &counts.duplicates
            };
            n.fetch_add(1, Relaxed);
        }
        Work::Batch(n) => {
            let jobs: Vec<String> = (0..BATCH).map(|i| format!("b-{n}-{i}")).collect();
            c.batch_execute("BEGIN").await?;
            let claimed = c
                .query(
                    "INSERT INTO effects SELECT 'batch', j \
                       FROM dedup.try_claim_many($1::text[], 'soak-batch') AS j RETURNING job",
                    &[&jobs],
                )
                .await?
                .len() as u64;
            c.batch_execute("COMMIT").await?;
            counts.batches.fetch_add(1, Relaxed);
            counts.claims.fetch_add(claimed, Relaxed);
            counts.duplicates.fetch_add(BATCH - claimed, Relaxed);
        }
        Work::Lease(n) => {
            let job = format!("l-{n}");
            let row = c
                .query_one(
                    "SELECT status, lease_id FROM dedup.lease($1, 'soak-lease', '3 s')",
                    &[&job],
                )
                .await?;
            let status: String = row.get(0);
            counts.leases.fetch_add(1, Relaxed);
            match status.as_str() {
                "done" => {
                    counts.duplicates.fetch_add(1, Relaxed);
                }
                "busy" => return Ok(false),
                _ => {
                    let lease: uuid::Uuid = row.get(1);
                    // The external effect: its own transaction, not the lease's.
                    *shared.uncertain.lock().unwrap().entry(n).or_default() += 1;
                    c.execute("INSERT INTO external VALUES ($1)", &[&job])
                        .await?;
                    match c
                        .execute(
                            "SELECT dedup.complete($1, $2, '{\"ok\": true}', 'soak-lease')",
                            &[&job, &lease],
                        )
                        .await
                    {
                        Ok(_) => {
                            let mut u = shared.uncertain.lock().unwrap();
                            let left = u.get_mut(&n).unwrap();
                            *left -= 1;
                            if *left == 0 {
                                u.remove(&n);
                            }
                        }
                        // The lease expired while a restart held this holder up, and
                        // another took the job over: the documented repeat.
                        Err(e) if e.code().map(|s| s.code()) == Some("YD002") => {
                            counts.lease_lost.fetch_add(1, Relaxed);
                        }
                        Err(e) => return Err(e),
                    }
                    counts.claims.fetch_add(1, Relaxed);
                }
            }
        }
    }
    Ok(true)
}

/// The consumer of partition `part`: it processes positions in order, rewinding a few
/// now and then (a redelivery), and after a reconnection resumes a few before its last.
struct Partition {
    part: i32,
    next: i64,
    done: i64,
}

async fn advance(
    c: &Conn,
    shared: &Shared,
    p: &mut Partition,
) -> Result<(), tokio_postgres::Error> {
    let pos = p.next;
    c.batch_execute("BEGIN").await?;
    let raised: bool = c
        .query_one(
            "SELECT dedup.advance('soak-stream', $1, $2)",
            &[&p.part, &pos],
        )
        .await?
        .get(0);
    if raised {
        c.execute(
            "INSERT INTO effects VALUES ('offset', $1)",
            &[&format!("{}:{pos}", p.part)],
        )
        .await?;
    }
    c.batch_execute("COMMIT").await?;
    shared.counts.advances.fetch_add(1, Relaxed);
    // Rewind after a position's first delivery only, or the consumer would loop.
    let first = pos > p.done;
    p.done = p.done.max(pos);
    p.next = if first && pos % 50 == 49 {
        pos - 4
    } else {
        pos + 1
    };
    Ok(())
}

async fn consumer(i: usize, dsn: String, shared: Arc<Shared>, pace: Duration) -> Result<()> {
    let dsn = format!("{dsn} application_name=soak-{i}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
    let mut p = Partition {
        part: i as i32,
        next: 0,
        done: -1,
    };
    loop {
        let c = connect_retrying(&dsn).await?;
        loop {
            let drained = !shared.producing.load(Relaxed);
            if rng.random_range(0..4) == 0 && (!drained || p.next <= p.done) {
                if let Err(e) = advance(&c, &shared, &mut p).await {
                    p.next = (p.done - 3).max(0);
                    if !disrupted(&e) {
                        shared
                            .unexpected
                            .lock()
                            .unwrap()
                            .push(format!("advance: {e}"));
                    }
                    break;
                }
                continue;
            }
            let d = match shared.take() {
                Some(d) => d,
                None if !drained => shared.fresh(),
                None if shared.queue.lock().unwrap().is_empty() && p.next > p.done => return Ok(()),
                None => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            shared.counts.ops.fetch_add(1, Relaxed);
            match deliver(&c, &shared, &d).await {
                Ok(true) if d.copy == 1 => {
                    let later = Duration::from_millis(rng.random_range(0..3000));
                    shared.push(
                        Instant::now() + later,
                        Delivery {
                            work: d.work,
                            copy: 2,
                        },
                    );
                }
                Ok(true) => {}
                Ok(false) => {
                    shared.push(Instant::now() + Duration::from_millis(500), d);
                }
                Err(e) => {
                    shared.counts.retried.fetch_add(1, Relaxed);
                    if !disrupted(&e) {
                        shared
                            .unexpected
                            .lock()
                            .unwrap()
                            .push(format!("{:?}: {e}", d.work));
                    }
                    shared.push(Instant::now() + Duration::from_millis(500), d);
                    break;
                }
            }
            tokio::time::sleep(pace).await;
        }
        shared.counts.reconnects.fetch_add(1, Relaxed);
    }
}

/// RssAnon of a process, in kB (None once it is gone).
fn rss_anon_kb(pid: i32) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[derive(Default)]
struct Memory {
    /// pid -> (what, first sample, last sample, samples).
    by_pid: HashMap<i32, (String, i64, i64, u32)>,
    /// The sum over the processes of the latest sample.
    latest_total: i64,
}

/// How far behind pruning is, sampled with the memory: the age of the oldest done claim,
/// the worst seen and when, and when it first passed the bound the end checks.
#[derive(Default)]
struct Lag {
    latest: f64,
    worst: (f64, u64),
    first_over: Option<u64>,
}

impl Lag {
    async fn sample(&mut self, c: &Conn, at: u64, bound: f64) -> Result<()> {
        let age: f64 = c
            .query_one(
                "SELECT coalesce(extract(epoch FROM now() - min(processed_at)), 0)::float8 \
                   FROM dedup.processed WHERE lease_expires_at IS NULL",
                &[],
            )
            .await?
            .get(0);
        self.latest = age;
        if age > self.worst.0 {
            self.worst = (age, at);
        }
        if age > bound && self.first_over.is_none() {
            self.first_over = Some(at);
        }
        Ok(())
    }
}

impl Memory {
    async fn sample(&mut self, c: &Conn) -> Result<()> {
        let mut total = 0;
        for r in c
            .query(
                "SELECT pid, CASE WHEN backend_type LIKE 'dedup%' THEN backend_type \
                                  ELSE 'client backend' END \
                   FROM pg_stat_activity \
                  WHERE backend_type LIKE 'dedup%' OR application_name LIKE 'soak-%'",
                &[],
            )
            .await?
        {
            let pid: i32 = r.get(0);
            if let Some(kb) = rss_anon_kb(pid) {
                total += kb;
                let e = self
                    .by_pid
                    .entry(pid)
                    .or_insert_with(|| (r.get(1), kb, kb, 0));
                // From its second sample: its caches are warm by then.
                if e.3 == 1 {
                    e.1 = kb;
                }
                e.2 = kb;
                e.3 += 1;
            }
        }
        self.latest_total = total;
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Disruption {
    Reload,
    TerminateLauncher,
    KillBackend,
    KillLauncher,
    ImmediateRestart,
}

/// One turn of disruptions, repeated.
const ROTATION: [Disruption; 6] = [
    Disruption::Reload,
    Disruption::TerminateLauncher,
    Disruption::KillBackend,
    Disruption::Reload,
    Disruption::KillLauncher,
    Disruption::ImmediateRestart,
];

impl Disruption {
    /// Its name in the figures.
    fn name(self) -> &'static str {
        match self {
            Disruption::Reload => "reloads",
            Disruption::TerminateLauncher => "launcher terminated",
            Disruption::KillBackend => "backend killed (kill -9)",
            Disruption::KillLauncher => "launcher killed (kill -9)",
            Disruption::ImmediateRestart => "restarts -m immediate",
        }
    }
}

async fn disrupt(
    what: Disruption,
    cluster: &mut Option<Cluster>,
    dsn: &str,
    rng: &mut rand::rngs::StdRng,
) -> Result<()> {
    if let Disruption::ImmediateRestart = what {
        let mut c = cluster.take().unwrap();
        let c = tokio::task::spawn_blocking(move || -> Result<Cluster> {
            c.stop("immediate")?;
            c.start_again()?;
            Ok(c)
        })
        .await??;
        *cluster = Some(c);
        return Ok(());
    }
    let admin = connect_retrying(dsn).await?;
    let pid_of = |sql: &'static str| {
        let admin = &admin;
        async move {
            Ok::<_, anyhow::Error>(
                admin
                    .query(sql, &[])
                    .await?
                    .first()
                    .map(|r| r.get::<_, i32>(0)),
            )
        }
    };
    match what {
        Disruption::Reload => {
            let size = rng.random_range(100..5000).to_string();
            admin
                .batch_execute(&format!("ALTER SYSTEM SET dedup.prune_batch_size = {size}"))
                .await?;
            admin.batch_execute("SELECT pg_reload_conf()").await?;
        }
        Disruption::TerminateLauncher => {
            admin
                .batch_execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                      WHERE backend_type = 'dedup launcher'",
                )
                .await?;
        }
        Disruption::KillBackend => {
            if let Some(pid) = pid_of(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'soak-%' \
                  ORDER BY random() LIMIT 1",
            )
            .await?
            {
                kill9(pid)?;
            }
        }
        Disruption::KillLauncher => {
            if let Some(pid) =
                pid_of("SELECT pid FROM pg_stat_activity WHERE backend_type = 'dedup launcher'")
                    .await?
            {
                kill9(pid)?;
            }
        }
        Disruption::ImmediateRestart => unreachable!(),
    }
    Ok(())
}

/// Log lines at WARNING or above that a disruption explains.
const EXPECTED_IN_LOG: &[&str] = &[
    "terminating connection because of crash of another server process",
    "terminating connection due to administrator command",
    "terminating background worker \"dedup",
    "terminating dedup",
    "the database system is in recovery mode",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "is not held: the job is leased under another lease_id",
    "is not held: the lease was completed already",
    "could not send data to client",
    "connection to client lost",
];

pub async fn steady_load_with_disruptions_keeps_every_effect_once(_ctx: Ctx) -> Result<()> {
    let secs = env_u64("DEDUP_SOAK_SECS", 55);
    // Shorter than a minute in the short form, so that it prunes: the copies come within
    // seconds. The server warns of it at every start (expected in the log below).
    let retention = env_u64("DEDUP_SOAK_RETENTION", 20) as i64;
    let every = Duration::from_secs(env_u64("DEDUP_SOAK_EVERY", 5));
    let pace = Duration::from_millis(env_u64("DEDUP_SOAK_PACE_MS", 5));
    let cluster = tokio::task::spawn_blocking(move || {
        Cluster::start(
            Options::named("soak")
                .set("shared_preload_libraries", "dedup")
                .set("dedup.prune_interval", "1s")
                .set("dedup.retention", &format!("{retention}s"))
                .set("max_connections", "40"),
        )
    })
    .await??;
    cluster.create_db_with_extension("soak")?;
    cluster.psql(
        "soak",
        "CREATE TABLE effects (kind text NOT NULL, job text NOT NULL);
         CREATE TABLE external (job text NOT NULL);",
    )?;
    let dsn = cluster.dsn("soak");
    let mut cluster = Some(cluster);
    let shared = Arc::new(Shared {
        queue: Mutex::new(BTreeMap::new()),
        seq: AtomicU64::new(0),
        next_job: AtomicU64::new(0),
        producing: AtomicBool::new(true),
        uncertain: Mutex::new(HashMap::new()),
        unexpected: Mutex::new(Vec::new()),
        counts: Counts::default(),
    });
    let started = Instant::now();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|i| tokio::spawn(consumer(i, dsn.clone(), shared.clone(), pace)))
        .collect();

    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let mut memory = Memory::default();
    let mut lag = Lag::default();
    let bound = (retention + PRUNE_MARGIN_SECS) as f64;
    let mut disruptions: BTreeMap<&str, u32> = BTreeMap::new();
    let mut slot = 0usize;
    let mut next_disruption = Instant::now() + every;
    let mut next_sample = Instant::now();
    let mut rss_total_start: Option<i64> = None;
    let mut next_progress = Instant::now() + Duration::from_secs(600);
    while started.elapsed() < Duration::from_secs(secs) {
        if Instant::now() >= next_progress {
            println!(
                "  soak at {} s: {} deliveries, {} advances, disruptions {disruptions:?}, RssAnon of the dedup processes and client backends {} kB, oldest claim {:.0} s (worst {:.0} s at {} s)",
                started.elapsed().as_secs(),
                shared.counts.ops.load(Relaxed),
                shared.counts.advances.load(Relaxed),
                memory.latest_total,
                lag.latest,
                lag.worst.0,
                lag.worst.1,
            );
            next_progress = Instant::now() + Duration::from_secs(600);
        }
        if Instant::now() >= next_sample {
            if let Ok(c) = connect(&dsn).await {
                let _ = memory.sample(&c).await;
                let _ = lag.sample(&c, started.elapsed().as_secs(), bound).await;
            }
            if rss_total_start.is_none() && started.elapsed() > Duration::from_secs(10) {
                rss_total_start = Some(memory.latest_total);
            }
            next_sample = Instant::now() + Duration::from_secs(5);
        }
        if Instant::now() >= next_disruption {
            let what = ROTATION[slot % ROTATION.len()];
            let name = what.name();
            disrupt(what, &mut cluster, &dsn, &mut rng)
                .await
                .with_context(|| format!("disruption: {name}"))?;
            *disruptions.entry(name).or_default() += 1;
            slot += 1;
            next_disruption = Instant::now() + every;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        for c in &consumers {
            if c.is_finished() {
                bail!("a consumer stopped early");
            }
        }
    }
    // Drain: no new jobs; every delivery waiting is made, due or not.
    shared.producing.store(false, Relaxed);
    let mut last = Memory::default();
    if let Ok(c) = connect(&dsn).await {
        last.sample(&c).await?;
    }
    for c in consumers {
        tokio::time::timeout(Duration::from_secs(180), c)
            .await
            .context("the consumers did not drain the queue in 180 s")???;
    }
    let elapsed = started.elapsed();
    let unexpected = shared.unexpected.lock().unwrap().clone();
    if !unexpected.is_empty() {
        bail!(
            "{} errors no disruption explains, the first: {:?}",
            unexpected.len(),
            &unexpected[..unexpected.len().min(5)]
        );
    }

    // Every effect exactly once.
    let c = connect_retrying(&dsn).await?;
    let jobs = shared.next_job.load(Relaxed);
    let want = |k: u64| (0..jobs).filter(|n| n % 3 == k).count() as i64;
    for (kind, expected) in [("single", want(0)), ("batch", want(1) * BATCH as i64)] {
        let r = c
            .query_one(
                "SELECT count(*), count(DISTINCT job) FROM effects WHERE kind = $1",
                &[&kind],
            )
            .await?;
        ensure_eq(
            (r.get::<_, i64>(0), r.get::<_, i64>(1)),
            (expected, expected),
            &format!("{kind} effects (rows, distinct jobs)"),
        )?;
    }
    let external: HashMap<String, i64> = c
        .query("SELECT job, count(*) FROM external GROUP BY job", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    ensure_eq(
        external.len() as i64,
        want(2),
        "leased jobs with an external effect",
    )?;
    let uncertain = shared.uncertain.lock().unwrap().clone();
    let mut repeats = 0;
    for (job, n) in &external {
        let id: u64 = job[2..].parse()?;
        let allowed = 1 + i64::from(uncertain.get(&id).copied().unwrap_or(0));
        if *n > allowed {
            bail!("leased job {job} has {n} external effects, and only {} of its holders lost their connection during the effect", allowed - 1);
        }
        repeats += n - 1;
    }
    let mut positions = 0;
    for part in 0..CONSUMERS as i32 {
        let r = c
            .query_one(
                "SELECT count(*), count(DISTINCT job), \
                        coalesce(max(split_part(job, ':', 2)::int8), -1), \
                        dedup.position('soak-stream', $1) \
                   FROM effects WHERE kind = 'offset' AND split_part(job, ':', 1)::int = $1",
                &[&part],
            )
            .await?;
        let (rows, distinct, max, mark): (i64, i64, i64, Option<i64>) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        ensure_eq(
            (rows, distinct, mark.unwrap_or(-1)),
            (max + 1, max + 1, max),
            &format!("partition {part}: effects, distinct positions, the mark"),
        )?;
        positions += rows;
    }
    // Pruned throughout: no claim older than its retention and a margin.
    let old: i64 = c
        .query_one(
            &format!(
                "SELECT count(*) FROM dedup.processed \
                  WHERE processed_at < now() - interval '{} s' AND lease_expires_at IS NULL",
                retention + PRUNE_MARGIN_SECS
            ),
            &[],
        )
        .await?
        .get(0);
    if old != 0 {
        let detail: Vec<String> = c
            .query(
                "SELECT scope || ': ' || count(*) || ' from ' || min(now() - processed_at)::text \
                        || ' to ' || max(now() - processed_at)::text FROM dedup.processed \
                  WHERE processed_at < now() - $1 * interval '1 s' GROUP BY scope \
                 UNION ALL SELECT 'last pass ' || (now() - last_pass_at)::text || ' ago, ' \
                        || rows_deleted || ' deleted' FROM dedup.prune_status WHERE scope IS NULL",
                &[&((retention + PRUNE_MARGIN_SECS) as f64)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        // When pruning fell behind, and what the server said about it.
        let log = cluster.as_ref().map(|cl| cl.log_text()).unwrap_or_default();
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("dedup") || l.contains("FATAL") || l.contains("PANIC"))
            .collect();
        bail!(
            "{old} claims older than the retention and {PRUNE_MARGIN_SECS} s: {detail:?}; \
             the oldest claim passed that first at {:?} s of {:.0}, the worst {:.0} s at {} s; \
             the server's last lines about dedup:\n{}",
            lag.first_over,
            elapsed.as_secs_f64(),
            lag.worst.0,
            lag.worst.1,
            said[said.len().saturating_sub(40)..].join("\n")
        );
    }
    let live: i64 = c
        .query_one("SELECT count(*) FROM dedup.processed", &[])
        .await?
        .get(0);
    let claimed = want(0) + want(1) * BATCH as i64 + want(2);
    if elapsed > Duration::from_secs((retention + PRUNE_MARGIN_SECS) as u64) && live >= claimed {
        bail!("{live} claims left of {claimed}: the worker pruned none");
    }

    // The counters count a known workload exactly, and keep it across a clean restart.
    c.batch_execute("SELECT dedup.stats_reset()").await?;
    let final_counts =
        "SELECT coalesce(sum(claims), 0)::int8, coalesce(sum(duplicates), 0)::int8, \
                               coalesce(sum(batches), 0)::int8, coalesce(sum(advances), 0)::int8 \
                          FROM dedup.stats WHERE scope IN ('soak-final', 'soak-final-stream')";
    c.batch_execute(
        "BEGIN;
         SELECT dedup.try_claim('f-' || g, 'soak-final') FROM generate_series(1, 100) g;
         SELECT dedup.try_claim('f-' || g, 'soak-final') FROM generate_series(1, 100) g;
         SELECT count(*) FROM dedup.try_claim_many(
             ARRAY(SELECT 'f-' || g FROM generate_series(91, 110) g), 'soak-final');
         SELECT dedup.advance('soak-final-stream', 0, g) FROM generate_series(1, 5) g;
         SELECT dedup.advance('soak-final-stream', 0, 3);
         COMMIT;",
    )
    .await?;
    let read = |c: Conn| async move {
        let r = c.query_one(final_counts, &[]).await?;
        Ok::<_, anyhow::Error>((
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
        ))
    };
    let want_counts = (110, 111, 1, 5);
    ensure_eq(
        read(c).await?,
        want_counts,
        "the final workload's (claims, duplicates, batches, advances)",
    )?;
    let mut cl = cluster.take().unwrap();
    let cl = tokio::task::spawn_blocking(move || -> Result<Cluster> {
        cl.stop("fast")?;
        cl.start_again()?;
        Ok(cl)
    })
    .await??;
    let c = connect_retrying(&dsn).await?;
    ensure_eq(
        read(c).await?,
        want_counts,
        "the same counters after a clean restart",
    )?;

    // Memory: no process grew over its life.
    let mut grown: Vec<String> = Vec::new();
    let mut longest: BTreeMap<String, (u32, i64, i64)> = BTreeMap::new();
    for (pid, (what, first, end, samples)) in &memory.by_pid {
        let end = last.by_pid.get(pid).map(|v| v.2).unwrap_or(*end);
        if end - first > RSS_GROWTH_KB {
            grown.push(format!(
                "{what} {pid}: {first} kB to {end} kB over {samples} samples"
            ));
        }
        let l = longest.entry(what.clone()).or_default();
        if *samples > l.0 {
            *l = (*samples, *first, end);
        }
    }
    let log = cl.log_text();
    let mut odd: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["ERROR:", "WARNING:", "FATAL:", "PANIC:"]
                .iter()
                .any(|s| l.contains(s))
        })
        .filter(|l| !EXPECTED_IN_LOG.iter().any(|e| l.contains(e)))
        .filter(|l| !(retention < 60 && l.contains("is shorter than a minute")))
        .collect();
    odd.dedup();
    let refused = log.contains("dedup: ignoring");

    let n = |a: &AtomicU64| a.load(Relaxed);
    let counts = &shared.counts;
    println!(
        "  soak: {:.0} s, {} deliveries ({} jobs: {} claims, {} duplicates; {} batches, {} leases, {} advances over {positions} positions), \
         {} retried after a disruption, {} reconnections, {} leases lost to a takeover, {repeats} repeated external effects",
        elapsed.as_secs_f64(),
        n(&counts.ops),
        jobs,
        n(&counts.claims),
        n(&counts.duplicates),
        n(&counts.batches),
        n(&counts.leases),
        n(&counts.advances),
        n(&counts.retried),
        n(&counts.reconnects),
        n(&counts.lease_lost),
    );
    println!("  disruptions: {disruptions:?}; claims left {live} of {claimed}");
    for (what, (samples, first, end)) in &longest {
        println!(
            "  RssAnon of the longest-lived {what}: {first} kB at its first sample, {end} kB after {samples} samples ({} s)",
            samples * 5
        );
    }
    if let Some(start) = rss_total_start {
        let end = last.latest_total;
        println!("  RssAnon of every dedup process and client backend: {start} kB at 10 s, {end} kB at the end");
    }
    if !grown.is_empty() {
        bail!("resident memory grew by more than {RSS_GROWTH_KB} kB: {grown:?}");
    }
    if refused {
        bail!("the counter file was refused:\n{}", cl.log_tail(30));
    }
    if !odd.is_empty() {
        bail!(
            "{} log lines no disruption explains, the first: {:?}",
            odd.len(),
            &odd[..odd.len().min(8)]
        );
    }
    Ok(())
}
