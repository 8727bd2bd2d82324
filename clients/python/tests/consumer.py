"""A consumer of a Redis stream (consumer group, XREADGROUP / XACK, XAUTOCLAIM for messages
a dead or failed consumer left pending) whose handler is one of the package's integrations:

    python consumer.py psycopg|asyncpg|sqlalchemy|django STREAM DBNAME

Each message's job is done with that integration's run_once (the effect: a receipt row) and
acknowledged only after it returned; an error leaves the message pending, to be claimed
again after IDLE_MS. A job sent with slow=1 writes a marker file on its first run and then
sleeps inside its transaction, for the test to kill this process there. Runs until killed.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import time

import redis

import dedup

DRIVER, STREAM, DBNAME = sys.argv[1:4]
GROUP = "consumers"
IDLE_MS = 2000  # a message pending this long (its consumer died, or failed it) is claimed again
ME = f"{DRIVER}-{os.getpid()}"
MARKERS = pathlib.Path(os.environ["DEDUP_TEST_WORK"]) / "markers"
HOST, PORT = os.environ["DEDUP_TEST_PGHOST"], os.environ["DEDUP_TEST_PGPORT"]
DSN = f"host={HOST} port={PORT} user=postgres dbname={DBNAME}"
INSERT = "INSERT INTO receipts (job_id, pid) VALUES ({0}, {1})"

r = redis.Redis.from_url(os.environ["DEDUP_TEST_REDIS_URL"], decode_responses=True)


def maybe_slow(job: str, slow: bool) -> None:
    if slow:
        marker = MARKERS / job
        if not marker.exists():  # first run only: the test kills this process meanwhile
            marker.write_text(str(os.getpid()))
            time.sleep(60)


def receive() -> list:
    """Abandoned messages first (pending longer than IDLE_MS), then new ones."""
    _, claimed, *_ = r.xautoclaim(STREAM, GROUP, ME, min_idle_time=IDLE_MS, start_id="0-0", count=10)
    messages = [m for m in claimed if m and m[1]]
    if not messages:
        got = r.xreadgroup(GROUP, ME, {STREAM: ">"}, count=10, block=200)
        messages = got[0][1] if got else []
    return messages


def loop(handle) -> None:
    while True:
        for msg_id, fields in receive():
            job, slow = fields["job"], fields.get("slow") == "1"
            try:
                handle(job, slow)
            except Exception as e:  # not acknowledged: claimed again after IDLE_MS
                print(f"{ME}: job {job} left unacknowledged: {type(e).__name__}: {e}".splitlines()[0],
                      file=sys.stderr, flush=True)
                continue
            r.xack(STREAM, GROUP, msg_id)


def run_psycopg() -> None:
    import psycopg

    conn = psycopg.connect(DSN, autocommit=True)

    def handle(job: str, slow: bool) -> None:
        def effect(c):
            c.execute(INSERT.format("%s", "%s"), (job, os.getpid()))
            maybe_slow(job, slow)

        dedup.run_once(conn, job, effect, scope="e2e")

    loop(handle)


def run_asyncpg() -> None:
    import asyncpg

    # One event loop drives each job in turn (the Redis calls are the sync client's).
    ev = asyncio.new_event_loop()
    asyncio.set_event_loop(ev)
    pool = ev.run_until_complete(
        asyncpg.create_pool(host=HOST, port=PORT, user="postgres", database=DBNAME, min_size=1, max_size=2)
    )

    def handle(job: str, slow: bool) -> None:
        async def effect(c):
            await c.execute(INSERT.format("$1", "$2"), job, os.getpid())
            maybe_slow(job, slow)

        ev.run_until_complete(dedup.run_once_async(pool, job, effect, scope="e2e"))

    loop(handle)


def run_sqlalchemy() -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import sessionmaker

    Session = sessionmaker(create_engine(f"postgresql+psycopg://postgres@/{DBNAME}?host={HOST}&port={PORT}"))

    def handle(job: str, slow: bool) -> None:
        def effect(session):
            session.execute(text(INSERT.format(":job", ":pid")), {"job": job, "pid": os.getpid()})
            maybe_slow(job, slow)

        dedup.run_once(Session, job, effect, scope="e2e")

    loop(handle)


def run_django() -> None:
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "HOST": HOST, "PORT": PORT,
                               "USER": "postgres", "NAME": DBNAME}},
        INSTALLED_APPS=["dedup.django"],
    )
    django.setup()
    from django.db import connection

    import dedup.django

    def handle(job: str, slow: bool) -> None:
        def effect():
            with connection.cursor() as cur:
                cur.execute(INSERT.format("%s", "%s"), [job, os.getpid()])
            maybe_slow(job, slow)

        dedup.django.run_once(job, effect, scope="e2e")

    loop(handle)


if __name__ == "__main__":
    {"psycopg": run_psycopg, "asyncpg": run_asyncpg, "sqlalchemy": run_sqlalchemy, "django": run_django}[DRIVER]()
