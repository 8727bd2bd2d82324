// Bad input: a TypeError or RangeError naming the argument, before any query. Good edge
// values, against the server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  claim, runOnce, lease, complete, extendLease, releaseLease, checkJobId,
} from 'dedup-client';
import { exactlyOnceWorker } from 'dedup-client/bullmq';
import { newPool, redisConnection, rejection } from './helpers.js';

// A client that records what it is asked and says it is in a transaction.
function fakeClient() {
  const sent = [];
  return {
    sent,
    readyForQuery: true,
    getTransactionStatus: () => 'T',
    query: async (text) => { sent.push(text); return { rows: [{ fresh: true }] }; },
    release() {},
  };
}

const BAD_JOB_IDS = [
  [null, TypeError, /jobId must be a non-empty string, a safe integer or a bigint, got null/],
  [undefined, TypeError, /jobId .* got undefined/],
  ['', RangeError, /jobId must not be empty/],
  ['x'.repeat(1025), RangeError, /jobId is 1025 bytes long .* limit of 1024 bytes/],
  ['é'.repeat(513), RangeError, /jobId is 1026 bytes long \(UTF-8\)/],
  ['a\0b', RangeError, /jobId must not contain a NUL/],
  [{ id: 1 }, TypeError, /jobId .* got an object \(Object\)/],
  [true, TypeError, /jobId .* got boolean/],
  [Buffer.from('job'), TypeError, /jobId .* got an object \(Buffer\)/],
  [1.5, RangeError, /jobId 1\.5 is not a safe integer/],
  [2 ** 53, RangeError, /jobId 9007199254740992 is not a safe integer/],
  [NaN, RangeError, /jobId NaN is not a safe integer/],
  [Infinity, RangeError, /jobId Infinity is not a safe integer/],
  [2n ** 63n, RangeError, /jobId 9223372036854775808n is outside PostgreSQL's bigint range/],
  [-(2n ** 63n) - 1n, RangeError, /outside PostgreSQL's bigint range/],
];

test('claim: bad job ids throw TypeError/RangeError before any query', async () => {
  for (const [jobId, type, message] of BAD_JOB_IDS) {
    const client = fakeClient();
    const err = await rejection(claim(client, jobId));
    assert.ok(err instanceof type, `${String(jobId).slice(0, 20)}: ${err}`);
    assert.match(err.message, message);
    assert.match(err.message, /^dedup claim: /);
    assert.deepEqual(client.sent, [], 'no query sent');
  }
});

test('claim: bad scopes, fingerprints, clients and options throw before any query', async () => {
  const cases = [
    [(c) => claim(c, 'j', null), TypeError, /scope must be a string, got null/],
    [(c) => claim(c, 'j', ''), RangeError, /scope must not be empty/],
    [(c) => claim(c, 'j', 's'.repeat(129)), RangeError, /scope is 129 bytes long .* limit of 128/],
    [(c) => claim(c, 'j', 7), TypeError, /scope must be a string, got number 7/],
    [(c) => claim(c, 'j', 'default', { fingerprint: 'f'.repeat(257) }), RangeError, /fingerprint is 257 bytes/],
    [(c) => claim(c, 'j', 'default', { fingerprint: '' }), RangeError, /fingerprint must not be empty/],
    [(c) => claim(c, 'j', 'default', 'fp'), TypeError, /options must be an object/],
    [() => claim(null, 'j'), TypeError, /client must be a pg Client or Pool, got null/],
    [() => claim({}, 'j'), TypeError, /client must be a pg Client or Pool/],
  ];
  for (const [call, type, message] of cases) {
    const client = fakeClient();
    const err = await rejection(call(client));
    assert.ok(err instanceof type, String(err));
    assert.match(err.message, message);
    assert.deepEqual(client.sent, []);
  }
});

test('runOnce, leases, checkJobId and the worker: bad input throws before any query', async () => {
  let connected = 0;
  const pool = { connect: async () => { connected++; return fakeClient(); }, query: async () => { connected++; } };
  const effect = async () => {};
  const cases = [
    [() => runOnce(pool, null, effect), TypeError, /^dedup runOnce: jobId .* got null/],
    [() => runOnce(pool, 'j', 'not a function'), TypeError, /effect must be a function/],
    [() => runOnce(undefined, 'j', effect), TypeError, /pool must be a pg Pool/],
    [() => runOnce(pool, 'j', effect, { retries: -1 }), RangeError, /retries must be an integer >= 0/],
    [() => runOnce(pool, 'j', effect, { isolationLevel: 'chaos' }), RangeError, /isolationLevel must be one of/],
    [() => runOnce(pool, 'j', effect, { scope: '' }), RangeError, /scope must not be empty/],
    [() => runOnce(pool, 'j', effect, { backoffMs: -5 }), RangeError, /backoffMs must be a finite number/],
    [() => lease(pool, ''), RangeError, /^dedup lease: jobId must not be empty/],
    [() => lease(pool, 'j', { seconds: 0 }), RangeError, /seconds must be a number of seconds > 0/],
    [() => complete(pool, 'j', 'not-a-uuid'), TypeError, /leaseId must be the uuid lease\(\) returned/],
    [() => extendLease(pool, 'j', null), TypeError, /leaseId must be the uuid/],
    [() => releaseLease(pool, 2 ** 60, '00000000-0000-0000-0000-000000000000'), RangeError, /not a safe integer/],
    [async () => checkJobId(''), RangeError, /^dedup checkJobId: jobId must not be empty/],
  ];
  for (const [call, type, message] of cases) {
    const err = await rejection(call());
    assert.ok(err instanceof type, String(err));
    assert.match(err.message, message);
  }
  assert.equal(connected, 0, 'no connection taken, no query sent');
  assert.throws(() => exactlyOnceWorker('q', async () => {}, { connection: redisConnection }),
    { name: 'TypeError', message: /options\.pool must be a pg Pool/ });
  assert.throws(() => exactlyOnceWorker('', async () => {}, { pool, connection: redisConnection }),
    { name: 'TypeError', message: /queueName must be a non-empty string/ });
  assert.throws(() => exactlyOnceWorker('q', async () => {}, { pool, scope: '', connection: redisConnection }),
    { name: 'RangeError', message: /scope must not be empty/ });
});

let pool;
before(() => { pool = newPool(2); });
after(() => pool.end());

test('edge values are accepted: 1024 bytes, bigint limits, 42 = 42n = "42" but not "042"', async () => {
  const scope = 'input-edges';
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    assert.equal(await claim(client, 'x'.repeat(1024), scope), true);
    assert.equal(await claim(client, 'é'.repeat(512), scope), true); // 1024 bytes
    assert.equal(await claim(client, 2n ** 63n - 1n, scope), true);
    assert.equal(await claim(client, -(2n ** 63n), scope), true);
    assert.equal(await claim(client, Number.MAX_SAFE_INTEGER, scope), true);
    assert.equal(await claim(client, 42, scope), true);
    assert.equal(await claim(client, 42n, scope), false);
    assert.equal(await claim(client, '42', scope), false);
    assert.equal(await claim(client, '042', scope), true);
    assert.equal(await claim(client, 's', 'x'.repeat(128)), true);
    assert.equal(await claim(client, 'fp', scope, { fingerprint: 'f'.repeat(256) }), true);
    await client.query('COMMIT');
    const { rows } = await client.query(
      "SELECT job_id FROM dedup.processed WHERE scope = $1 AND job_id IN ('42', '042', '9223372036854775807', '-9223372036854775808') ORDER BY job_id",
      [scope]);
    assert.deepEqual(rows.map((r) => r.job_id), ['-9223372036854775808', '042', '42', '9223372036854775807']);
  } finally {
    client.release();
  }
});
