// dedup-client: exactly-once effects over at-least-once delivery with the PostgreSQL
// extension dedup, for node-postgres (pg).
//
// claim(client, jobId, scope)        dedup.try_claim in the caller's transaction
// runOnce(pool, jobId, effect, opts) BEGIN, claim, the effect if fresh, COMMIT; retried
//                                    whole on 40001 and 40P01
// lease / complete / extendLease / releaseLease / runLeased
//                                    the lease variant, for effects outside the database
//
// No runtime dependencies: the pg client or pool is the caller's, used through its
// query() and connect() alone.
import { setTimeout as sleep } from 'node:timers/promises';

const JOB_ID_MAX_BYTES = 1024;
const SCOPE_MAX_BYTES = 128;
const FINGERPRINT_MAX_BYTES = 256;
const BIGINT_MIN = -(2n ** 63n);
const BIGINT_MAX = 2n ** 63n - 1n;
const RETRYABLE = new Set(['40001', '40P01']); // serialization_failure, deadlock_detected
const ISOLATION_LEVELS = new Map([
  ['read committed', 'READ COMMITTED'],
  ['repeatable read', 'REPEATABLE READ'],
  ['serializable', 'SERIALIZABLE'],
]);
// The savepoint that tells, on a client whose transaction status is unknown, whether it
// is inside a transaction block: SAVEPOINT is refused outside one (25P01), also in the
// implicit block of a multi-statement query string.
const PROBE = 'SAVEPOINT dedup_client_probe; RELEASE SAVEPOINT dedup_client_probe';

/** The base class of this package's own errors (database errors are pg's, unchanged). */
export class DedupError extends Error {
  constructor(message, code, options) {
    super(message, options);
    this.name = 'DedupError';
    this.code = code;
  }
}

/** claim() was called on a client that is not inside BEGIN ... COMMIT, or on a Pool. */
export class NotInTransactionError extends DedupError {
  constructor(message, options) {
    super(message, 'DEDUP_NOT_IN_TRANSACTION', options);
    this.name = 'NotInTransactionError';
  }
}

/**
 * lease(), extendLease() or releaseLease() was called on a client inside a transaction
 * block (or a failed one): each must run in a short transaction of its own.
 */
export class InTransactionError extends DedupError {
  constructor(message, options) {
    super(message, 'DEDUP_IN_TRANSACTION', options);
    this.name = 'InTransactionError';
  }
}

// ---------------------------------------------------------------------------------------
// Input checks: before any query, with the name of the function and of the argument.

function describe(value) {
  if (value === null) return 'null';
  if (typeof value === 'string') return `a string of ${Buffer.byteLength(value)} bytes`;
  if (typeof value === 'number' || typeof value === 'bigint') return `${typeof value} ${value}`;
  return typeof value === 'object' ? `an object (${value.constructor?.name ?? 'Object'})` : typeof value;
}

function checkText(fn, what, value, maxBytes, hint) {
  if (typeof value !== 'string') {
    throw new TypeError(`dedup ${fn}: ${what} must be a string, got ${describe(value)}`);
  }
  if (value.length === 0) {
    throw new RangeError(`dedup ${fn}: ${what} must not be empty`);
  }
  const bytes = Buffer.byteLength(value, 'utf8');
  if (bytes > maxBytes) {
    throw new RangeError(`dedup ${fn}: ${what} is ${bytes} bytes long (UTF-8), ` +
      `longer than the limit of ${maxBytes} bytes${hint ? `: ${hint}` : ''}`);
  }
  if (value.includes('\0')) {
    throw new RangeError(`dedup ${fn}: ${what} must not contain a NUL character (PostgreSQL text cannot hold one)`);
  }
  return value;
}

/**
 * The job id as a query parameter and its SQL type: a string as text, a safe integer or
 * a bigint as the decimal text of a bigint (42, 42n and '42' are one job).
 */
function jobParam(fn, jobId) {
  if (typeof jobId === 'string') {
    return [checkText(fn, 'jobId', jobId, JOB_ID_MAX_BYTES,
      'claim a digest of a long key instead, e.g. its hex SHA-256 (64 bytes)'), 'text'];
  }
  if (typeof jobId === 'number') {
    if (!Number.isSafeInteger(jobId)) {
      throw new RangeError(`dedup ${fn}: jobId ${jobId} is not a safe integer: ` +
        'pass an integer between -(2^53-1) and 2^53-1, a bigint, or a string');
    }
    return [String(jobId), 'bigint'];
  }
  if (typeof jobId === 'bigint') {
    if (jobId < BIGINT_MIN || jobId > BIGINT_MAX) {
      throw new RangeError(`dedup ${fn}: jobId ${jobId}n is outside PostgreSQL's bigint range ` +
        '(-2^63 to 2^63-1): pass it as a string');
    }
    return [jobId.toString(), 'bigint'];
  }
  throw new TypeError(`dedup ${fn}: jobId must be a non-empty string, a safe integer or a bigint, ` +
    `got ${describe(jobId)}`);
}

