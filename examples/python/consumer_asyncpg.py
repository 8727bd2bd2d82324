"""A queue consumer that does each job's effect exactly once with dedup.try_claim
(asyncpg, asyncio).

For every message: claim its job and write the effect in one transaction, commit, and
only then acknowledge the message. A message whose transaction did not commit is not
acknowledged, so the queue delivers it again. The whole transaction is retried on
serialization failure (40001) and deadlock (40P01).

Environment: DATABASE_URL (a postgresql:// URL; else PGHOST, PGDATABASE, ...), WORKERS
(concurrent tasks sharing a pool; default 4), VISIBILITY_TIMEOUT_S (default 30),
EXIT_WHEN_EMPTY=1 (exit once every message is acknowledged). The queue and the receipts
table are in examples/schema.sql.
"""
import asyncio
import os
import sys
from collections import Counter

import asyncpg

MAX_ATTEMPTS = 5
ME = f"asyncpg-{os.getpid()}"
# done, skipped (a duplicate: done before), retried, failed: the guide's diagnostic hook
stats: Counter[str] = Counter()


# [readme:python-asyncpg]
async def handle(pool: asyncpg.Pool, job_id: str) -> bool:
    """Claim the job and write its effect in one transaction, retried on 40001 and 40P01.
    True: done now; False: done before. Either way it committed: acknowledge the message."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            async with pool.acquire() as conn, conn.transaction():
                fresh = await conn.fetchval("SELECT dedup.try_claim($1)", job_id)
                if fresh:
                    await conn.execute(
                        "INSERT INTO receipts (job_id, consumer) VALUES ($1, $2)", job_id, ME
                    )
                # An effect outside the database cannot join this transaction: lease_asyncpg.py
            return fresh
        except (asyncpg.SerializationError, asyncpg.DeadlockDetectedError):
            if attempt == MAX_ATTEMPTS:
                raise
            stats["retried"] += 1
            await asyncio.sleep(0.01 * 2**attempt)


async def consume_batch(pool: asyncpg.Pool, visibility_timeout_s: int) -> int:
    """Receive a batch; acknowledge each message only after its transaction committed."""
    batch = await pool.fetch(
        "SELECT msg_id, job_id FROM queue.receive(10, $1)", visibility_timeout_s
    )
    for msg_id, job_id in batch:
        try:
            fresh = await handle(pool, job_id)
        except asyncpg.PostgresError as e:
            # Not acknowledged: the queue delivers it again after the visibility timeout.
            stats["failed"] += 1
            print(f"{ME}: job {job_id} left unacknowledged: {e}", file=sys.stderr)
            continue
        await pool.execute("SELECT queue.ack($1)", msg_id)
        stats["done" if fresh else "skipped"] += 1
    return len(batch)
# [/readme:python-asyncpg]


async def worker(pool: asyncpg.Pool, vt: int, exit_when_empty: bool) -> None:
    while True:
        if await consume_batch(pool, vt) > 0:
            continue
        if exit_when_empty and await pool.fetchval("SELECT queue.pending()") == 0:
            return
        await asyncio.sleep(0.1)


async def main() -> None:
    workers = int(os.environ.get("WORKERS", "4"))
    vt = int(os.environ.get("VISIBILITY_TIMEOUT_S", "30"))
    exit_when_empty = os.environ.get("EXIT_WHEN_EMPTY") == "1"
    async with asyncpg.create_pool(
        os.environ.get("DATABASE_URL"), min_size=1, max_size=workers
    ) as pool:
        await asyncio.gather(*(worker(pool, vt, exit_when_empty) for _ in range(workers)))
    counts = " ".join(f"{k}={stats[k]}" for k in ("done", "skipped", "retried", "failed"))
    print(f"{ME} summary {counts}")


if __name__ == "__main__":
    asyncio.run(main())
