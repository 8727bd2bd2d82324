"""A queue consumer that does each job's effect exactly once with dedup.try_claim
(psycopg 3, synchronous).

For every message: claim its job and write the effect in one transaction, commit, and
only then acknowledge the message. A message whose transaction did not commit is not
acknowledged, so the queue delivers it again. The whole transaction is retried on
serialization failure (40001) and deadlock (40P01).

Environment: DATABASE_URL (else libpq's PGHOST, PGDATABASE, ...), VISIBILITY_TIMEOUT_S
(default 30), EXIT_WHEN_EMPTY=1 (exit once every message is acknowledged). One connection,
one job at a time: run several processes for concurrency. The queue and the receipts
table are in examples/schema.sql.
"""
import os
import sys
import time
from collections import Counter

import psycopg
from psycopg import errors

MAX_ATTEMPTS = 5
ME = f"psycopg-{os.getpid()}"
# done, skipped (a duplicate: done before), retried, failed: the guide's diagnostic hook
stats: Counter[str] = Counter()


# [readme:python-psycopg]
def handle(conn: psycopg.Connection, job_id: str) -> bool:
    """Claim the job and write its effect in one transaction, retried on 40001 and 40P01.
    True: done now; False: done before. Either way it committed: acknowledge the message."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with conn.transaction():  # BEGIN ... COMMIT, or ROLLBACK on an exception
                fresh = conn.execute("SELECT dedup.try_claim(%s)", (job_id,)).fetchone()[0]
                if fresh:
                    conn.execute(
                        "INSERT INTO receipts (job_id, consumer) VALUES (%s, %s)", (job_id, ME)
                    )
                # An effect outside the database cannot join this transaction: lease_psycopg.py
            return fresh
        except (errors.SerializationFailure, errors.DeadlockDetected):
            if attempt == MAX_ATTEMPTS:
                raise
            stats["retried"] += 1
            time.sleep(0.01 * 2**attempt)
# [/readme:python-psycopg]


# [readme:python-psycopg-ack]
def consume_batch(conn: psycopg.Connection, visibility_timeout_s: int) -> int:
    """Receive a batch; acknowledge each message only after its transaction committed."""
    batch = conn.execute(
        "SELECT msg_id, job_id FROM queue.receive(10, %s)", (visibility_timeout_s,)
    ).fetchall()
    for msg_id, job_id in batch:
        try:
            fresh = handle(conn, job_id)
        except psycopg.Error as e:
            # Not acknowledged: the queue delivers it again after the visibility timeout.
            stats["failed"] += 1
            print(f"{ME}: job {job_id} left unacknowledged: {e}", file=sys.stderr)
            continue
        conn.execute("SELECT queue.ack(%s)", (msg_id,))
        stats["done" if fresh else "skipped"] += 1
    return len(batch)
# [/readme:python-psycopg-ack]


def main() -> None:
    vt = int(os.environ.get("VISIBILITY_TIMEOUT_S", "30"))
    exit_when_empty = os.environ.get("EXIT_WHEN_EMPTY") == "1"
    # autocommit: receive and ack run in transactions of their own; handle() opens its own.
    with psycopg.connect(os.environ.get("DATABASE_URL", ""), autocommit=True) as conn:
        while True:
            if consume_batch(conn, vt) > 0:
                continue
            if exit_when_empty and conn.execute("SELECT queue.pending()").fetchone()[0] == 0:
                break
            time.sleep(0.1)
    counts = " ".join(f"{k}={stats[k]}" for k in ("done", "skipped", "retried", "failed"))
    print(f"{ME} summary {counts}")


if __name__ == "__main__":
    main()