/**
 * Throws the TypeError or RangeError claim() would for this job id (or scope), and
 * returns nothing: to check a key before the transaction.
 */
export function checkJobId(jobId, scope = undefined) {
  jobParam('checkJobId', jobId);
  scopeParam('checkJobId', scope);
}

function scopeParam(fn, scope) {
  if (scope === undefined) return 'default';
  return checkText(fn, 'scope', scope, SCOPE_MAX_BYTES, 'use a shorter name, e.g. the queue\'s');
}

function fingerprintParam(fn, fingerprint) {
  if (fingerprint === undefined || fingerprint === null) return null;
  return checkText(fn, 'fingerprint', fingerprint, FINGERPRINT_MAX_BYTES,
    'pass a hash of the payload (a hex SHA-256 is 64 bytes), not the payload');
}

function optionsObject(fn, opts) {
  if (opts === undefined || opts === null) return {};
  if (typeof opts !== 'object') {
    throw new TypeError(`dedup ${fn}: options must be an object, got ${describe(opts)}`);
  }
  return opts;
}

function checkQueryable(fn, what, q) {
  if (q === null || typeof q !== 'object' || typeof q.query !== 'function') {
    throw new TypeError(`dedup ${fn}: ${what} must be a pg Client or Pool, got ${describe(q)}`);
  }
}

function isPool(q) {
  // pg.Pool (pg-pool) counts its clients; a Client does not.
  return typeof q.connect === 'function' && typeof q.totalCount === 'number' &&
    typeof q.idleCount === 'number';
}

// ---------------------------------------------------------------------------------------
// The transaction status of a client.

/**
 * 'I' (idle, no transaction), 'T' (in a transaction block) or 'E' (in a failed one), as
 * the server's last ReadyForQuery said. pg >= 8.21 keeps it (client.getTransactionStatus());
 * it is current only while no query is in flight (client.readyForQuery). Otherwise, and
 * on an older pg or pg-native where it is null, one round trip with a savepoint tells.
 */
async function transactionStatus(client) {
  if (typeof client.getTransactionStatus === 'function' && client.readyForQuery === true) {
    const status = client.getTransactionStatus();
    if (status === 'I' || status === 'T' || status === 'E') return status;
  }
  try {
    await client.query(PROBE);
    return 'T';
  } catch (err) {
    if (err?.code === '25P01') return 'I'; // no_active_sql_transaction
    if (err?.code === '25P02') return 'E'; // in_failed_sql_transaction
    throw err;
  }
}

async function requireTransaction(fn, client) {
  const status = await transactionStatus(client);
  if (status === 'I') {
    throw new NotInTransactionError(`dedup ${fn}: the client is not inside a transaction: ` +
      'run BEGIN on it first and COMMIT after the effect (outside a transaction the claim ' +
      'would commit on its own, before the effect: at-most-once), or use runOnce()');
  }
  if (status === 'E') {
    throw new DedupError(`dedup ${fn}: the client's transaction has failed (an earlier ` +
      'statement raised an error): ROLLBACK it and retry the whole transaction',
    'DEDUP_TRANSACTION_FAILED');
  }
}

/**
 * For lease, extendLease and releaseLease: a Pool's query is a statement of its own; a
 * client must be outside a transaction block. Inside one, the lease would be rolled back
 * with it (a retried transaction leases again and repeats the external effect) and an
 * extension stays invisible to other consumers until COMMIT (one takes the lease over).
 */
async function requireNoTransaction(fn, db) {
  if (isPool(db)) return;
  const status = await transactionStatus(db);
  if (status === 'I') return;
  const where = status === 'E'
    ? 'inside a failed transaction (an earlier statement raised an error)'
    : 'inside a transaction (BEGIN ... COMMIT)';
  throw new InTransactionError(`dedup ${fn}: the client is ${where}: lease, extendLease ` +
    'and releaseLease each run in a short transaction of its own, committed before the ' +
    'external effect (inside another transaction, its rollback or retry would undo the ' +
    'lease and repeat the effect, and an extension would stay invisible to other consumers ' +
    'until COMMIT): call it on the Pool, or on a client outside any transaction');
}

