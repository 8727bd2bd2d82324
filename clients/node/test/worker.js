// One BullMQ worker process of the end-to-end test (bullmq.test.js starts three and kills
// one with SIGKILL). Each job's effect is a receipt row, written in the transaction of its
// claim; some first attempts fail on purpose. On SIGTERM it closes and prints its counts
// as one JSON line.
import pg from 'pg';
import { exactlyOnceWorker } from 'dedup-client/bullmq';

const name = process.env.WORKER_NAME;
const connection = { host: '127.0.0.1', port: Number(process.env.REDIS_PORT) };
const concurrency = 4;
const pool = new pg.Pool({ max: concurrency });
pool.on('error', () => {});
const stats = { name, ran: 0, skipped: 0, failed: 0, retried: 0 };

const worker = exactlyOnceWorker(process.env.QUEUE, async (job, client, { attempt }) => {
  const n = job.data.n;
  // Not retryable: the job fails, and BullMQ must retry it (attempts > 1), not lose it.
  if (n % 13 === 0 && job.attemptsMade === 0) await client.query("SELECT test_raise('P0001')");
  // Retryable: runOnce retries the whole transaction.
  if (n % 10 === 3 && attempt === 1) await client.query("SELECT test_raise('40001')");
  if (n % 10 === 6 && attempt === 1) await client.query("SELECT test_raise('40P01')");
  if (n % 17 === 0 && attempt === 1) {
    await client.query("SELECT set_config('e2e.fail_commit', 'on', true)"); // 40001 at COMMIT
  }
  await client.query('SELECT pg_sleep(0.005)');
  await client.query('INSERT INTO e2e_receipts (key, worker, bull_job) VALUES ($1, $2, $3)',
    [job.data.key, name, job.id]);
  return name;
}, {
  pool,
  connection,
  concurrency,
  name,
  scope: 'e2e',
  key: (job) => job.data.key, // the two copies of a job share it, with distinct BullMQ ids
  // A killed worker's jobs come back within lockDuration + 2 x stalledInterval (~4 s).
  lockDuration: 2000,
  stalledInterval: 1000,
  maxStalledCount: 3,
  onRetry: () => { stats.retried++; },
});
worker.on('completed', (job, value) => { stats[value.ran ? 'ran' : 'skipped']++; });
worker.on('failed', () => { stats.failed++; });
worker.on('error', (err) => console.error(`${name}: ${err.message}`));
process.on('SIGTERM', async () => {
  await worker.close();
  await pool.end();
  console.log(JSON.stringify(stats));
  process.exit(0);
});
await worker.waitUntilReady();
console.log('ready');
