// Leases, for effects outside the database: lease, complete, extendLease, releaseLease and
// runLeased, against dedup's functions.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { lease, complete, extendLease, releaseLease, runLeased, runOnce, DedupError,
  InTransactionError } from 'dedup-client';
import { newPool, sql, rejection } from './helpers.js';

let pool;
before(() => { pool = newPool(3); });
after(() => pool.end());
const scope = 'payments';

test('lease: acquired, busy while held, done with the result after complete', async () => {
  const got = await lease(pool, 'pay-1', { scope, seconds: 30 });
  assert.equal(got.status, 'acquired');
  assert.match(got.leaseId, /^[0-9a-f-]{36}$/);
  assert.ok(got.expiresAt instanceof Date && got.expiresAt > new Date());
  assert.ok(got.claimedAt instanceof Date);
  const busy = await lease(pool, 'pay-1', { scope });
  assert.equal(busy.status, 'busy');
  assert.equal(busy.leaseId, null);
  await complete(pool, 'pay-1', got.leaseId, { charge: 'ch_1', amount: [1, 2] }, { scope });
  const done = await lease(pool, 'pay-1', { scope });
  assert.equal(done.status, 'done');
  assert.deepEqual(done.result, { charge: 'ch_1', amount: [1, 2] });
  // complete again with the same lease keeps the first result
  await complete(pool, 'pay-1', got.leaseId, { charge: 'ch_2' }, { scope });
  assert.deepEqual((await lease(pool, 'pay-1', { scope })).result, { charge: 'ch_1', amount: [1, 2] });
});

test('extendLease moves the expiry; releaseLease frees the job at once', async () => {
  const got = await lease(pool, 'pay-2', { scope, seconds: 2 });
  const later = await extendLease(pool, 'pay-2', got.leaseId, { scope, seconds: 120 });
  assert.ok(later instanceof Date && later - got.expiresAt > 60_000, `${later} vs ${got.expiresAt}`);
  await releaseLease(pool, 'pay-2', got.leaseId, { scope });
  const again = await lease(pool, 'pay-2', { scope });
  assert.equal(again.status, 'acquired');
  assert.notEqual(again.leaseId, got.leaseId);
});

test('a lease not held: the server\'s YD002 comes through as a pg DatabaseError', async () => {
  const err = await rejection(complete(pool, 'pay-3', '00000000-0000-0000-0000-000000000000', null, { scope }));
  assert.equal(err.code, 'YD002');
  assert.match(err.message, /is not held/);
  assert.match(err.hint, /Do not complete, extend or release a lease you no longer hold/);
});

test('a number id is the job of its decimal text, as for claims', async () => {
  const got = await lease(pool, 7001, { scope });
  assert.equal(got.status, 'acquired');
  assert.equal((await lease(pool, '7001', { scope })).status, 'busy');
  assert.equal((await lease(pool, 7001n, { scope })).status, 'busy');
  await complete(pool, 7001n, got.leaseId, undefined, { scope });
  const done = await lease(pool, '7001', { scope });
  assert.equal(done.status, 'done');
  assert.equal(done.result, null);
});

test('runLeased: the effect once, its result stored; a throwing effect releases the lease', async () => {
  let calls = 0;
  const charge = async ({ jobId, leaseId }) => { calls++; return { charged: jobId, leased: leaseId.length }; };
  assert.deepEqual(await runLeased(pool, 'pay-4', charge, { scope, seconds: 5 }),
    { status: 'acquired', result: { charged: 'pay-4', leased: 36 } });
  assert.deepEqual(await runLeased(pool, 'pay-4', charge, { scope, seconds: 5 }),
    { status: 'done', result: { charged: 'pay-4', leased: 36 } });
  assert.equal(calls, 1);
  const err = await rejection(runLeased(pool, 'pay-5', async () => { throw new Error('service down'); }, { scope }));
  assert.match(err.message, /service down/);
  assert.equal((await lease(pool, 'pay-5', { scope })).status, 'acquired', 'released, not busy');
});

