"""Celery: the task options, the worker's prefetch, and the end-to-end run with Redis:
every job published twice (but the two killed ones), 3 prefork workers, faults injected in the effect's transaction,
one pool process and one whole worker killed with SIGKILL mid-transaction."""

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

import dedup
import dedup.celery
from conftest import create_database, dsn, faults

N = int(os.environ.get("DEDUP_TEST_CELERY_JOBS", "300"))
WORKERS = 3
DRAIN_TIMEOUT_S = 90

@pytest.fixture(scope="module")
def e2e_db():
    create_database("e2e", schema=faults(N))
    return "e2e"


@pytest.fixture(scope="module")
def app_module(e2e_db):
    import celery_app

    return celery_app


def test_task_options_and_configuration(app_module):
    task = app_module.record
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True
    assert task.acks_on_timeout is False  # Celery 5.7's own: a hard time limit requeues
    from kombu.utils.imports import symbol_by_name

    assert task.Request == "dedup.celery:ExactlyOnceRequest"  # requeues it on any version
    assert symbol_by_name(task.Request) is dedup.celery.ExactlyOnceRequest
    conf = app_module.app.conf
    assert conf.worker_prefetch_multiplier == 1
    opts = conf.broker_transport_options
    assert opts["visibility_timeout"] == 4
    assert opts["unacked_restore_interval"] == 1 and opts["unacked_restore_throttle"] == 1


