"""The Celery app of the end-to-end test, imported by its workers (celery -A celery_app)
and by the test that publishes the jobs. The effect inserts a receipt; a job sent with
slow=True writes a marker file on its first run and then sleeps inside its transaction, for
the test to kill the worker there. The timed tasks (a queue and a database of their own) sleep
past their hard time limit on their first run, for billiard to kill the pool process there."""

from __future__ import annotations

import os
import pathlib
import time

from celery import Celery

import dedup.celery

DSN = "host={} port={} user=postgres dbname=e2e".format(
    os.environ["DEDUP_TEST_PGHOST"], os.environ["DEDUP_TEST_PGPORT"]
)
MARKERS = pathlib.Path(os.environ["DEDUP_TEST_WORK"]) / "markers"
QUEUE = "dedup_e2e"

app = Celery("dedup_e2e", broker=os.environ["DEDUP_TEST_REDIS_URL"])
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_enable_remote_control=False,
    worker_send_task_events=False,
)
# An abandoned message comes back 4 s after its delivery, within a second.
dedup.celery.configure(app, visibility_timeout=4, restore_interval=1)


@dedup.celery.exactly_once(app, dsn=DSN, scope="e2e", name="e2e.record")
def record(conn, job, slow=False):
    conn.execute("INSERT INTO receipts (job_id, pid) VALUES (%s, %s)", (job, os.getpid()))
    if slow:
        marker = MARKERS / job
        if not marker.exists():  # first run only: the test kills this process meanwhile
            marker.write_text(str(os.getpid()))
            time.sleep(60)


@dedup.celery.exactly_once(app, dsn=DSN, scope="e2e-by-arg", name="e2e.by_arg", job_id=lambda job: job)
def by_arg(conn, job):
    conn.execute("INSERT INTO receipts (job_id, pid) VALUES (%s, %s)", ("arg:" + str(job), os.getpid()))


# Hard time limits: the first run of each job sleeps past time_limit, and billiard kills the
# pool process inside the transaction (the server rolls the claim and the effect back). The
# message must come back. e2e.timed is as exactly_once makes it; e2e.timed_old has the
# acknowledgement on timeout that Celery before 5.7 applies whatever the task says (those
# versions read no acks_on_timeout, and their acks_on_failure_or_timeout defaults to True).
TIMED_QUEUE = "dedup_timed"
TIMED_DSN = DSN.replace("dbname=e2e", "dbname=e2e_timed")
TIME_LIMIT = 2


def sleep_past_the_time_limit(conn, job):
    conn.execute("INSERT INTO receipts (job_id, note) VALUES (%s, %s)", (job, str(os.getpid())))
    marker = MARKERS / job
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(30)


timed = dedup.celery.exactly_once(
    app, dsn=TIMED_DSN, scope="timed", name="e2e.timed", time_limit=TIME_LIMIT
)(sleep_past_the_time_limit)
timed_old = dedup.celery.exactly_once(
    app, dsn=TIMED_DSN, scope="timed", name="e2e.timed_old", time_limit=TIME_LIMIT
)(sleep_past_the_time_limit)
timed_old.acks_on_timeout = True
