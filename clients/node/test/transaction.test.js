// Misuse outside a transaction: claim refuses, with a clear error, and claims nothing; in
// a transaction it claims. Both ways of knowing: pg's transaction status (pg >= 8.21) and
// the savepoint probe (older pg, pg-native, a query in flight).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { claim, runOnce, DedupError, NotInTransactionError } from 'dedup-client';
import { newPool, sql, rejection } from './helpers.js';

let pool;
before(async () => {
  pool = newPool(4);
  await pool.query('CREATE TABLE IF NOT EXISTS tx_effects (job_id text, note text)');
});
after(() => pool.end());

async function claimed(scope, jobId) {
  return (await sql(pool, 'SELECT count(*)::int AS n FROM dedup.processed WHERE scope = $1 AND job_id = $2',
    [scope, jobId]))[0].n;
}

// The two ways of telling the transaction status.
const MODES = {
  'transaction status (pg >= 8.21)': (client) => client,
  'savepoint probe (status unknown)': (client) => {
    client.getTransactionStatus = () => null;
    return client;
  },
};

for (const [mode, prepare] of Object.entries(MODES)) {
  test(`claim outside a transaction: NotInTransactionError, nothing claimed [${mode}]`, async () => {
    assert.equal(typeof pool.connect, 'function');
    const client = prepare(await pool.connect());
    try {
      const err = await rejection(claim(client, 'outside-1', 'tx'));
      assert.ok(err instanceof NotInTransactionError, String(err));
      assert.ok(err instanceof DedupError);
      assert.equal(err.code, 'DEDUP_NOT_IN_TRANSACTION');
      assert.match(err.message, /not inside a transaction: run BEGIN on it first/);
      assert.equal(await claimed('tx', 'outside-1'), 0, 'the claim was not sent');
      // The client is still usable, and in a transaction the claim works.
      await client.query('BEGIN');
      assert.equal(await claim(client, 'outside-1', 'tx'), true);
      assert.equal(await claim(client, 'outside-1', 'tx'), false, 'claimed already in this transaction');
      await client.query('COMMIT');
      await client.query('BEGIN');
      assert.equal(await claim(client, 'outside-1', 'tx'), false, 'a redelivered copy');
      await client.query('ROLLBACK');
    } finally {
      await client.query("DELETE FROM dedup.processed WHERE scope = 'tx'");
      client.release();
    }
  });

  test(`claim in a failed transaction: DedupError, ROLLBACK and retry [${mode}]`, async () => {
    const client = prepare(await pool.connect());
    try {
      await client.query('BEGIN');
      await rejection(client.query('SELECT 1/0'));
      const err = await rejection(claim(client, 'failed-1', 'tx'));
      assert.ok(err instanceof DedupError, String(err));
      assert.equal(err.code, 'DEDUP_TRANSACTION_FAILED');
      assert.match(err.message, /transaction has failed .* ROLLBACK it/);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
  });
}

test('claim with BEGIN still in flight (not awaited) waits for it and claims', async () => {
  const client = await pool.connect();
  try {
    const begun = client.query('BEGIN');
    assert.equal(await claim(client, 'inflight-1', 'tx'), true);
    await begun;
    await client.query('ROLLBACK');
  } finally {
    client.release();
  }
});

test('claim on a Pool: NotInTransactionError (its queries may each take another connection)', async () => {
  const err = await rejection(claim(pool, 'pool-1', 'tx'));
  assert.ok(err instanceof NotInTransactionError, String(err));
  assert.match(err.message, /got a Pool, .* pool\.connect\(\)/);
  assert.equal(await claimed('tx', 'pool-1'), 0);
});

test('runOnce: an effect that commits itself is refused', async () => {
  const err = await rejection(runOnce(pool, 'self-commit-1', async (client) => {
    await client.query("INSERT INTO tx_effects VALUES ('self-commit-1', 'x')");
    await client.query('COMMIT');
  }, { scope: 'tx' }));
  assert.ok(err instanceof DedupError, String(err));
  assert.equal(err.code, 'DEDUP_EFFECT_ENDED_TRANSACTION');
});

test('runOnce: an effect that catches a failed statement commits nothing and rejects', async () => {
  let ran = 0;
  const err = await rejection(runOnce(pool, 'swallow-1', async (client) => {
    ran++;
    await client.query("INSERT INTO tx_effects VALUES ('swallow-1', 'x')");
    await client.query('SELECT 1/0').catch(() => {}); // the transaction is now aborted
  }, { scope: 'tx' }));
  assert.ok(err instanceof DedupError, String(err));
  assert.equal(err.code, 'DEDUP_TRANSACTION_FAILED');
  assert.equal(ran, 1, 'not retried');
  assert.equal((await sql(pool, "SELECT count(*)::int AS n FROM tx_effects WHERE job_id = 'swallow-1'"))[0].n, 0);
  assert.equal(await claimed('tx', 'swallow-1'), 0);
  // The job is not lost: the next delivery does it.
  assert.equal(await runOnce(pool, 'swallow-1', async (client) => {
    await client.query("INSERT INTO tx_effects VALUES ('swallow-1', 'y')");
  }, { scope: 'tx' }), true);
});
