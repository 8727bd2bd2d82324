"""Django: ``claim(job_id)`` in the transaction of ``transaction.atomic()``, ``run_once``, and
an app whose migration creates the extension.

Add ``"dedup.django"`` to ``INSTALLED_APPS`` and run ``migrate`` (the migration runs
``CREATE EXTENSION IF NOT EXISTS dedup``). Then, in a handler::

    from django.db import transaction
    import dedup.django

    with transaction.atomic():
        if dedup.django.claim(message.id):
            Receipt.objects.create(job_id=message.id)

or ``dedup.django.run_once(message.id, lambda: Receipt.objects.create(...))``, which opens
the atomic block, retries it on 40001/40P01 and says whether the effect ran.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .. import _core
from .._core import JobId


def _connection(using: str) -> Any:
    from django.db import connections

    if not isinstance(using, str) or not using:
        raise TypeError("dedup.django: using must be the name of a database in settings.DATABASES")
    return connections[using]


def _claim_sql(job_id: JobId, fingerprint: Optional[str]) -> str:
    cast = _core.job_cast(job_id)
    if fingerprint is None:
        return f"SELECT dedup.try_claim(%s::{cast}, %s::text)"
    return f"SELECT dedup.try_claim(%s::{cast}, %s::text, %s::text)"


def claim(
    job_id: JobId, scope: str = "default", using: str = "default", fingerprint: Optional[str] = None
) -> bool:
    """Claim ``job_id`` in the current transaction of the connection ``using``.

    Call it inside ``transaction.atomic(using=using)``, with the effect's writes on the same
    database: True means do the effect, False means the job was done before. Outside an
    atomic block (under Django's default autocommit) it raises
    :class:`dedup.NotInTransaction` before sending anything.
    """
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    connection = _connection(using)
    if connection.vendor != "postgresql":
        raise TypeError(f"dedup.django: database {using!r} is {connection.vendor}, not PostgreSQL")
    if not connection.in_atomic_block and connection.get_autocommit():
        raise _core.NotInTransaction(
            _core.NOT_IN_TRANSACTION.format(
                what=f"Django connection {using!r}",
                why="not inside transaction.atomic(), and Django runs in autocommit",
                how=f"with transaction.atomic(using={using!r}): ...",
            )
        )
    params = [job_id, scope] + ([] if fingerprint is None else [fingerprint])
    with _core.translated():
        with connection.cursor() as cursor:
            cursor.execute(_claim_sql(job_id, fingerprint), params)
            return bool(cursor.fetchone()[0])


def _check_not_aborted(connection: Any) -> None:
    """After a fresh effect, before the atomic block ends. Django rolls back, without
    raising, a block that an error caught inside it (in the ORM: mark_for_rollback_on_error)
    marked for rollback; and the driver commits a transaction the server aborted (an error
    caught on a raw cursor) without raising either: the server answers ROLLBACK."""
    if connection.needs_rollback:
        raise _core.aborted(
            "dedup.django.run_once",
            "a nested transaction.atomic() block",
            " (the atomic block is marked for rollback, as the ORM does on a database error)",
        )
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as e:
        if _core.sqlstate(e) == _core.IN_FAILED_SQL_TRANSACTION:
            raise _core.aborted(
                "dedup.django.run_once", "a nested transaction.atomic() block", " (SELECT 1 fails with 25P02)"
            ) from e
        raise


def run_once(
    job_id: JobId,
    effect: Callable[[], Any],
    scope: str = "default",
    using: str = "default",
    retries: int = _core.DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    """Open ``transaction.atomic(using=using)``, claim, call ``effect()`` only when the
    claim is fresh, commit; retry the whole block on 40001/40P01. Returns whether the effect
    ran. It must own the transaction: inside an atomic block it raises
    :class:`dedup.InTransaction` (a nested block is only a savepoint, and a serialization
    failure dooms the outer transaction). An effect that catches a database error and goes on
    (the server's transaction aborted, or the block marked for rollback) makes it raise
    :class:`dedup.TransactionAborted` after the rollback, not return True."""
    from django.db import transaction

    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    retries = _core.check_retries(retries)
    connection = _connection(using)
    if connection.in_atomic_block or not connection.get_autocommit():
        raise _core.InTransaction(_core.IN_TRANSACTION_RUN_ONCE.format(what=f"Django connection {using!r}"))
    attempt = 0
    while True:
        try:
            with transaction.atomic(using=using):
                fresh = claim(job_id, scope, using, fingerprint)
                if fresh:
                    _core.call_sync_effect("dedup.django.run_once", effect)
                    _check_not_aborted(connection)
            return fresh
        except Exception as e:
            if attempt >= retries or not _core.is_retryable(e):
                raise
        attempt += 1
        time.sleep(_core.backoff(attempt))