// ---------------------------------------------------------------------------------------
// Claims.

/**
 * Claims jobId in scope for the client's current transaction (dedup.try_claim). Resolves
 * to true: this transaction holds the claim, do the effect in it; false: the job was done
 * before (or is claimed already in this transaction), skip it. Either way, acknowledge the
 * message only after COMMIT succeeded.
 */
export async function claim(client, jobId, scope = 'default', opts = undefined) {
  checkQueryable('claim', 'client', client);
  const [job, type] = jobParam('claim', jobId);
  const sc = scopeParam('claim', scope);
  const fingerprint = fingerprintParam('claim', optionsObject('claim', opts).fingerprint);
  if (isPool(client)) {
    throw new NotInTransactionError('dedup claim: got a Pool, whose queries may each run on ' +
      'another connection: take a client with pool.connect(), BEGIN on it, claim and do the ' +
      'effect on it, COMMIT (or let runOnce() do that)');
  }
  await requireTransaction('claim', client);
  const { rows } = fingerprint === null
    ? await client.query(`SELECT dedup.try_claim($1::${type}, $2::text) AS fresh`, [job, sc])
    : await client.query(`SELECT dedup.try_claim($1::${type}, $2::text, $3::text) AS fresh`,
      [job, sc, fingerprint]);
  return rows[0].fresh === true;
}

function retryDelayMs(attempt, baseMs, maxMs) {
  // Exponential, with "equal jitter": half fixed, half random.
  const ceiling = Math.min(maxMs, baseMs * 2 ** (attempt - 1));
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

function runOptions(fn, opts) {
  const o = optionsObject(fn, opts);
  const retries = o.retries ?? 5;
  if (!Number.isSafeInteger(retries) || retries < 0) {
    throw new RangeError(`dedup ${fn}: retries must be an integer >= 0, got ${describe(retries)}`);
  }
  let begin = 'BEGIN';
  if (o.isolationLevel !== undefined) {
    const level = ISOLATION_LEVELS.get(String(o.isolationLevel).toLowerCase());
    if (!level) {
      throw new RangeError(`dedup ${fn}: isolationLevel must be one of ` +
        `${[...ISOLATION_LEVELS.keys()].map((l) => `'${l}'`).join(', ')}, got ${describe(o.isolationLevel)}`);
    }
    begin = `BEGIN ISOLATION LEVEL ${level}`;
  }
  const baseMs = o.backoffMs ?? 20;
  const maxMs = o.maxBackoffMs ?? 1000;
  for (const [k, v] of [['backoffMs', baseMs], ['maxBackoffMs', maxMs]]) {
    if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v)) {
      throw new RangeError(`dedup ${fn}: ${k} must be a finite number >= 0, got ${describe(v)}`);
    }
  }
  if (o.onRetry !== undefined && typeof o.onRetry !== 'function') {
    throw new TypeError(`dedup ${fn}: onRetry must be a function, got ${describe(o.onRetry)}`);
  }
  return {
    scope: scopeParam(fn, o.scope),
    fingerprint: fingerprintParam(fn, o.fingerprint),
    retries, begin, baseMs, maxMs, onRetry: o.onRetry,
  };
}

/**
 * One attempt: BEGIN, claim, the effect if fresh, COMMIT, on one client from the pool.
 * Resolves to { ran, value }; rejects with the error, the transaction rolled back and the
 * client released (destroyed if the ROLLBACK failed: the connection is then unusable).
 */
async function attemptOnce(pool, jobId, effect, o, attempt) {
  const client = await pool.connect();
  let broken = false;
  // A checked-out client emits 'error' when its connection drops (a terminated backend, a
  // failover); unhandled, that would end the process. The query in flight rejects too.
  const onError = () => { broken = true; };
  client.on?.('error', onError);
  try {
    await client.query(o.begin);
    const ran = await claim(client, jobId, o.scope, { fingerprint: o.fingerprint });
    let value;
    if (ran) {
      value = await effect(client, { jobId, scope: o.scope, attempt });
      // The effect must leave the transaction open: a COMMIT or ROLLBACK of its own would
      // have ended it (and the claim with it) before this COMMIT.
      const status = await transactionStatus(client);
      if (status === 'I') {
        throw new DedupError('dedup runOnce: the effect ended the transaction itself (COMMIT ' +
          'or ROLLBACK): leave that to runOnce, which commits the claim with the effect',
        'DEDUP_EFFECT_ENDED_TRANSACTION');
      }
      if (status === 'E') {
        throw new DedupError('dedup runOnce: a statement of the effect failed and the error ' +
          'was caught: the transaction is aborted, nothing is committed', 'DEDUP_TRANSACTION_FAILED');
      }
    }
    const done = await client.query('COMMIT');
    // COMMIT of an aborted transaction answers ROLLBACK without an error.
    if (done?.command === 'ROLLBACK') {
      throw new DedupError('dedup runOnce: COMMIT rolled back: the transaction had failed',
        'DEDUP_TRANSACTION_FAILED');
    }
    return { ran, value };
  } catch (err) {
    // After a failed COMMIT this ROLLBACK only warns; if it fails, the connection is gone.
    const rolledBack = await client.query('ROLLBACK').then(() => true, () => false);
    broken ||= !rolledBack;
    throw err;
  } finally {
    client.removeListener?.('error', onError);
    client.release(broken ? new Error('dedup runOnce: connection broken') : undefined);
  }
}

