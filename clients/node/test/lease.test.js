// Leases, for effects outside the database: lease, complete, extendLease, releaseLease and
// runLeased, against dedup's functions.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { lease, complete, extendLease, releaseLease, runLeased, runOnce } from 'dedup-client';
import { newPool, rejection } from './helpers.js';

let pool;
before(() => { pool = newPool(2); });
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
