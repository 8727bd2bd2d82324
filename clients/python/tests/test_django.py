"""Django: the app's migration, claim(job_id) in transaction.atomic() on the default and a
named connection, run_once, misuse outside an atomic block."""

from __future__ import annotations

import psycopg
import pytest

import dedup
from conftest import PGHOST, PGPORT, SCHEMA, create_database, dsn

DB = "t_django"
OTHER = "t_django_other"


@pytest.fixture(scope="module")
def django_setup():
    import django
    from django.conf import settings
    from django.core.management import call_command

    create_database(DB, schema="")  # no extension: the migration makes it
    create_database(OTHER)
    db = {"ENGINE": "django.db.backends.postgresql", "HOST": PGHOST, "PORT": PGPORT, "USER": "postgres"}
    settings.configure(
        DATABASES={"default": {**db, "NAME": DB}, "other": {**db, "NAME": OTHER}},
        INSTALLED_APPS=["dedup.django"],
        USE_TZ=True,
    )
    django.setup()
    call_command("migrate", "dedup", verbosity=0)
    with psycopg.connect(dsn(DB), autocommit=True) as c:
        c.execute(SCHEMA.replace("CREATE EXTENSION IF NOT EXISTS dedup;", ""))
    yield
    from django.db import connections

    connections.close_all()


def extension_version(dbname: str):
    with psycopg.connect(dsn(dbname)) as c:
        row = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'dedup'").fetchone()
    return row and row[0]


def test_migration_creates_the_extension_and_unapplying_keeps_it(django_setup):
    from django.core.management import call_command

    assert extension_version(DB) == dedup.__version__
    call_command("migrate", "dedup", "zero", verbosity=0)  # the reverse is a no-op on purpose
    assert extension_version(DB) == dedup.__version__
    call_command("migrate", "dedup", verbosity=0)  # IF NOT EXISTS: again without error


def test_claim_in_atomic(django_setup, job):
    from django.db import connection, transaction

    import dedup.django

    with transaction.atomic():
        assert dedup.django.claim(job) is True
        with connection.cursor() as cur:
            cur.execute("INSERT INTO receipts (job_id) VALUES (%s)", [job])
    with transaction.atomic():
        assert dedup.django.claim(job) is False
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            assert dedup.django.claim(job + "-rb") is True
            raise RuntimeError("effect failed")
    with transaction.atomic():
        assert dedup.django.claim(job + "-rb") is True  # rolled back with the effect


def test_named_connection(django_setup, job):
    from django.db import transaction

    import dedup.django

    with transaction.atomic(using="other"):
        assert dedup.django.claim(job, scope="mail", using="other") is True
    with transaction.atomic():  # the default database has no such claim
        assert dedup.django.claim(job, scope="mail") is True
    with transaction.atomic(using="other"):
        assert dedup.django.claim(job, scope="mail", using="other") is False
    # atomic on the default database is no transaction on "other"
    with transaction.atomic():
        with pytest.raises(dedup.NotInTransaction, match="'other'"):
            dedup.django.claim(job + "-x", using="other")


def test_misuse_and_bad_input(django_setup, job):
    from django.db import connection, transaction

    import dedup.django

    with pytest.raises(dedup.NotInTransaction, match=r"not inside transaction.atomic\(\)"):
        dedup.django.claim(job)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM dedup.processed WHERE job_id = %s", [job])
        assert cur.fetchone()[0] == 0  # nothing was sent
    with transaction.atomic():
        with pytest.raises(dedup.InvalidArgument, match="must not be None"):
            dedup.django.claim(None)
        with pytest.raises(TypeError, match="not bytes"):
            dedup.django.claim(b"x")
        with pytest.raises(TypeError, match="name of a database"):
            dedup.django.claim(job, using=None)
        assert dedup.django.claim(job) is True  # the transaction is not aborted


def test_run_once(django_setup, job):
    from django.db import connection, transaction

    import dedup.django

    attempts = []

    def effect():
        attempts.append(1)
        with connection.cursor() as cur:
            cur.execute("INSERT INTO receipts (job_id) VALUES (%s)", [job])
            if len(attempts) == 1:
                cur.execute("SELECT set_config('dedup_test.fail_at_commit', '40001', true)")

    assert dedup.django.run_once(job, effect) is True
    assert dedup.django.run_once(job, effect) is False
    assert len(attempts) == 2
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM receipts WHERE job_id = %s", [job])
        assert cur.fetchone()[0] == 1
    with transaction.atomic():
        with pytest.raises(dedup.InTransaction):
            dedup.django.run_once(job + "-n", effect)


def test_run_once_refuses_to_commit_an_aborted_transaction(django_setup, job):
    """An effect that catches a database error and carries on: on a raw cursor the server's
    transaction is aborted (COMMIT ends in ROLLBACK without raising); through the ORM
    (mark_for_rollback_on_error, as Model.save does) Django marks the atomic block for
    rollback and rolls it back at its end without raising. Either way run_once must raise,
    not return True."""
    from django.db import DatabaseError, connection, transaction

    import dedup.django

    def count(j):
        with connection.cursor() as cur:
            cur.execute(
                "SELECT (SELECT count(*) FROM receipts WHERE job_id = %s),"
                " (SELECT count(*) FROM dedup.processed WHERE job_id = %s)", [j, j]
            )
            return cur.fetchone()

    for how in ("cursor", "orm"):
        j = f"{job}-{how}"

        def swallowing(j=j, how=how):
            with connection.cursor() as cur:
                cur.execute("INSERT INTO receipts (job_id) VALUES (%s)", [j])
                try:
                    if how == "orm":
                        with transaction.mark_for_rollback_on_error():
                            cur.execute("SELECT 1/0")
                    else:
                        cur.execute("SELECT 1/0")
                except DatabaseError:
                    pass

        def effect(j=j):
            with connection.cursor() as cur:
                cur.execute("INSERT INTO receipts (job_id) VALUES (%s)", [j])

        with pytest.raises(dedup.TransactionAborted):
            dedup.django.run_once(j, swallowing)
        assert not connection.in_atomic_block
        assert count(j) == (0, 0)
        assert dedup.django.run_once(j, effect) is True
        assert count(j) == (1, 1)


def test_run_once_refuses_a_coroutine_effect(django_setup, job):
    from django.db import connection

    import dedup.django

    async def effect():
        pass

    with pytest.raises(TypeError, match="coroutine"):
        dedup.django.run_once(job, effect)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM dedup.processed WHERE job_id = %s", [job])
        assert cur.fetchone()[0] == 0
