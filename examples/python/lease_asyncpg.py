"""A queue consumer whose effect is a call to another service (a payment, an email), with
a leased claim: dedup.lease, the call with the job id as its idempotency key, a heartbeat
while it runs, dedup.complete (asyncpg, asyncio).

No transaction spans a call to another service, so the claim cannot commit together with
the effect as in consumer_asyncpg.py. Instead, for every message, each step in a short
transaction of its own: lease the job; on 'done' acknowledge the message; on 'busy' leave
it (another consumer holds the job; the queue delivers the message again); on 'acquired'
make the call, complete the lease, and only then acknowledge. A consumer that dies holding
a lease loses it when it expires, so the job is never lost; one that dies between the call
and dedup.complete makes the next holder repeat the call, which the idempotency key turns
into a no-op at the service.

Environment: DATABASE_URL (a postgresql:// URL; else PGHOST, PGDATABASE, ...), CHARGES_URL
(the service: a POST with an Idempotency-Key header, answering JSON), LEASE_S (default
30), WORKERS (concurrent tasks sharing a pool; default 4), VISIBILITY_TIMEOUT_S (default
30), EXIT_WHEN_EMPTY=1 (exit once every message is acknowledged). The queue is in
examples/schema.sql.
"""
import asyncio
import json
import os
import sys
import urllib.request
from collections import Counter
from datetime import timedelta

import asyncpg

SCOPE = "charges"
LEASE = timedelta(seconds=float(os.environ.get("LEASE_S", "30")))
CHARGES_URL = os.environ.get("CHARGES_URL", "http://127.0.0.1:8080/charges")
CALL_TIMEOUT_S = 60  # the heartbeat holds the lease for this long at most
ME = f"asyncpg-lease-{os.getpid()}"
# done, skipped (done before), busy (held by another consumer), failed
stats: Counter[str] = Counter()


# [readme:python-asyncpg-lease]
def charge(job_id: str) -> dict:
    """The external effect, with the job id as its idempotency key: the service does a
    repeated call once. Its JSON answer becomes the job's stored result. (Blocking, so it
    runs in a thread; with an async HTTP client such as aiohttp, await it directly.)"""
    request = urllib.request.Request(
        CHARGES_URL,
        data=json.dumps({"job": job_id, "consumer": ME}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": job_id},
    )
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as response:
        return json.load(response)


async def handle(pool: asyncpg.Pool, job_id: str) -> str:
    """Lease the job, charge, complete; each statement is a transaction of its own.
    'acquired': charged now; 'done': done before; both mean: acknowledge the message.
    'busy': another consumer holds the lease: leave the message unacknowledged."""
    status, lease_id = await pool.fetchrow(
        "SELECT status, lease_id FROM dedup.lease($1, $2, $3)", job_id, SCOPE, LEASE
    )
    if status != "acquired":
        return status
    # The call, and a heartbeat extending the lease every third of its duration meanwhile.
    call = asyncio.ensure_future(asyncio.to_thread(charge, job_id))
    while not (await asyncio.wait({call}, timeout=LEASE.total_seconds() / 3))[0]:
        # An error (YD002: the lease expired and was taken over) gives the job up.
        await pool.execute(
            "SELECT dedup.extend_lease($1, $2, $3, $4)", job_id, lease_id, LEASE, SCOPE
        )
    try:
        answer = call.result()
    except Exception:
        # Give the job back, so the redelivered copy need not wait for the lease to expire.
        # If the call did reach the service, the idempotency key makes the retry harmless.
        await pool.execute("SELECT dedup.release_lease($1, $2, $3)", job_id, lease_id, SCOPE)
        raise
    # YD002 here means the lease expired and another consumer took the job over: it repeats
    # the call (the key makes that a no-op) and completes. Do not acknowledge then: if that
    # consumer dies before completing, the redelivered message is what gets the job done; a
    # copy that finds the job done acknowledges it.
    await pool.execute(
        "SELECT dedup.complete($1, $2, $3, $4)", job_id, lease_id, json.dumps(answer), SCOPE
    )
    return "acquired"


async def consume_batch(pool: asyncpg.Pool, visibility_timeout_s: int) -> int:
    """Receive a batch; acknowledge a message only once its job is done."""
    batch = await pool.fetch(
        "SELECT msg_id, job_id FROM queue.receive(10, $1)", visibility_timeout_s
    )
    for msg_id, job_id in batch:
        try:
            status = await handle(pool, job_id)
        except (asyncpg.PostgresError, OSError) as e:  # OSError: the call failed or timed out
            # Not acknowledged: the queue delivers it again after the visibility timeout.
            stats["failed"] += 1
            print(f"{ME}: job {job_id} left unacknowledged: {e}", file=sys.stderr)
            continue
        if status == "busy":
            stats["busy"] += 1  # not acknowledged: if the holder dies, this copy does the job
            continue
        await pool.execute("SELECT queue.ack($1)", msg_id)
        stats["done" if status == "acquired" else "skipped"] += 1
    return len(batch)
# [/readme:python-asyncpg-lease]


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
    counts = " ".join(f"{k}={stats[k]}" for k in ("done", "skipped", "busy", "failed"))
    print(f"{ME} summary {counts}")


if __name__ == "__main__":
    asyncio.run(main())