test('runLeased: the heartbeat keeps a lease alive past its duration', async () => {
  let seen;
  const result = await runLeased(pool, 'pay-6', async () => {
    await new Promise((r) => setTimeout(r, 1800));
    seen = (await lease(pool, 'pay-6', { scope })).status; // 'acquired' were it expired
    return 'slow';
  }, { scope, seconds: 1 });
  assert.equal(seen, 'busy');
  assert.deepEqual(result, { status: 'acquired', result: 'slow' });
});

test('one API per scope: claiming a leased job is the server\'s 55000', async () => {
  await lease(pool, 'pay-7', { scope });
  const err = await rejection(runOnce(pool, 'pay-7', async () => {}, { scope }));
  assert.equal(err.code, '55000');
  assert.match(err.message, /held by a lease/);
});

// ---------------------------------------------------------------------------------------
// lease, extendLease and releaseLease run in short transactions of their own: on a client
// inside a transaction (or a failed one) they throw InTransactionError and send nothing.
// complete may join the transaction of a database write that goes with the effect.

/** The row of the job in dedup.processed, read on another connection (the pool). */
async function stored(jobId) {
  return (await sql(pool, 'SELECT lease_id, lease_expires_at, result FROM dedup.processed ' +
    'WHERE scope = $1 AND job_id = $2', [scope, jobId]))[0];
}

/** A client from the pool whose queries are recorded in client.sent. */
async function recordingClient(prepare) {
  const client = prepare(await pool.connect());
  client.sent = [];
  const query = client.query.bind(client);
  client.query = (text, ...rest) => {
    client.sent.push(typeof text === 'string' ? text : text?.text);
    return query(text, ...rest);
  };
  return client;
}

function assertInTransactionError(err, fn) {
  assert.ok(err instanceof InTransactionError, String(err));
  assert.ok(err instanceof DedupError);
  assert.equal(err.code, 'DEDUP_IN_TRANSACTION');
  assert.match(err.message, new RegExp(`^dedup ${fn}: `));
  assert.match(err.message, /short transaction of its own/);
}

function assertNothingSent(client) {
  const dedupQueries = client.sent.filter((t) => /dedup\./.test(t));
  assert.deepEqual(dedupQueries, [], 'no query of dedup was sent');
}

const MODES = {
  'transaction status (pg >= 8.21)': (client) => client,
  'savepoint probe (status unknown)': (client) => {
    client.getTransactionStatus = () => null;
    return client;
  },
};

