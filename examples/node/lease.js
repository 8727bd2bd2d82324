// A queue consumer whose effect is a call to another service (a payment, an email), with a
// leased claim: dedup.lease, the call with the job id as its idempotency key, a heartbeat
// while it runs, dedup.complete (node-postgres, fetch).
//
// No transaction spans a call to another service, so the claim cannot commit together with
// the effect as in consumer.js. Instead, for every message, each step in a short transaction
// of its own: lease the job; on 'done' acknowledge the message; on 'busy' leave it (another
// consumer holds the job; the queue delivers the message again); on 'acquired' make the
// call, complete the lease, and only then acknowledge. A consumer that dies holding a lease
// loses it when it expires, so the job is never lost; one that dies between the call and
// dedup.complete makes the next holder repeat the call, which the idempotency key turns into
// a no-op at the service.
//
// Environment: DATABASE_URL (else PGHOST, PGDATABASE, ...), CHARGES_URL (the service: a POST
// with an Idempotency-Key header, answering JSON), LEASE_S (default 30), WORKERS
// (concurrent loops sharing a pool; default 4), VISIBILITY_TIMEOUT_S (default 30),
// EXIT_WHEN_EMPTY=1 (exit once every message is acknowledged). The queue is in
// examples/schema.sql.
import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';

const SCOPE = 'charges';
const LEASE_S = Number(process.env.LEASE_S ?? 30);
const CHARGES_URL = process.env.CHARGES_URL ?? 'http://127.0.0.1:8080/charges';
const CALL_TIMEOUT_MS = 60_000; // the heartbeat holds the lease for this long at most
const ME = `node-lease-${process.pid}`;
// done, skipped (done before), busy (held by another consumer), failed
const stats = { done: 0, skipped: 0, busy: 0, failed: 0 };

// [readme:node-pg-lease]
// The external effect, with the job id as its idempotency key: the service does a
// repeated call once. Its JSON answer becomes the job's stored result.
async function charge(jobId) {
  const res = await fetch(CHARGES_URL, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': jobId },
    body: JSON.stringify({ job: jobId, consumer: ME }),
    signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
  });
  if (!res.ok) throw new Error(`charge ${jobId}: HTTP ${res.status}`);
  return res.json();
}

// Extend the lease every third of its duration while the call runs. The returned function
// stops it and waits for an extension in flight, so none lands after complete or release.
function heartbeat(pool, jobId, leaseId) {
  let beat = Promise.resolve();
  const timer = setInterval(() => {
    beat = pool.query('SELECT dedup.extend_lease($1, $2, make_interval(secs => $3), $4)',
      [jobId, leaseId, LEASE_S, SCOPE])
      // YD002: the lease was lost; complete will say so too, and the message stays unacked.
      .then(() => {}, (err) => console.error(`${ME}: heartbeat of ${jobId}: ${err.message}`));
  }, (LEASE_S * 1000) / 3);
  return () => { clearInterval(timer); return beat; };
}

// Lease the job, charge, complete; each statement is a transaction of its own.
// 'acquired': charged now; 'done': done before; both mean: acknowledge the message.
// 'busy': another consumer holds the lease: leave the message unacknowledged.
async function handle(pool, jobId) {
  const { rows: [lease] } = await pool.query(
    'SELECT status, lease_id FROM dedup.lease($1, $2, make_interval(secs => $3))',
    [jobId, SCOPE, LEASE_S]);
  if (lease.status !== 'acquired') return lease.status;
  const stopHeartbeat = heartbeat(pool, jobId, lease.lease_id);
  let answer;
  try {
    answer = await charge(jobId);
  } catch (err) {
    await stopHeartbeat();
    // Give the job back, so the redelivered copy need not wait for the lease to expire.
    // If the call did reach the service, the idempotency key makes the retry harmless.
    await pool.query('SELECT dedup.release_lease($1, $2, $3)', [jobId, lease.lease_id, SCOPE]);
    throw err;
  }
  await stopHeartbeat();
  // YD002 here means the lease expired and another consumer took the job over: it repeats
  // the call (the key makes that a no-op) and completes. Do not acknowledge then: if that
  // consumer dies before completing, the redelivered message is what gets the job done; a
  // copy that finds the job done acknowledges it.
  await pool.query('SELECT dedup.complete($1, $2, $3, $4)',
    [jobId, lease.lease_id, answer, SCOPE]);
  return 'acquired';
}

// Receive a batch; acknowledge a message only once its job is done.
async function consumeBatch(pool, visibilityTimeoutS) {
  const { rows } = await pool.query(
    'SELECT msg_id, job_id FROM queue.receive(10, $1)', [visibilityTimeoutS]);
  for (const { msg_id: msgId, job_id: jobId } of rows) {
    let status;
    try {
      status = await handle(pool, jobId);
    } catch (err) {
      // The call or a query failed. Not acknowledged: the queue delivers it again.
      stats.failed++;
      console.error(`${ME}: job ${jobId} left unacknowledged: ${err.message}`);
      continue;
    }
    if (status === 'busy') {
      stats.busy++; // not acknowledged: if the holder dies, this copy does the job
      continue;
    }
    await pool.query('SELECT queue.ack($1)', [msgId]);
    stats[status === 'acquired' ? 'done' : 'skipped']++;
  }
  return rows.length;
}
// [/readme:node-pg-lease]

async function worker(pool, visibilityTimeoutS, exitWhenEmpty) {
  for (;;) {
    if (await consumeBatch(pool, visibilityTimeoutS) > 0) continue;
    if (exitWhenEmpty) {
      const { rows } = await pool.query('SELECT queue.pending() AS n');
      if (Number(rows[0].n) === 0) return;
    }
    await sleep(100);
  }
}

const workers = Number(process.env.WORKERS ?? 4);
const visibilityTimeoutS = Number(process.env.VISIBILITY_TIMEOUT_S ?? 30);
const exitWhenEmpty = process.env.EXIT_WHEN_EMPTY === '1';
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: workers });
pool.on('error', (err) => console.error(`${ME}: idle connection: ${err.message}`));
try {
  await Promise.all(Array.from({ length: workers }, () =>
    worker(pool, visibilityTimeoutS, exitWhenEmpty)));
} finally {
  await pool.end();
}
const counts = Object.entries(stats).map(([k, n]) => `${k}=${n}`).join(' ');
console.log(`${ME} summary ${counts}`);
