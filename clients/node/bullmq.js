// dedup-client/bullmq: a BullMQ Worker whose processor runs the handler exactly once per
// job key, through runOnce: the handler's database writes and the claim commit together,
// and the processor resolves (BullMQ marks the job completed) only after that COMMIT.
import { Worker, UnrecoverableError } from 'bullmq';
import { checkJobId, runOnceWithResult } from './index.js';

const OWN_OPTIONS = ['pool', 'scope', 'key', 'retries', 'isolationLevel', 'backoffMs',
  'maxBackoffMs', 'onRetry'];

function describe(value) {
  return value === null ? 'null' : typeof value;
}

/**
 * new Worker(queueName, processor, workerOpts), where processor(job, token) runs
 * handler(job, client, info) in runOnce(pool, key(job), ...) with scope (default: the
 * queue's name). Resolves the job with { ran, result }: ran false for a duplicate, whose
 * handler did not run; result is what the handler returned.
 *
 * opts: pool (required), scope, key (job => id; default job.id), retries,
 * isolationLevel, backoffMs, maxBackoffMs, onRetry (runOnce's), and any BullMQ
 * WorkerOptions (connection is required by BullMQ; see the README for stalledInterval,
 * lockDuration and maxStalledCount).
 */
export function exactlyOnceWorker(queueName, handler, opts) {
  if (typeof queueName !== 'string' || queueName.length === 0) {
    throw new TypeError(`dedup exactlyOnceWorker: queueName must be a non-empty string, got ${describe(queueName)}`);
  }
  if (typeof handler !== 'function') {
    throw new TypeError(`dedup exactlyOnceWorker: handler must be a function (job, client, info) => Promise, got ${describe(handler)}`);
  }
  if (opts === null || typeof opts !== 'object') {
    throw new TypeError('dedup exactlyOnceWorker: options { pool, connection, ... } are required');
  }
  const { pool, scope = queueName, key = (job) => job.id } = opts;
  if (pool === null || typeof pool !== 'object' || typeof pool.connect !== 'function') {
    throw new TypeError(`dedup exactlyOnceWorker: options.pool must be a pg Pool, got ${describe(pool)}`);
  }
  if (typeof key !== 'function') {
    throw new TypeError(`dedup exactlyOnceWorker: options.key must be a function job => id, got ${describe(key)}`);
  }
  checkJobId('-', scope); // the scope's TypeError or RangeError now, not on every job
  const runOpts = {
    scope,
    retries: opts.retries,
    isolationLevel: opts.isolationLevel,
    backoffMs: opts.backoffMs,
    maxBackoffMs: opts.maxBackoffMs,
    onRetry: opts.onRetry,
  };
  const workerOpts = Object.fromEntries(
    Object.entries(opts).filter(([k]) => !OWN_OPTIONS.includes(k)));

  async function processor(job, token) {
    let jobKey;
    try {
      jobKey = key(job);
      checkJobId(jobKey, scope);
    } catch (err) {
      // A key that is not a valid job id fails the same way on every attempt.
      throw new UnrecoverableError(`dedup exactlyOnceWorker: no valid key for job ${job.id}: ${err.message}`);
    }
    const outcome = await runOnceWithResult(pool, jobKey,
      (client, info) => handler(job, client, { ...info, token }), runOpts);
    return outcome.ran ? { ran: true, result: outcome.value ?? null } : { ran: false };
  }

  return new Worker(queueName, processor, workerOpts);
}
