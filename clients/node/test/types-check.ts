// Compiled (never run) by types.test.js with tsc --strict against the installed package's
// .d.ts files, with pg's and bullmq's own types: the README's uses type-check, and the
// lines marked to expect an error fail the check if the types accept anything.
import pg from 'pg';
import { claim, runOnce, runOnceWithResult, lease, complete, extendLease, releaseLease, runLeased,
  DedupError, InTransactionError, NotInTransactionError, checkJobId, RETRYABLE_SQLSTATES } from 'dedup-client';
import { exactlyOnceWorker } from 'dedup-client/bullmq';

const pool = new pg.Pool();
async function main() {
  const client = await pool.connect();
  await client.query('BEGIN');
  const fresh: boolean = await claim(client, 'order-1', 'orders');
  const fresh2: boolean = await claim(client, 42n, undefined, { fingerprint: 'abc' });
  await client.query('COMMIT');
  client.release();
  const ran: boolean = await runOnce(pool, 7, async (c, info) => {
    await c.query('INSERT INTO t VALUES ($1)', [info.jobId]);
  }, { scope: 's', retries: 3, isolationLevel: 'repeatable read' });
  const r = await runOnceWithResult(pool, 'x', async () => 5);
  if (r.ran) { const n: number = r.value; }
  const l = await lease(pool, 'pay-1', { scope: 'payments', seconds: 30 });
  if (l.status === 'acquired' && l.leaseId) {
    const until: Date = await extendLease(pool, 'pay-1', l.leaseId, { scope: 'payments', seconds: 60 });
    await complete(pool, 'pay-1', l.leaseId, { charge: 'ch_1' }, { scope: 'payments' });
    await releaseLease(pool, 'pay-1', l.leaseId);
  }
  try { await lease(client, 'pay-3'); } catch (e) { if (e instanceof InTransactionError) { const c: 'DEDUP_IN_TRANSACTION' = e.code; } }
  const out = await runLeased(pool, 'pay-2', async ({ jobId, leaseId }) => ({ ok: true }));
  try { checkJobId('x'); } catch (e) { if (e instanceof NotInTransactionError || e instanceof DedupError) console.log(e.code); }
  const codes: readonly string[] = RETRYABLE_SQLSTATES;
  const worker = exactlyOnceWorker<{ key: string; amount: number }, string>('payments', async (job, c, info) => {
    await c.query('INSERT INTO receipts VALUES ($1, $2)', [job.data.key, job.data.amount]);
    return `ok ${info.attempt}`;
  }, { pool, connection: { host: '127.0.0.1', port: 6379 }, key: (job) => job.data.key, concurrency: 4,
       stalledInterval: 5000, maxStalledCount: 5, retries: 3 });
  worker.on('completed', (job, value) => { if (value.ran) console.log(value.result); });
  // @ts-expect-error: a pool is required
  exactlyOnceWorker('q', async () => {}, { connection: {} });
  // @ts-expect-error: a job id is a string, number or bigint
  await claim(client, { id: 1 });
}
void main;
