"""End to end for psycopg, asyncpg, SQLAlchemy and Django, with Redis Streams as the broker:
N jobs each sent twice (but the killed one), 3 consumer processes (tests/consumer.py) each
using one integration's run_once, the faults of conftest.FAULTS injected in the effect's
transaction, and the consumer running one job killed with SIGKILL inside its transaction.
Every job's receipt must be there exactly once and every message acknowledged."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import psycopg
import pytest
import redis

from conftest import create_database, dsn, faults

N = int(os.environ.get("DEDUP_TEST_STREAM_JOBS", "120"))
CONSUMERS = 3
DRAIN_TIMEOUT_S = 60
CONSUMER = pathlib.Path(__file__).with_name("consumer.py")


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg", "sqlalchemy", "django"])
def test_stream_consumers(driver):
    work = pathlib.Path(os.environ["DEDUP_TEST_WORK"])
    markers = work / "markers"
    markers.mkdir(exist_ok=True)
    dbname = create_database(f"e2e_{driver}", schema=faults(N))
    stream = f"jobs-{driver}"
    r = redis.Redis.from_url(os.environ["DEDUP_TEST_REDIS_URL"], decode_responses=True)
    r.delete(stream)
    r.xgroup_create(stream, "consumers", id="0", mkstream=True)
    slow = N // 3 + 1  # not a multiple of 25, whose first attempt fails before the kill
    (markers / f"job-{slow}").unlink(missing_ok=True)
    # Copy k of job j at position j + 4k: the copies a few messages apart, often in flight
    # together. The job killed mid-run is sent once: its only other delivery is the one that
    # comes back after the kill.
    order = sorted((j + 4 * k, k, j) for j in range(1, N + 1) for k in range(1 if j == slow else 2))
    pipe = r.pipeline()
    for _, _, j in order:
        pipe.xadd(stream, {"job": f"job-{j}", "slow": "1" if j == slow else "0"})
    pipe.execute()

    logs = [open(work / f"{driver}-{i}.log", "wb") for i in range(CONSUMERS)]
    procs = [
        subprocess.Popen([sys.executable, str(CONSUMER), driver, stream, dbname],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for log in logs
    ]
    with open(work / "worker.pids", "a") as pids:  # for test.sh to kill if this test cannot
        pids.writelines(f"{p.pid}\n" for p in procs)
    started = time.monotonic()
    killed = None
    try:
        deadline = started + 30
        while time.monotonic() < deadline and not killed:
            marker = markers / f"job-{slow}"
            if marker.exists() and marker.read_text():
                pid = int(marker.read_text())
                os.kill(pid, signal.SIGKILL)  # inside the job's transaction
                killed = next(p for p in procs if p.pid == pid)
            time.sleep(0.05)
        # Drained: every entry delivered to the group, none pending, three checks in a row.
        deadline = started + DRAIN_TIMEOUT_S
        quiet = 0
        while time.monotonic() < deadline and quiet < 3:
            group = r.xinfo_groups(stream)[0]
            quiet = quiet + 1 if group["pending"] == 0 and group["lag"] == 0 else 0
            time.sleep(0.3)
        elapsed = time.monotonic() - started
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(10)
        for log in logs:
            log.close()
        (work / "worker.pids").unlink()

    output = "".join((work / f"{driver}-{i}.log").read_text(errors="replace") for i in range(CONSUMERS))
    with psycopg.connect(dsn(dbname)) as c:
        counts = dict(c.execute("SELECT job_id, count(*) FROM receipts GROUP BY job_id").fetchall())
        first_failed = c.execute(
            "SELECT count(*) FROM pg_sequences WHERE sequencename LIKE 'first\\_attempt\\_%' AND last_value >= 2"
        ).fetchone()[0]
    expected = {f"job-{j}" for j in range(1, N + 1)}
    duplicates = {j: n for j, n in counts.items() if n > 1}
    missing = expected - counts.keys()
    print(
        f"\n{driver} stream consumers: {N} jobs, {len(order)} messages, {CONSUMERS} processes, drained in "
        f"{elapsed:.1f} s; left unacknowledged after an error: {output.count('left unacknowledged')}; "
        f"duplicates {len(duplicates)}, missing {len(missing)}"
    )
    assert killed is not None, "the slow job never ran"
    assert quiet >= 3, f"not drained within {DRAIN_TIMEOUT_S} s"
    assert not duplicates, f"jobs done more than once: {sorted(duplicates.items())[:10]}"
    assert not missing, f"jobs never done: {sorted(missing)[:10]} ({len(missing)} in all)"
    assert killed.returncode == -signal.SIGKILL
    assert first_failed == N // 25 and output.count("left unacknowledged") >= N // 25
    assert "Traceback" not in output, output[-3000:]
