// End to end with BullMQ and Redis: 300 jobs, each added twice (distinct BullMQ ids, the
// same dedup key), three worker processes, one killed with SIGKILL a quarter of the way,
// injected errors; every job's receipt exactly once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue, QueueEvents, Worker } from 'bullmq';
import { exactlyOnceWorker } from 'dedup-client/bullmq';
import { newPool, sql, redisConnection, RAISE_SQL } from './helpers.js';

const N = 300;
const QUEUE = 'e2e-receipts';
const DRAIN_TIMEOUT_MS = 60_000;
let pool;
const children = [];

before(async () => {
  pool = newPool(2);
  await pool.query(RAISE_SQL);
  await pool.query(`
    DROP TABLE IF EXISTS e2e_receipts;
    CREATE TABLE e2e_receipts (key text NOT NULL, worker text, bull_job text, at timestamptz DEFAULT clock_timestamp());
    CREATE OR REPLACE FUNCTION e2e_fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF current_setting('e2e.fail_commit', true) = 'on' THEN PERFORM test_raise('40001'); END IF;
      RETURN NULL;
    END $$;
    CREATE CONSTRAINT TRIGGER e2e_fail_at_commit AFTER INSERT ON e2e_receipts
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION e2e_fail_at_commit();
    DELETE FROM dedup.processed WHERE scope = 'e2e';`);
});

after(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await pool.end();
});

