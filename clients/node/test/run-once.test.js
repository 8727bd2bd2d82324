// runOnce: the effect once, a duplicate skipped, the whole transaction retried on 40001
// and 40P01 (raised by a statement, by COMMIT, and by dedup itself under REPEATABLE
// READ), not on other errors, and the client released or destroyed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { runOnce, runOnceWithResult } from 'dedup-client';
import { newPool, sql, rejection, RAISE_SQL } from './helpers.js';

let pool;
before(async () => {
  pool = newPool(4);
  await pool.query(RAISE_SQL);
  await pool.query(`
    CREATE TABLE IF NOT EXISTS ro_effects (job_id text, attempt int);
    -- Raise the SQLSTATE a row asks for, once per sequence value: nextval is not rolled
    -- back, so the first attempt fails and the retry passes.
    CREATE SEQUENCE IF NOT EXISTS ro_fail_once;
    CREATE OR REPLACE FUNCTION ro_fail() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.job_id LIKE 'always-%' THEN
        PERFORM test_raise('40001');
      ELSIF NEW.job_id LIKE 'once-%' AND nextval('ro_fail_once') % 2 = 1 THEN
        PERFORM test_raise(split_part(NEW.job_id, '-', 2));
      END IF;
      RETURN NEW;
    END $$;
    CREATE OR REPLACE TRIGGER ro_fail BEFORE INSERT ON ro_effects FOR EACH ROW EXECUTE FUNCTION ro_fail();
    CREATE OR REPLACE FUNCTION ro_fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF nextval('ro_fail_once') % 2 = 1 THEN PERFORM test_raise('40001'); END IF;
      RETURN NULL;
    END $$;
    DROP TRIGGER IF EXISTS ro_fail_at_commit ON ro_effects;
    CREATE CONSTRAINT TRIGGER ro_fail_at_commit AFTER INSERT ON ro_effects DEFERRABLE INITIALLY DEFERRED
      FOR EACH ROW WHEN (NEW.job_id LIKE 'commit-%') EXECUTE FUNCTION ro_fail_at_commit();`);
});
after(() => pool.end());

async function rows(jobId) {
  return sql(pool, 'SELECT attempt FROM ro_effects WHERE job_id = $1 ORDER BY attempt', [jobId]);
}

function insert(jobId, calls) {
  return async (client, info) => {
    calls.push(info.attempt);
    await client.query('INSERT INTO ro_effects VALUES ($1, $2)', [jobId, info.attempt]);
    return `done ${jobId}`;
  };
}

async function resetSequence() {
  await pool.query("SELECT setval('ro_fail_once', 2, true)"); // next value 3: odd, fails
}

test('runOnce: true and the effect once, then false for the duplicate without the effect', async () => {
  const calls = [];
  assert.equal(await runOnce(pool, 'plain-1', insert('plain-1', calls), { scope: 'ro' }), true);
  assert.equal(await runOnce(pool, 'plain-1', insert('plain-1', calls), { scope: 'ro' }), false);
  assert.deepEqual(calls, [1]);
  assert.deepEqual(await rows('plain-1'), [{ attempt: 1 }]);
  const again = await runOnceWithResult(pool, 'plain-2', insert('plain-2', []), { scope: 'ro' });
  assert.deepEqual(again, { ran: true, value: 'done plain-2' });
  assert.deepEqual(await runOnceWithResult(pool, 'plain-2', insert('plain-2', []), { scope: 'ro' }),
    { ran: false, value: undefined });
  assert.equal(pool.idleCount, pool.totalCount, 'every client released');
});