/**
 * Like runOnce, resolving to { ran, value }: value is what the effect returned, when it
 * ran.
 */
export async function runOnceWithResult(pool, jobId, effect, opts = undefined) {
  if (pool === null || typeof pool !== 'object' || typeof pool.connect !== 'function') {
    throw new TypeError(`dedup runOnce: pool must be a pg Pool (with connect()), got ${describe(pool)}`);
  }
  jobParam('runOnce', jobId);
  if (typeof effect !== 'function') {
    throw new TypeError(`dedup runOnce: effect must be a function (client) => Promise, got ${describe(effect)}`);
  }
  const o = runOptions('runOnce', opts);
  for (let attempt = 1; ; attempt++) {
    try {
      return await attemptOnce(pool, jobId, effect, o, attempt);
    } catch (err) {
      if (!RETRYABLE.has(err?.code) || attempt > o.retries) throw err;
      const delayMs = retryDelayMs(attempt, o.baseMs, o.maxMs);
      o.onRetry?.(err, attempt, delayMs);
      await sleep(delayMs);
    }
  }
}

/**
 * Runs effect(client, info) exactly once per (scope, jobId): BEGIN, claim, the effect only
 * if the claim is fresh, COMMIT, on one client from the pool; the whole transaction again
 * on 40001 and 40P01 (up to opts.retries times, jittered exponential backoff). Resolves
 * after COMMIT to true (the effect ran and committed) or false (done before: skipped);
 * acknowledge the message then. Rejects, with nothing committed, on any other error.
 */
export async function runOnce(pool, jobId, effect, opts = undefined) {
  return (await runOnceWithResult(pool, jobId, effect, opts)).ran;
}

// ---------------------------------------------------------------------------------------
// Leases: for an effect outside the database. lease, extendLease and releaseLease each run
// as a statement of its own, committed at once (on a Pool, or on a client outside any
// transaction: InTransactionError otherwise). complete may also join the transaction of
// the client given, for a database write that goes with the effect.

function durationSeconds(fn, what, value) {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new RangeError(`dedup ${fn}: ${what} must be a number of seconds > 0, got ${describe(value)}`);
  }
  return value;
}

function leaseIdParam(fn, leaseId) {
  if (typeof leaseId !== 'string' || !/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(leaseId)) {
    throw new TypeError(`dedup ${fn}: leaseId must be the uuid lease() returned with status ` +
      `'acquired', got ${describe(leaseId)}`);
  }
  return leaseId;
}

// The lease functions take text: a number or bigint id is its decimal text, the same job.
function leaseJob(fn, jobId) {
  return jobParam(fn, jobId)[0];
}

/**
 * dedup.lease: takes the job for an external effect. Resolves to { status, leaseId,
 * expiresAt, result, claimedAt }; status 'acquired' (do the effect, then complete),
 * 'done' (acknowledge) or 'busy' (another holder: leave the message unacknowledged).
 * On a Pool or a client outside any transaction: InTransactionError inside one.
 */
export async function lease(db, jobId, opts = undefined) {
  checkQueryable('lease', 'db', db);
  const job = leaseJob('lease', jobId);
  const o = optionsObject('lease', opts);
  const scope = scopeParam('lease', o.scope);
  const seconds = durationSeconds('lease', 'seconds', o.seconds);
  const fingerprint = fingerprintParam('lease', o.fingerprint);
  await requireNoTransaction('lease', db);
  const { rows: [row] } = await db.query(
    'SELECT status, lease_id, expires_at, result, claimed_at FROM dedup.lease($1::text, $2::text, ' +
    'CASE WHEN $3::float8 IS NULL THEN NULL ELSE make_interval(secs => $3::float8) END, $4::text)',
    [job, scope, seconds, fingerprint]);
  return {
    status: row.status,
    leaseId: row.lease_id,
    expiresAt: row.expires_at,
    result: row.result,
    claimedAt: row.claimed_at,
  };
}

