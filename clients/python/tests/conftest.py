"""Fixtures: the servers test.sh started (DEDUP_TEST_PGHOST/PGPORT, DEDUP_TEST_REDIS_URL).

Each test module's database is made fresh from template0 with the extension; the
``receipts`` table has a deferred trigger that raises at COMMIT the SQLSTATE a transaction
asked for with ``SET LOCAL dedup_test.fail_at_commit``, so a test's effect injects a
serialization failure or a plain error at COMMIT on the attempts it chooses.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

PGHOST = os.environ["DEDUP_TEST_PGHOST"]
PGPORT = os.environ["DEDUP_TEST_PGPORT"]

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS dedup;
CREATE TABLE receipts (job_id text NOT NULL, scope text NOT NULL DEFAULT 'default', note text);
CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE code text := current_setting('dedup_test.fail_at_commit', true);
BEGIN
    IF coalesce(code, '') <> '' THEN
        RAISE EXCEPTION 'injected % at commit', code USING ERRCODE = code;
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON receipts
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit();
"""


def dsn(dbname: str) -> str:
    return f"host={PGHOST} port={PGPORT} user=postgres dbname={dbname}"


def url(dbname: str, driver: str = "psycopg") -> str:
    return f"postgresql+{driver}://postgres@/{dbname}?host={PGHOST}&port={PGPORT}"


def create_database(name: str, schema: str = SCHEMA) -> str:
    with psycopg.connect(dsn("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    if schema:
        with psycopg.connect(dsn(name), autocommit=True) as c:
            c.execute(schema)
    return name


@pytest.fixture(scope="module")
def dbname(request: pytest.FixtureRequest) -> str:
    return create_database("t_" + request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture
def conn(dbname: str):
    """A psycopg connection in autocommit, as the examples use it."""
    with psycopg.connect(dsn(dbname), autocommit=True) as c:
        yield c


@pytest.fixture
def job() -> str:
    return "job-" + uuid.uuid4().hex


def receipts(conn: psycopg.Connection, job_id: str) -> int:
    return conn.execute("SELECT count(*) FROM receipts WHERE job_id = %s", (str(job_id),)).fetchone()[0]


def claimed(conn: psycopg.Connection, job_id: object, scope: str = "default") -> bool:
    return conn.execute(
        "SELECT count(*) FROM dedup.processed WHERE job_id = %s AND scope = %s", (str(job_id), scope)
    ).fetchone()[0] == 1


# The end-to-end runs' faults, counted by sequences (which rollbacks do not undo): every 11th
# insert attempt raises a deadlock and every 13th COMMIT a serialization failure (both retried
# inside the handler, by run_once); every 17th insert attempt and every 23rd COMMIT a plain
# error, and so does the first attempt of every 25th job: those are not retried by run_once,
# and the message must come back (requeued by Celery, claimed again from a Redis stream) for
# a later delivery to do the job.
FAULTS = """
CREATE EXTENSION dedup;
CREATE TABLE receipts (job_id text NOT NULL, pid int NOT NULL, at timestamptz DEFAULT clock_timestamp());
CREATE SEQUENCE insert_attempts;
CREATE SEQUENCE commit_attempts;
DO $$ BEGIN
    FOR j IN 25..{n} BY 25 LOOP
        EXECUTE format('CREATE SEQUENCE first_attempt_%s', j);
    END LOOP;
END $$;
CREATE FUNCTION fault_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint := nextval('insert_attempts');
    once regclass := to_regclass('first_attempt_' || substr(NEW.job_id, 5));
BEGIN
    IF NEW.job_id LIKE 'job-%' AND once IS NOT NULL AND nextval(once) = 1 THEN
        RAISE EXCEPTION 'injected failure of the first attempt of %', NEW.job_id;
    END IF;
    IF n % 11 = 0 THEN
        RAISE EXCEPTION 'injected deadlock (attempt %)', n USING ERRCODE = 'deadlock_detected';
    END IF;
    IF n % 17 = 0 THEN
        RAISE EXCEPTION 'injected failure (attempt %)', n;
    END IF;
    RETURN NEW;
END $$;
CREATE FUNCTION fault_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint := nextval('commit_attempts');
BEGIN
    IF n % 13 = 0 THEN
        RAISE EXCEPTION 'injected serialization failure at commit (attempt %)', n
            USING ERRCODE = 'serialization_failure';
    END IF;
    IF n % 23 = 0 THEN
        RAISE EXCEPTION 'injected failure at commit (attempt %)', n;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER fault_on_insert BEFORE INSERT ON receipts
    FOR EACH ROW EXECUTE FUNCTION fault_on_insert();
CREATE CONSTRAINT TRIGGER fault_at_commit AFTER INSERT ON receipts
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fault_at_commit();
"""


def faults(n: int) -> str:
    """The schema of an end-to-end database of n jobs named job-1 to job-n."""
    return FAULTS.replace("{n}", str(n))