def test_configure_defaults():
    from celery import Celery

    app = Celery("defaults", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.worker_prefetch_multiplier = 8

    @dedup.celery.exactly_once(app, dsn="dbname=none")
    def noop(conn):
        pass

    assert app.conf.worker_prefetch_multiplier == 1
    # kombu's own visibility_timeout (3600 s) stays, but the sweep runs every 10 s, not 100 s
    assert app.conf.broker_transport_options == {"unacked_restore_interval": 10, "unacked_restore_throttle": 1}
    dedup.celery.configure(app, visibility_timeout=60)
    assert app.conf.broker_transport_options["visibility_timeout"] == 60
    assert app.conf.broker_transport_options["unacked_restore_interval"] == 10
    assert dedup.celery.restore_interval_for(20) == 5


def test_worker_prefetch_is_forced_to_one(app_module):
    from celery import signals

    class FakeWorker:
        app = app_module.app
        prefetch_multiplier = 4

    worker = FakeWorker()
    signals.worker_init.send(sender=worker)
    assert worker.prefetch_multiplier == 1


def test_options_that_break_the_guarantee_are_refused():
    from celery import Celery

    app = Celery("refused", broker="redis://127.0.0.1:1/0", set_as_current=False)
    with pytest.raises(dedup.InvalidArgument, match="acks_late must stay True"):
        dedup.celery.exactly_once(app, dsn="x", acks_late=False)
    with pytest.raises(dedup.InvalidArgument, match="reject_on_worker_lost must stay True"):
        dedup.celery.exactly_once(app, dsn="x", reject_on_worker_lost=False)
    with pytest.raises(dedup.InvalidArgument, match="acks_on_timeout must stay False"):
        dedup.celery.exactly_once(app, dsn="x", acks_on_timeout=True)
    with pytest.raises(TypeError, match="Request= is set by dedup"):
        dedup.celery.exactly_once(app, dsn="x", Request="celery.worker.request:Request")
    with pytest.raises(TypeError, match="either dsn= or connect="):
        dedup.celery.exactly_once(app)
    with pytest.raises(dedup.InvalidArgument, match="scope must not be empty"):
        dedup.celery.exactly_once(app, dsn="x", scope="")


def test_eager_run_and_bad_job_id(app_module, e2e_db):
    # apply() runs the task in this process: a fresh job, then its duplicate.
    assert app_module.by_arg.apply(args=["a-1"]).get() is True
    assert app_module.by_arg.apply(args=["a-1"]).get() is False
    # A job id the server would refuse fails the task (no delivery could ever do it).
    result = app_module.by_arg.apply(args=[""])
    assert result.failed() and isinstance(result.result, dedup.InvalidArgument)
    with psycopg.connect(dsn(e2e_db)) as c:
        assert c.execute("SELECT count(*) FROM receipts WHERE job_id = 'arg:a-1'").fetchone()[0] == 1
        c.execute("DELETE FROM receipts WHERE job_id LIKE 'arg:%'")


def start_worker(i: int, work: pathlib.Path, queue: str = "dedup_e2e") -> subprocess.Popen:
    log = open(work / f"worker{i}.log", "wb")
    return subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "celery_app", "worker",
            "--pool", "prefork", "--concurrency", "1",
            # 4 on purpose: exactly_once tasks force it to 1 (the log says so)
            "--prefetch-multiplier", "4",
            "-n", f"w{i}@%h", "-Q", queue, "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def wait_for(path: pathlib.Path, timeout: float) -> int:
    """The pid in the marker of a slow job once it runs; 0 if it did not start in time
    (then the run goes on, and the counts below say what went wrong)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    return 0


def test_end_to_end(app_module, e2e_db):
    work = pathlib.Path(os.environ["DEDUP_TEST_WORK"])
    (work / "markers").mkdir(exist_ok=True)
    for old in (work / "markers").iterdir():
        old.unlink()
    r = redis.Redis.from_url(os.environ["DEDUP_TEST_REDIS_URL"])
    r.flushdb()
    # Killed mid-transaction: a pool process, then a whole worker (no multiple of 25, whose
    # first attempt fails before it could be killed).
    slow = {N // 4 + 1, N // 2 + 1}
    # Copy k of job j at position j + 4k: the two copies a few messages apart, often in
    # flight together. Every job twice, with its id as the task id.
    # The two slow jobs are sent once: their only other delivery is the one that the kill
    # brings back, so that the test sees how it comes back.
    order = sorted((j + 4 * k, k, j) for j in range(1, N + 1) for k in range(1 if j in slow else 2))
    for _, _, j in order:
        app_module.record.apply_async(args=[f"job-{j}"], kwargs={"slow": j in slow}, task_id=f"job-{j}")
    assert r.llen("dedup_e2e") == 2 * N - len(slow)

    workers = [start_worker(i, work) for i in range(1, WORKERS + 1)]
    with open(work / "worker.pids", "a") as pids:  # for test.sh to kill if this test cannot
        pids.writelines(f"{w.pid}\n" for w in workers)
    started = time.monotonic()
    try:
        a, b = sorted(slow)
        # 1. The pool process running job a, inside its transaction: the worker sees it lost
        #    and requeues the message (reject_on_worker_lost).
        pid = wait_for(work / "markers" / f"job-{a}", 60)
        if pid:
            os.kill(pid, signal.SIGKILL)
        # 2. The whole worker (main process and pool process) running job b: nothing
        #    requeues it; kombu's sweep in the other workers returns it after the
        #    visibility timeout.
        pid = wait_for(work / "markers" / f"job-{b}", 60)
        killed_worker, killed_at = None, time.time()
        if pid:
            pgid = os.getpgid(pid)  # the worker's main process: each worker is a session of its own
            os.killpg(pgid, signal.SIGKILL)
            killed_at = time.time()
            killed_worker = next(w for w in workers if w.pid == pgid)

        # Drained: nothing queued and nothing delivered but unacknowledged, twice in a row.
        deadline = started + DRAIN_TIMEOUT_S
        quiet = 0
        while time.monotonic() < deadline and quiet < 3:
            busy = r.llen("dedup_e2e") + r.hlen("unacked")
            quiet = quiet + 1 if busy == 0 else 0
            time.sleep(0.5)
        drained = quiet >= 3
        elapsed = time.monotonic() - started
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()
        (work / "worker.pids").unlink()  # all stopped: nothing for test.sh to kill

    logs = "".join((work / f"worker{i}.log").read_text(errors="replace") for i in range(1, WORKERS + 1))
    with psycopg.connect(dsn(e2e_db)) as c:
        counts = dict(c.execute("SELECT job_id, count(*) FROM receipts GROUP BY job_id").fetchall())
        inserts, commits = c.execute(
            "SELECT last_value FROM insert_attempts UNION ALL SELECT last_value FROM commit_attempts"
        ).fetchall()
        # From its first run's start (the marker's time, just after the delivery): the
        # visibility timeout counts from the delivery, not from the kill.
        marker = work / "markers" / f"job-{b}"
        delivered_at = marker.stat().st_mtime if marker.exists() else killed_at
        returned_after = c.execute(
            "SELECT extract(epoch FROM at) - %s FROM receipts WHERE job_id = %s", (delivered_at, f"job-{b}")
        ).fetchone()
        first_failed = c.execute(
            "SELECT count(*) FROM pg_sequences WHERE sequencename LIKE 'first\\_attempt\\_%' AND last_value >= 2"
        ).fetchone()[0]
    expected = {f"job-{j}" for j in range(1, N + 1)}
    duplicates = {j: n for j, n in counts.items() if n > 1}
    missing = expected - counts.keys()
    print(
        f"\ncelery end-to-end: {N} jobs, {len(order)} messages, {WORKERS} workers, drained in {elapsed:.1f} s; "
        f"{inserts[0]} insert and {commits[0]} commit attempts; requeued after an error: "
        f"{logs.count('message requeued')}; the killed worker's job done again "
        f"{returned_after[0] if returned_after else float('nan'):.1f} s after its delivery; "
        f"duplicates {len(duplicates)}, missing {len(missing)}"
    )
    assert drained, f"the queue did not drain within {DRAIN_TIMEOUT_S} s"
    assert not duplicates, f"jobs done more than once: {sorted(duplicates.items())[:10]}"
    assert not missing, f"jobs never done: {sorted(missing)[:10]} ({len(missing)} in all)"
    assert set(counts) == expected
    # The faults happened, and the messages of the failed attempts came back.
    assert logs.count("message requeued") >= N // 25
    assert first_failed == N // 25
    assert "prefetch multiplier 4 set to 1" in logs
    assert killed_worker is not None and killed_worker.returncode == -signal.SIGKILL
    assert "WorkerLostError('Worker exited prematurely: signal 9 (SIGKILL)" in logs
    # The whole worker's message came back after the visibility timeout (4 s from its
    # delivery), within the 1 s sweep: not after kombu's default 100 s sweep.
    assert returned_after and 3.5 < returned_after[0] < 12
    assert r.llen("dedup_e2e") == 0 and r.hlen("unacked") == 0


def test_coroutine_functions_are_refused_at_registration():
    from celery import Celery

    app = Celery("coro", broker="redis://127.0.0.1:1/0", set_as_current=False)
    with pytest.raises(TypeError, match="async def"):

        @dedup.celery.exactly_once(app, dsn="x")
        async def effect(conn):
            pass


def test_setup_mistakes_requeue_instead_of_dropping(e2e_db, caplog):
    """A mistake that fails every delivery (a connect= function returning a connection in a
    transaction, a job_id= function that raises) must not fail the task: Celery would
    acknowledge it and every message would be dropped. The message is requeued, with an
    error logged, and the bad connection is closed."""
    import logging

    from celery import Celery

    app = Celery("setup", broker="redis://127.0.0.1:1/0", set_as_current=False)
    opened = []

    def connect():
        c = psycopg.connect(dsn(e2e_db))  # autocommit=False ...
        c.execute("SELECT 1")  # ... and left in the transaction psycopg began
        opened.append(c)
        return c

    @dedup.celery.exactly_once(app, connect=connect, scope="setup", requeue_delay=0)
    def in_transaction(conn, job):
        pass

    @dedup.celery.exactly_once(
        app, dsn=dsn(e2e_db), scope="setup", requeue_delay=0, job_id=lambda order: order["id"]
    )
    def by_order_id(conn, order):
        pass

    with caplog.at_level(logging.ERROR, logger="dedup.celery"):
        result = in_transaction.apply(args=["s-1"])
        assert result.state == "REJECTED" and result.result.requeue is True, result.result
        assert "connect=" in caplog.text and "requeued" in caplog.text
        assert opened and opened[0].closed  # discarded: the next delivery connects again
        caplog.clear()
        result = by_order_id.apply(args=[7])  # 7["id"]: TypeError in the job_id function
        assert result.state == "REJECTED" and result.result.requeue is True, result.result
        assert "job_id=" in caplog.text and "requeued" in caplog.text


def test_hard_time_limit_requeues(app_module):
    """billiard kills the pool process of a task past its hard time limit, inside the
    transaction: the message must come back and the job be done once, also where Celery
    itself would acknowledge it (e2e.timed_old, as Celery before 5.7 does)."""
    work = pathlib.Path(os.environ["DEDUP_TEST_WORK"])
    (work / "markers").mkdir(exist_ok=True)
    create_database("e2e_timed")
    jobs = {"timed-1": app_module.timed, "timed-old-1": app_module.timed_old}
    for j in jobs:
        (work / "markers" / j).unlink(missing_ok=True)
    r = redis.Redis.from_url(os.environ["DEDUP_TEST_REDIS_URL"])
    r.delete(app_module.TIMED_QUEUE)
    for j, task in jobs.items():
        task.apply_async(args=[j], task_id=j, queue=app_module.TIMED_QUEUE)
    worker = start_worker(9, work, queue=app_module.TIMED_QUEUE)
    with open(work / "worker.pids", "a") as pids:
        pids.write(f"{worker.pid}\n")
    started = time.monotonic()
    counts: dict = {}
    try:
        with psycopg.connect(dsn("e2e_timed"), autocommit=True) as c:
            while time.monotonic() - started < 45:
                counts = dict(c.execute("SELECT job_id, count(*) FROM receipts GROUP BY job_id").fetchall())
                claims = c.execute("SELECT count(*) FROM dedup.processed WHERE scope = 'timed'").fetchone()[0]
                if len(counts) == len(jobs) and claims == len(jobs):
                    break
                time.sleep(0.5)
            elapsed = time.monotonic() - started
            time.sleep(1)  # a late duplicate would show now
            counts = dict(c.execute("SELECT job_id, count(*) FROM receipts GROUP BY job_id").fetchall())
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        (work / "worker.pids").unlink()
    log = (work / "worker9.log").read_text(errors="replace")
    print(f"\ncelery hard time limit: {counts} after {elapsed:.1f} s")
    assert all((work / "markers" / j).exists() for j in jobs), "a first run did not start"
    assert log.count(f"Hard time limit ({app_module.TIME_LIMIT}s) exceeded") >= len(jobs), log[-2000:]
    assert counts == {j: 1 for j in jobs}, log[-2000:]
