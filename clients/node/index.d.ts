// Types of dedup-client (written by hand; index.js is the implementation).
//
// The pg objects are typed by what this package uses of them, so neither pg's nor
// @types/pg's types are needed: a pg.Client or pg.PoolClient is a QueryClient, a pg.Pool
// is a ClientPool.

/** A job id: a non-empty string of at most 1024 UTF-8 bytes, a safe integer, or a bigint
 * in PostgreSQL's bigint range. 42, 42n and '42' are one job ('042' another). */
export type JobId = string | number | bigint;

/** What claim() and the lease functions use of a pg client. */
export interface QueryClient {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; command?: string }>;
  /** pg >= 8.21: 'I', 'T', 'E' or null. Without it claim() and lease(), extendLease(),
   * releaseLease() ask the server (a SAVEPOINT probe). */
  getTransactionStatus?(): string | null;
  readyForQuery?: boolean;
}

/** A client from pool.connect(). */
export interface PoolClient extends QueryClient {
  /** release(err) with an error destroys the connection instead of reusing it. */
  release(err?: Error | boolean): void;
}

/** What runOnce() uses of a pg.Pool. */
export interface ClientPool {
  connect(): Promise<PoolClient>;
}

/** The base class of this package's own errors; database errors are pg's DatabaseError. */
export class DedupError extends Error {
  constructor(message: string, code: string, options?: { cause?: unknown });
  /** 'DEDUP_NOT_IN_TRANSACTION', 'DEDUP_IN_TRANSACTION', 'DEDUP_TRANSACTION_FAILED' or
   * 'DEDUP_EFFECT_ENDED_TRANSACTION'. */
  code: string;
}

/** claim() on a client outside BEGIN ... COMMIT, or on a Pool. */
export class NotInTransactionError extends DedupError {
  constructor(message: string, options?: { cause?: unknown });
  code: 'DEDUP_NOT_IN_TRANSACTION';
}

/**
 * lease(), extendLease() or releaseLease() on a client inside a transaction block, or a
 * failed one: each runs in a short transaction of its own (on the Pool, or a client
 * outside any transaction). Nothing was sent.
 */
export class InTransactionError extends DedupError {
  constructor(message: string, options?: { cause?: unknown });
  code: 'DEDUP_IN_TRANSACTION';
}

/** The SQLSTATEs on which runOnce() retries the whole transaction: 40001, 40P01. */
export const RETRYABLE_SQLSTATES: readonly string[];

export interface ClaimOptions {
  /** A hash of the payload, 1 to 256 bytes: another payload under a claimed id is YD001. */
  fingerprint?: string | null;
}

/**
 * dedup.try_claim in the client's current transaction. true: this transaction holds the
 * claim, do the effect in it; false: done before, skip. Acknowledge only after COMMIT.
 * Throws TypeError/RangeError on bad input (before any query), NotInTransactionError
 * outside a transaction or on a Pool, DedupError in a failed transaction.
 */
export function claim(client: QueryClient, jobId: JobId, scope?: string, opts?: ClaimOptions): Promise<boolean>;

/** Throws the TypeError or RangeError claim() would for this job id and scope. */
export function checkJobId(jobId: unknown, scope?: unknown): void;

export type IsolationLevel = 'read committed' | 'repeatable read' | 'serializable';

export interface RunOnceOptions {
  /** 1 to 128 bytes; default 'default'. */
  scope?: string;
  fingerprint?: string | null;
  /** Retries of the whole transaction on 40001 and 40P01; default 5. */
  retries?: number;
  /** BEGIN ISOLATION LEVEL ...; default the server's (read committed). */
  isolationLevel?: IsolationLevel;
  /** The first retry waits between backoffMs/2 and backoffMs, doubling each retry; default 20. */
  backoffMs?: number;
  /** The cap of the doubling; default 1000. */
  maxBackoffMs?: number;
  /** Called before each retry's wait. */
  onRetry?: (err: unknown, attempt: number, delayMs: number) => void;
}

export interface EffectInfo {
  jobId: JobId;
  scope: string;
  /** 1 on the first try of the transaction, 2 on its first retry, ... */
  attempt: number;
}

export type Effect<T = unknown> = (client: PoolClient, info: EffectInfo) => Promise<T> | T;

/**
 * BEGIN, claim, effect(client) only if the claim is fresh, COMMIT, on one client of the
 * pool; retried whole on 40001 and 40P01. Resolves after COMMIT: true, the effect ran;
 * false, the job was done before. Rejects with nothing committed on any other error.
 */
export function runOnce(pool: ClientPool, jobId: JobId, effect: Effect, opts?: RunOnceOptions): Promise<boolean>;

/** runOnce, resolving to { ran, value }: value is what the effect returned when it ran. */
export function runOnceWithResult<T>(pool: ClientPool, jobId: JobId, effect: Effect<T>, opts?: RunOnceOptions):
  Promise<{ ran: true; value: T } | { ran: false; value: undefined }>;

export type LeaseStatus = 'acquired' | 'done' | 'busy';

export interface Lease {
  status: LeaseStatus;
  /** Set when 'acquired'. */
  leaseId: string | null;
  /** 'acquired': when this lease ends; 'busy': when the holder's does. */
  expiresAt: Date | null;
  /** 'done': the stored result, or null. */
  result: unknown;
  claimedAt: Date | null;
}

export interface LeaseOptions {
  scope?: string;
  /** How long the lease holds the job; default the server's dedup.lease_duration (30 s). */
  seconds?: number | null;
  fingerprint?: string | null;
}

/**
 * dedup.lease, in a short transaction of its own, committed before the effect: call it on
 * the Pool or on a client outside any transaction; InTransactionError inside one.
 */
export function lease(db: QueryClient, jobId: JobId, opts?: LeaseOptions): Promise<Lease>;
/**
 * dedup.complete: the job is done, with result stored as jsonb (undefined: none). On the
 * Pool, or on a client, whose transaction (if any) it joins: a database write that goes
 * with the effect commits with the completion.
 */
export function complete(db: QueryClient, jobId: JobId, leaseId: string, result?: unknown, opts?: { scope?: string }): Promise<void>;
/** dedup.extend_lease: the lease ends opts.seconds from now; resolves to that time.
 * In a transaction of its own, as lease(): InTransactionError inside one. */
export function extendLease(db: QueryClient, jobId: JobId, leaseId: string, opts?: { scope?: string; seconds?: number | null }): Promise<Date>;
/** dedup.release_lease: gives the job back after a failed effect.
 * In a transaction of its own, as lease(): InTransactionError inside one. */
export function releaseLease(db: QueryClient, jobId: JobId, leaseId: string, opts?: { scope?: string }): Promise<void>;

/**
 * lease, effect with a heartbeat, complete with its return value; release if it throws.
 * Acknowledge on 'acquired' and 'done', not on 'busy'.
 */
export function runLeased<T>(pool: QueryClient, jobId: JobId,
  effect: (info: { jobId: JobId; leaseId: string; scope: string }) => Promise<T> | T,
  opts?: LeaseOptions): Promise<{ status: 'acquired'; result: T } | { status: 'done' | 'busy'; result: unknown }>;