for (const [mode, prepare] of Object.entries(MODES)) {
  test(`lease inside BEGIN: InTransactionError, no lease query, the job not leased [${mode}]`, async () => {
    const job = `in-tx-lease-${mode.length}`;
    const client = await recordingClient(prepare);
    try {
      await client.query('BEGIN');
      assertInTransactionError(await rejection(lease(client, job, { scope, seconds: 30 })), 'lease');
      assertNothingSent(client);
      assert.equal(await stored(job), undefined, 'the job is not in dedup.processed');
      await client.query('ROLLBACK');
      // Outside a transaction the same client leases.
      const got = await lease(client, job, { scope, seconds: 30 });
      assert.equal(got.status, 'acquired');
      assert.equal((await stored(job)).lease_id, got.leaseId, 'committed at once');
      await releaseLease(client, job, got.leaseId, { scope });
      assert.equal(await stored(job), undefined);
    } finally {
      client.release();
    }
  });

  test(`extendLease inside BEGIN: InTransactionError, no query, the expiry unchanged [${mode}]`, async () => {
    const job = `in-tx-extend-${mode.length}`;
    const got = await lease(pool, job, { scope, seconds: 30 });
    const before = (await stored(job)).lease_expires_at;
    const client = await recordingClient(prepare);
    try {
      await client.query('BEGIN');
      assertInTransactionError(await rejection(extendLease(client, job, got.leaseId, { scope, seconds: 600 })),
        'extendLease');
      assertNothingSent(client);
      await client.query('ROLLBACK');
      const row = await stored(job);
      assert.equal(row.lease_id, got.leaseId);
      assert.equal(row.lease_expires_at.getTime(), before.getTime(), 'the lease was not extended');
      const later = await extendLease(client, job, got.leaseId, { scope, seconds: 600 });
      assert.equal((await stored(job)).lease_expires_at.getTime(), later.getTime(), 'outside: extended at once');
    } finally {
      client.release();
      await releaseLease(pool, job, got.leaseId, { scope });
    }
  });

  test(`releaseLease inside BEGIN: InTransactionError, no query, the lease still held [${mode}]`, async () => {
    const job = `in-tx-release-${mode.length}`;
    const got = await lease(pool, job, { scope, seconds: 30 });
    const client = await recordingClient(prepare);
    try {
      await client.query('BEGIN');
      assertInTransactionError(await rejection(releaseLease(client, job, got.leaseId, { scope })), 'releaseLease');
      assertNothingSent(client);
      await client.query('ROLLBACK');
      assert.equal((await stored(job)).lease_id, got.leaseId, 'still held');
      assert.equal((await lease(pool, job, { scope })).status, 'busy');
      await releaseLease(client, job, got.leaseId, { scope });
      assert.equal(await stored(job), undefined, 'outside: released at once');
    } finally {
      client.release();
    }
  });

  test(`lease, extendLease, releaseLease in a failed transaction: InTransactionError, nothing sent [${mode}]`, async () => {
    const job = `in-failed-tx-${mode.length}`;
    const got = await lease(pool, job, { scope, seconds: 30 });
    const client = await recordingClient(prepare);
    try {
      await client.query('BEGIN');
      await rejection(client.query('SELECT 1/0'));
      for (const [fn, call] of [
        ['lease', () => lease(client, `${job}-other`, { scope })],
        ['extendLease', () => extendLease(client, job, got.leaseId, { scope, seconds: 600 })],
        ['releaseLease', () => releaseLease(client, job, got.leaseId, { scope })],
      ]) {
        const err = await rejection(call());
        assertInTransactionError(err, fn);
        assert.match(err.message, /failed/);
      }
      assertNothingSent(client);
      await client.query('ROLLBACK');
      assert.equal(await stored(`${job}-other`), undefined);
      assert.equal((await stored(job)).lease_id, got.leaseId);
    } finally {
      client.release();
      await releaseLease(pool, job, got.leaseId, { scope });
    }
  });
}

test('lease in a runOnce effect: refused before the external call, nothing leased or claimed', async () => {
  let externalCalls = 0;
  const err = await rejection(runOnce(pool, 'in-run-once-1', async (client) => {
    const got = await lease(client, 'in-run-once-1', { scope: 'payments-ext' });
    externalCalls++;
    return got;
  }, { scope: 'payments-in-tx' }));
  assertInTransactionError(err, 'lease');
  assert.equal(externalCalls, 0);
  const rows = await sql(pool, "SELECT scope FROM dedup.processed WHERE job_id = 'in-run-once-1'");
  assert.deepEqual(rows, [], 'neither the lease nor the rolled-back claim');
});

test('complete joins the transaction of the client given: rolled back with it, committed with it', async () => {
  const job = 'in-tx-complete-1';
  const got = await lease(pool, job, { scope, seconds: 30 });
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await complete(client, job, got.leaseId, { charge: 'ch_rolled_back' }, { scope });
    await client.query('ROLLBACK');
    assert.equal((await stored(job)).lease_id, got.leaseId);
    assert.equal((await lease(pool, job, { scope })).status, 'busy', 'not completed: rolled back');
    await client.query('BEGIN');
    await complete(client, job, got.leaseId, { charge: 'ch_1' }, { scope });
    assert.equal((await stored(job)).result, null, 'not visible before COMMIT');
    await client.query('COMMIT');
    const done = await lease(pool, job, { scope });
    assert.equal(done.status, 'done');
    assert.deepEqual(done.result, { charge: 'ch_1' });
  } finally {
    client.release();
  }
});
