"""A queue consumer whose effect is a call to another service (a payment, an email), with
a leased claim: dedup.lease, the call with the job id as its idempotency key,
dedup.complete (psycopg 3, synchronous).

No transaction spans a call to another service, so the claim cannot commit together with
the effect as in consumer_psycopg.py. Instead, for every message, each step in a short
transaction of its own: lease the job; on 'done' acknowledge the message; on 'busy' leave
it (another consumer holds the job; the queue delivers the message again); on 'acquired'
make the call, complete the lease, and only then acknowledge. A consumer that dies holding
a lease loses it when it expires, so the job is never lost; one that dies between the call
and dedup.complete makes the next holder repeat the call, which the idempotency key turns
into a no-op at the service.

Environment: DATABASE_URL (else libpq's PGHOST, PGDATABASE, ...), CHARGES_URL (the
service: a POST with an Idempotency-Key header, answering JSON), LEASE_S
(default 30), VISIBILITY_TIMEOUT_S (default 30), EXIT_WHEN_EMPTY=1 (exit once every
message is acknowledged). One connection, one job at a time: run several processes for
concurrency. The queue is in examples/schema.sql.
"""
import json
import os
import sys
import time
import urllib.request
from collections import Counter
from datetime import timedelta

import psycopg
from psycopg.types.json import Jsonb

SCOPE = "charges"
LEASE = timedelta(seconds=float(os.environ.get("LEASE_S", "30")))
CHARGES_URL = os.environ.get("CHARGES_URL", "http://127.0.0.1:8080/charges")
ME = f"psycopg-lease-{os.getpid()}"
# done, skipped (done before), busy (held by another consumer), failed
stats: Counter[str] = Counter()


# [readme:python-psycopg-lease]
def charge(job_id: str) -> dict:
    """The external effect, with the job id as its idempotency key: the service does a
    repeated call once. Its JSON answer becomes the job's stored result. The timeout is half
    the lease: this process cannot extend the lease while it waits (no heartbeat), so the
    call ends, or is given up, well before the lease expires."""
    request = urllib.request.Request(
        CHARGES_URL,
        data=json.dumps({"job": job_id, "consumer": ME}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": job_id},
    )
    with urllib.request.urlopen(request, timeout=LEASE.total_seconds() / 2) as response:
        return json.load(response)


def handle(conn: psycopg.Connection, job_id: str) -> str:
    """Lease the job, charge, complete; each statement is a transaction of its own.
    'acquired': charged now; 'done': done before; both mean: acknowledge the message.
    'busy': another consumer holds the lease: leave the message unacknowledged."""
    status, lease_id = conn.execute(
        "SELECT status, lease_id FROM dedup.lease(%s, %s, %s)", (job_id, SCOPE, LEASE)
    ).fetchone()
    if status != "acquired":
        return status
    try:
        answer = charge(job_id)
    except Exception:
        # Give the job back, so the redelivered copy need not wait for the lease to expire.
        # If the call did reach the service, the idempotency key makes the retry harmless.
        conn.execute("SELECT dedup.release_lease(%s, %s, %s)", (job_id, lease_id, SCOPE))
        raise
    # YD002 here means the lease expired and another consumer took the job over: it repeats
    # the call (the key makes that a no-op) and completes. Do not acknowledge then: if that
    # consumer dies before completing, the redelivered message is what gets the job done; a
    # copy that finds the job done acknowledges it.
    conn.execute(
        "SELECT dedup.complete(%s, %s, %s, %s)",
        (job_id, lease_id, Jsonb(answer), SCOPE),
    )
    return "acquired"


def consume_batch(conn: psycopg.Connection, visibility_timeout_s: int) -> int:
    """Receive a batch; acknowledge a message only once its job is done."""
    batch = conn.execute(
        "SELECT msg_id, job_id FROM queue.receive(10, %s)", (visibility_timeout_s,)
    ).fetchall()
    for msg_id, job_id in batch:
        try:
            status = handle(conn, job_id)
        except (psycopg.Error, OSError) as e:  # OSError: the call failed or timed out
            # Not acknowledged: the queue delivers it again after the visibility timeout.
            stats["failed"] += 1
            print(f"{ME}: job {job_id} left unacknowledged: {e}", file=sys.stderr)
            continue
        if status == "busy":
            stats["busy"] += 1  # not acknowledged: if the holder dies, this copy does the job
            continue
        conn.execute("SELECT queue.ack(%s)", (msg_id,))
        stats["done" if status == "acquired" else "skipped"] += 1
    return len(batch)
# [/readme:python-psycopg-lease]


def main() -> None:
    vt = int(os.environ.get("VISIBILITY_TIMEOUT_S", "30"))
    exit_when_empty = os.environ.get("EXIT_WHEN_EMPTY") == "1"
    # autocommit: every statement is a transaction of its own, the lease's included.
    with psycopg.connect(os.environ.get("DATABASE_URL", ""), autocommit=True) as conn:
        while True:
            if consume_batch(conn, vt) > 0:
                continue
            if exit_when_empty and conn.execute("SELECT queue.pending()").fetchone()[0] == 0:
                break
            time.sleep(0.1)
    counts = " ".join(f"{k}={stats[k]}" for k in ("done", "skipped", "busy", "failed"))
    print(f"{ME} summary {counts}")


if __name__ == "__main__":
    main()