for (const [jobId, code] of [['once-40001-a', '40001'], ['once-40P01-a', '40P01'], ['commit-40001-a', '40001']]) {
  test(`runOnce retries the whole transaction on an injected ${code}${jobId.startsWith('commit') ? ' at COMMIT' : ''}`, async () => {
    await resetSequence();
    const calls = [];
    const retried = [];
    const ran = await runOnce(pool, jobId, insert(jobId, calls), {
      scope: 'ro', onRetry: (err, attempt, delayMs) => retried.push([err.code, attempt, delayMs]),
    });
    assert.equal(ran, true);
    assert.deepEqual(calls, [1, 2], 'the effect ran in both attempts');
    assert.deepEqual(await rows(jobId), [{ attempt: 2 }], 'only the retry committed');
    assert.equal(retried.length, 1);
    assert.equal(retried[0][0], code);
    assert.ok(retried[0][2] >= 10 && retried[0][2] <= 20, `jittered first delay ${retried[0][2]}`);
    assert.equal(await runOnce(pool, jobId, insert(jobId, calls), { scope: 'ro' }), false, 'then a duplicate');
  });
}

test('runOnce gives up after opts.retries retries with the last 40001', async () => {
  const calls = [];
  const err = await rejection(runOnce(pool, 'always-1', insert('always-1', calls),
    { scope: 'ro', retries: 2, backoffMs: 1 }));
  assert.equal(err.code, '40001');
  assert.deepEqual(calls, [1, 2, 3]);
  assert.deepEqual(await rows('always-1'), []);
  assert.equal((await sql(pool, "SELECT count(*)::int AS n FROM dedup.processed WHERE scope = 'ro' AND job_id = 'always-1'"))[0].n, 0);
  assert.equal(pool.idleCount, pool.totalCount);
});

test('runOnce does not retry other errors: rejects, nothing committed, the next delivery runs', async () => {
  const calls = [];
  const err = await rejection(runOnce(pool, 'plain-err-1', async (client, info) => {
    calls.push(info.attempt);
    await client.query("INSERT INTO ro_effects VALUES ('plain-err-1', 1)");
    await client.query("SELECT test_raise('23505')");
  }, { scope: 'ro' }));
  assert.equal(err.code, '23505');
  assert.deepEqual(calls, [1]);
  assert.deepEqual(await rows('plain-err-1'), []);
  assert.equal(await runOnce(pool, 'plain-err-1', insert('plain-err-1', calls), { scope: 'ro' }), true);
});

test('runOnce under REPEATABLE READ: a concurrent copy gets dedup\'s 40001, retries, returns false', async () => {
  const calls = [];
  const retried = [];
  let claimedFirst;
  const held = new Promise((resolve) => { claimedFirst = resolve; });
  const first = runOnce(pool, 'race-1', async (client, info) => {
    calls.push(`first ${info.attempt}`);
    claimedFirst();
    await client.query('SELECT pg_sleep(0.3)');
    await client.query("INSERT INTO ro_effects VALUES ('race-1', 1)");
  }, { scope: 'ro', isolationLevel: 'repeatable read' });
  await held;
  const second = runOnce(pool, 'race-1', async () => { calls.push('second'); },
    { scope: 'ro', isolationLevel: 'repeatable read', onRetry: (e) => retried.push(e.code) });
  assert.deepEqual(await Promise.all([first, second]), [true, false]);
  assert.deepEqual(calls, ['first 1']);
  assert.deepEqual(retried, ['40001'], 'the waiting claim raised 40001 once, its retry saw the claim');
  assert.deepEqual(await rows('race-1'), [{ attempt: 1 }]);
});

test('runOnce destroys a client whose connection broke, and the pool goes on', async () => {
  const total = pool.totalCount;
  await pool.query('SELECT 1');
  const err = await rejection(runOnce(pool, 'broken-1', async (client) => {
    await client.query('SELECT pg_terminate_backend(pg_backend_pid())');
  }, { scope: 'ro' }));
  assert.equal(err.code, '57P01', String(err)); // admin_shutdown: not retried
  await sleep(50);
  assert.ok(pool.totalCount <= Math.max(total, 1), 'the broken client was not returned to the pool');
  assert.equal(pool.idleCount, pool.totalCount);
  assert.equal(await runOnce(pool, 'broken-1', insert('broken-1', []), { scope: 'ro' }), true);
});
