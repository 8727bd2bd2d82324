// Types of dedup-client/bullmq (written by hand; bullmq.js is the implementation).
import type { Job, Worker, WorkerOptions } from 'bullmq';
import type { ClientPool, EffectInfo, JobId, PoolClient, RunOnceOptions } from './index.js';

export interface ExactlyOnceWorkerOptions<D = any> extends WorkerOptions,
  Omit<RunOnceOptions, 'scope' | 'fingerprint'> {
  /** The pg Pool whose clients run each job's transaction. */
  pool: ClientPool;
  /** The dedup scope of the queue's jobs; default the queue's name. */
  scope?: string;
  /** The job's dedup key; default job.id. */
  key?: (job: Job<D>) => JobId;
}

export type ExactlyOnceHandler<D = any, R = any> =
  (job: Job<D>, client: PoolClient, info: EffectInfo & { token?: string }) => Promise<R> | R;

/** What a job of the worker resolves with: ran false for a duplicate, whose handler did not run. */
export type ExactlyOnceResult<R> = { ran: true; result: R | null } | { ran: false };

/**
 * A BullMQ Worker running handler(job, client, info) inside runOnce(pool, key(job), ...):
 * the handler's writes commit with the claim, and the job completes only after COMMIT.
 */
export function exactlyOnceWorker<D = any, R = any>(queueName: string,
  handler: ExactlyOnceHandler<D, R>,
  opts: ExactlyOnceWorkerOptions<D>): Worker<D, ExactlyOnceResult<R>>;