function startWorker(name) {
  const child = spawn(process.execPath, ['worker.js'], {
    env: { ...process.env, WORKER_NAME: name, QUEUE },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  const lines = [];
  createInterface({ input: child.stdout }).on('line', (l) => lines.push(l));
  return { name, child, lines };
}

async function until(what, timeoutMs, check) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const state = await check();
    if (state.done) return state;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(state)}`);
    await sleep(100);
  }
}

test(`BullMQ: ${N} jobs added twice, 3 workers, one SIGKILLed: 0 duplicates, 0 missing`, async () => {
  const queue = new Queue(QUEUE, { connection: redisConnection });
  const events = new QueueEvents(QUEUE, { connection: redisConnection });
  try {
    await queue.obliterate({ force: true });
    await events.waitUntilReady();
    let stalled = 0;
    events.on('stalled', () => { stalled++; });

    const workers = ['w0', 'w1', 'w2'].map(startWorker);
    await until('the workers', 20_000, () => ({ done: workers.every((w) => w.lines.includes('ready')) }));

    // Each job twice, the second copy a few jobs after the first.
    const opts = (id) => ({ jobId: id, attempts: 5, backoff: { type: 'fixed', delay: 100 } });
    const jobs = [];
    for (let n = 0; n < N + 5; n++) {
      if (n < N) jobs.push({ name: 'receipt', data: { key: `key-${n}`, n }, opts: opts(`${n}-a`) });
      if (n >= 5) jobs.push({ name: 'receipt', data: { key: `key-${n - 5}`, n: n - 5 }, opts: opts(`${n - 5}-b`) });
    }
    await queue.addBulk(jobs);

    // SIGKILL w0 a quarter of the way, while it holds jobs.
    await until('a quarter of the receipts', 30_000, async () => {
      const [{ n }] = await sql(pool, 'SELECT count(*)::int AS n FROM e2e_receipts');
      return { done: n >= N / 4, n };
    });
    workers[0].child.kill('SIGKILL');
    const killedHeld = (await queue.getJobs(['active'])).filter((j) => j.processedBy === 'w0').map((j) => j.id);

    const counts = await until('the queue to drain', DRAIN_TIMEOUT_MS, async () => {
      const c = await queue.getJobCounts('completed', 'failed', 'active', 'wait', 'delayed', 'prioritized');
      return { done: c.completed + c.failed === 2 * N, ...c };
    });
    for (const w of workers.slice(1)) w.child.kill('SIGTERM');
    await Promise.all(workers.slice(1).map((w) => once(w.child, 'exit')));
    const stats = workers.slice(1).map((w) => JSON.parse(w.lines.at(-1)));

    // Every job's receipt exactly once.
    const dups = await sql(pool, 'SELECT key, count(*)::int AS n FROM e2e_receipts GROUP BY key HAVING count(*) > 1');
    const [{ keys }] = await sql(pool, 'SELECT count(DISTINCT key)::int AS keys FROM e2e_receipts');
    const missing = N - keys;
    console.log(`# e2e: ${2 * N} deliveries of ${N} jobs; w0 killed holding ${killedHeld.length} jobs; ` +
      `${stalled} stalled jobs came back; duplicates ${dups.length}, missing ${missing}; ` +
      `survivors ${JSON.stringify(stats)}`);
    assert.deepEqual(dups, [], 'duplicates');
    assert.equal(missing, 0, 'missing');
    assert.equal((await sql(pool, "SELECT count(*)::int AS n FROM dedup.processed WHERE scope = 'e2e'"))[0].n, N);

    // BullMQ completed every job, failed none.
    assert.equal(counts.completed, 2 * N);
    assert.equal(counts.failed, 0);
    // The kill landed mid-run, and its jobs came back through the stalled-job checker.
    assert.ok(killedHeld.length > 0, 'w0 held jobs when it was killed');
    assert.ok(stalled >= killedHeld.length, `stalled ${stalled} >= held ${killedHeld.length}`);
    for (const id of killedHeld) {
      const job = await queue.getJob(id);
      assert.equal(await job.getState(), 'completed', `job ${id} of the killed worker`);
      assert.notEqual(job.processedBy, 'w0');
    }
    // Jobs whose handler fails its first run with a non-retryable error: the run that
    // committed was BullMQ's retry of a failed attempt (a copy that found the claim
    // committed completed at once, without running the handler).
    for (let n = 0; n < N; n += 13) {
      const copies = await Promise.all(['a', 'b'].map((c) => queue.getJob(`${n}-${c}`)));
      const attempts = copies.map((j) => `${j.id}: attemptsMade ${j.attemptsMade}, ${JSON.stringify(j.returnvalue)}`);
      assert.ok(copies.some((j) => j.attemptsMade >= 2), attempts.join('; '));
      for (const j of copies) {
        if (j.returnvalue.ran) assert.ok(j.attemptsMade >= 2, attempts.join('; '));
      }
    }
    // Duplicates absorbed by dedup: each job's second copy skipped its handler.
    const completed = await queue.getJobs(['completed'], 0, -1);
    const ran = completed.filter((j) => j.returnvalue.ran).map((j) => j.id);
    assert.ok(ran.length <= N && completed.length - ran.length >= N, `ran ${ran.length} of ${completed.length}`);
    // A job completed as "ran" has its receipt: it was acknowledged after its COMMIT.
    const receiptOf = new Map((await sql(pool, 'SELECT bull_job, worker FROM e2e_receipts'))
      .map((r) => [r.bull_job, r.worker]));
    const unreceipted = ran.filter((id) => !receiptOf.has(id));
    assert.deepEqual(unreceipted, [], 'jobs completed as ran without a committed receipt');
    const committedUnacked = killedHeld.filter((id) => receiptOf.get(id) === 'w0');
    console.log(`# e2e: of the ${killedHeld.length} jobs w0 held, ${committedUnacked.length} had committed ` +
      'before the kill (their rerun found the claim); the others had not (their transaction, if open, died with the connection)');
    for (const id of committedUnacked) assert.equal((await queue.getJob(id)).returnvalue.ran, false);
    // The survivors retried injected 40001/40P01 transactions inside runOnce, and failed jobs.
    assert.ok(stats.reduce((s, x) => s + x.retried, 0) > 0, 'runOnce retries');
    assert.ok(stats.reduce((s, x) => s + x.failed, 0) > 0, 'BullMQ retries');
  } finally {
    await events.close();
    await queue.close();
  }
});

test('BullMQ: a job without a valid key fails at once, with a clear reason, not retried', async () => {
  const name = 'e2e-bad-key';
  const queue = new Queue(name, { connection: redisConnection });
  await queue.obliterate({ force: true });
  const worker = exactlyOnceWorker(name, async () => 'never', {
    pool, connection: redisConnection, key: (job) => job.data.key,
  });
  try {
    const failed = once(worker, 'failed');
    await queue.add('no-key', { other: 1 }, { attempts: 5, backoff: { type: 'fixed', delay: 10 } });
    const [job, err] = await failed;
    assert.equal(err.name, 'UnrecoverableError');
    assert.match(err.message, /no valid key for job .*: dedup checkJobId: jobId must be a non-empty string, a safe integer or a bigint, got undefined/);
    assert.equal(job.attemptsMade, 1);
    assert.equal(await job.getState(), 'failed');
    assert.ok(worker instanceof Worker);
  } finally {
    await worker.close();
    await queue.close();
  }
});