/**
 * dedup.complete: marks the leased job done, storing result (any JSON value; undefined:
 * none). On a Pool, or on a client: then it joins the client's transaction, if any (a
 * database write that goes with the effect commits with the completion).
 */
export async function complete(db, jobId, leaseId, result = undefined, opts = undefined) {
  checkQueryable('complete', 'db', db);
  const job = leaseJob('complete', jobId);
  const id = leaseIdParam('complete', leaseId);
  const scope = scopeParam('complete', optionsObject('complete', opts).scope);
  const json = result === undefined ? null : JSON.stringify(result);
  await db.query('SELECT dedup.complete($1::text, $2::uuid, $3::jsonb, $4::text)', [job, id, json, scope]);
}

/**
 * dedup.extend_lease: the lease now ends opts.seconds from now; resolves to the new expiry.
 * On a Pool or a client outside any transaction: InTransactionError inside one.
 */
export async function extendLease(db, jobId, leaseId, opts = undefined) {
  checkQueryable('extendLease', 'db', db);
  const job = leaseJob('extendLease', jobId);
  const id = leaseIdParam('extendLease', leaseId);
  const o = optionsObject('extendLease', opts);
  const scope = scopeParam('extendLease', o.scope);
  const seconds = durationSeconds('extendLease', 'seconds', o.seconds);
  await requireNoTransaction('extendLease', db);
  const { rows: [row] } = await db.query(
    'SELECT dedup.extend_lease($1::text, $2::uuid, CASE WHEN $3::float8 IS NULL THEN NULL ' +
    'ELSE make_interval(secs => $3::float8) END, $4::text) AS expires_at', [job, id, seconds, scope]);
  return row.expires_at;
}

/**
 * dedup.release_lease: gives the lease back after a failed effect. On a Pool or a client
 * outside any transaction: InTransactionError inside one.
 */
export async function releaseLease(db, jobId, leaseId, opts = undefined) {
  checkQueryable('releaseLease', 'db', db);
  const job = leaseJob('releaseLease', jobId);
  const id = leaseIdParam('releaseLease', leaseId);
  const scope = scopeParam('releaseLease', optionsObject('releaseLease', opts).scope);
  await requireNoTransaction('releaseLease', db);
  await db.query('SELECT dedup.release_lease($1::text, $2::uuid, $3::text)', [job, id, scope]);
}

/**
 * Lease, run effect({ jobId, leaseId, scope }) with a heartbeat extending the lease every
 * third of its duration, then complete with what the effect returned; release the lease
 * if the effect throws. Resolves to { status: 'acquired' | 'done' | 'busy', result }:
 * acknowledge on 'acquired' and 'done', not on 'busy'. Give the external call the job id
 * as its idempotency key: a holder that dies between the call and complete makes the next
 * holder repeat it.
 */
export async function runLeased(pool, jobId, effect, opts = undefined) {
  checkQueryable('runLeased', 'pool', pool);
  if (typeof effect !== 'function') {
    throw new TypeError(`dedup runLeased: effect must be a function, got ${describe(effect)}`);
  }
  const o = optionsObject('runLeased', opts);
  const seconds = durationSeconds('runLeased', 'seconds', o.seconds) ?? 30;
  const got = await lease(pool, jobId, { scope: o.scope, seconds, fingerprint: o.fingerprint });
  if (got.status !== 'acquired') return { status: got.status, result: got.result };
  const scope = o.scope;
  let beat = Promise.resolve();
  const timer = setInterval(() => {
    // YD002 means the lease was lost; complete() then says so too.
    beat = extendLease(pool, jobId, got.leaseId, { scope, seconds }).then(() => {}, () => {});
  }, (seconds * 1000) / 3);
  let result;
  try {
    result = await effect({ jobId, leaseId: got.leaseId, scope: scope ?? 'default' });
  } catch (err) {
    clearInterval(timer);
    await beat;
    await releaseLease(pool, jobId, got.leaseId, { scope }).catch(() => {});
    throw err;
  }
  clearInterval(timer);
  await beat;
  await complete(pool, jobId, got.leaseId, result, { scope });
  return { status: 'acquired', result };
}

export const RETRYABLE_SQLSTATES = Object.freeze([...RETRYABLE]);
