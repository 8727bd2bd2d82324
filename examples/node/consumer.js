// A queue consumer that does each job's effect exactly once with dedup.try_claim
// (node-postgres).
//
// For every message: claim its job and write the effect in one transaction, commit, and
// only then acknowledge the message. A message whose transaction did not commit is not
// acknowledged, so the queue delivers it again. The whole transaction is retried on
// serialization failure (40001) and deadlock (40P01).
//
// Environment: DATABASE_URL (else PGHOST, PGDATABASE, ...), WORKERS (concurrent loops
// sharing a pool; default 4), VISIBILITY_TIMEOUT_S (default 30), EXIT_WHEN_EMPTY=1 (exit
// once every message is acknowledged). The queue and the receipts table are in
// examples/schema.sql.
import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';

const MAX_ATTEMPTS = 5;
const ME = `node-${process.pid}`;
// The guide's diagnostic hook: a rise in `skipped` means more duplicates are arriving.
const stats = { done: 0, skipped: 0, retried: 0, failed: 0 };

// [readme:node-pg]
const RETRYABLE = new Set(['40001', '40P01']); // serialization_failure, deadlock_detected

// Claim the job and write its effect in one transaction, retried on 40001 and 40P01.
// true: done now; false: done before. Either way it committed: acknowledge the message.
async function handle(pool, jobId) {
  for (let attempt = 1; ; attempt++) {
    const client = await pool.connect();
    let broken = false;
    try {
      await client.query('BEGIN');
      const { rows } = await client.query('SELECT dedup.try_claim($1) AS fresh', [jobId]);
      if (rows[0].fresh) {
        await client.query('INSERT INTO receipts (job_id, consumer) VALUES ($1, $2)', [jobId, ME]);
      }
      // An effect outside the database (an email, a payment) cannot join this
      // transaction: lease it instead (lease.js).
      await client.query('COMMIT');
      return rows[0].fresh;
    } catch (err) {
      // After a failed COMMIT this ROLLBACK only warns; if it fails, the connection is gone.
      broken = await client.query('ROLLBACK').then(() => false, () => true);
      if (!RETRYABLE.has(err.code) || attempt === MAX_ATTEMPTS) throw err;
    } finally {
      client.release(broken); // true: close the connection instead of reusing it
    }
    stats.retried++;
    await sleep(10 * 2 ** attempt);
  }
}

// Receive a batch; acknowledge each message only after its transaction committed.
async function consumeBatch(pool, visibilityTimeoutS) {
  const { rows } = await pool.query(
    'SELECT msg_id, job_id FROM queue.receive(10, $1)', [visibilityTimeoutS]);
  for (const { msg_id: msgId, job_id: jobId } of rows) {
    let fresh;
    try {
      fresh = await handle(pool, jobId);
    } catch (err) {
      if (!(err instanceof pg.DatabaseError)) throw err; // a bug, or the connection is gone
      // Not acknowledged: the queue delivers it again after the visibility timeout.
      stats.failed++;
      console.error(`${ME}: job ${jobId} left unacknowledged: ${err.message}`);
      continue;
    }
    await pool.query('SELECT queue.ack($1)', [msgId]);
    stats[fresh ? 'done' : 'skipped']++;
  }
  return rows.length;
}
// [/readme:node-pg]

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
