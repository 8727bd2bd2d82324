"""psycopg 3: ``Connection`` (sync) and ``AsyncConnection``."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable, Optional

from . import _core
from ._core import JobId, Lease


def _status(conn: Any) -> Any:
    from psycopg.pq import TransactionStatus

    return conn.info.transaction_status, TransactionStatus


def _check_claimable(conn: Any) -> None:
    status, TS = _status(conn)
    # IDLE on a connection without autocommit is fine: psycopg sends BEGIN first, and the
    # claim is in the transaction that conn.commit() commits with the effect.
    if status == TS.IDLE and conn.autocommit:
        raise _core.NotInTransaction(
            _core.NOT_IN_TRANSACTION.format(
                what="psycopg connection",
                why="autocommit=True and no conn.transaction() block",
                how="with conn.transaction(): ...",
            )
        )


def _check_idle(conn: Any, message: str) -> None:
    status, TS = _status(conn)
    if status != TS.IDLE:
        raise _core.InTransaction(message)


def _check_not_aborted(conn: Any, func: str) -> None:
    """After a fresh effect, before COMMIT: psycopg commits an aborted transaction (the
    server answers ROLLBACK) without raising."""
    status, TS = _status(conn)
    if status == TS.INERROR:
        raise _core.aborted(func, "a nested with conn.transaction(): block", " (the connection is INERROR)")


def _claim_sql(job_id: JobId, fingerprint: Optional[str]) -> tuple[str, tuple[Any, ...]]:
    cast = _core.job_cast(job_id)
    if fingerprint is None:
        return f"SELECT dedup.try_claim(%s::{cast}, %s::text)", ()
    return f"SELECT dedup.try_claim(%s::{cast}, %s::text, %s::text)", (fingerprint,)


def _execute_claim(conn: Any, job_id: JobId, scope: str, fingerprint: Optional[str]) -> bool:
    sql, extra = _claim_sql(job_id, fingerprint)
    with _core.translated():
        row = conn.execute(sql, (job_id, scope, *extra)).fetchone()
    return bool(row[0])


def claim(conn: Any, job_id: JobId, scope: str = "default", fingerprint: Optional[str] = None) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    _check_claimable(conn)
    return _execute_claim(conn, job_id, scope, fingerprint)


def run_once(
    conn: Any,
    job_id: JobId,
    effect: Callable[[Any], Any],
    scope: str = "default",
    retries: int = _core.DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    retries = _core.check_retries(retries)
    _check_idle(conn, _core.IN_TRANSACTION_RUN_ONCE.format(what="psycopg connection"))
    attempt = 0
    while True:
        try:
            with conn.transaction():  # BEGIN ... COMMIT, or ROLLBACK on an exception
                fresh = _execute_claim(conn, job_id, scope, fingerprint)
                if fresh:
                    _core.call_sync_effect("dedup.run_once", effect, conn)
                    _check_not_aborted(conn, "dedup.run_once")
            return fresh
        except Exception as e:
            if attempt >= retries or conn.closed or not _core.is_retryable(e):
                raise
        attempt += 1
        time.sleep(_core.backoff(attempt))


async def claim_async(
    conn: Any, job_id: JobId, scope: str = "default", fingerprint: Optional[str] = None
) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    _check_claimable(conn)
    return await _execute_claim_async(conn, job_id, scope, fingerprint)


async def _execute_claim_async(conn: Any, job_id: JobId, scope: str, fingerprint: Optional[str]) -> bool:
    sql, extra = _claim_sql(job_id, fingerprint)
    with _core.translated():
        cur = await conn.execute(sql, (job_id, scope, *extra))
        row = await cur.fetchone()
    return bool(row[0])


async def run_once_async(
    conn: Any,
    job_id: JobId,
    effect: Callable[[Any], Any],
    scope: str = "default",
    retries: int = _core.DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    retries = _core.check_retries(retries)
    _check_idle(conn, _core.IN_TRANSACTION_RUN_ONCE.format(what="psycopg connection"))
    attempt = 0
    while True:
        try:
            async with conn.transaction():
                fresh = await _execute_claim_async(conn, job_id, scope, fingerprint)
                if fresh:
                    result = effect(conn)
                    if inspect.isawaitable(result):
                        await result
                    _check_not_aborted(conn, "dedup.run_once_async")
            return fresh
        except Exception as e:
            if attempt >= retries or conn.closed or not _core.is_retryable(e):
                raise
        attempt += 1
        await asyncio.sleep(_core.backoff(attempt))


# Leases (sync psycopg). Each of lease, extend_lease and release_lease runs in a
# transaction of its own that commits at once; complete runs in the caller's transaction
# when the caller opened one (with a database write that goes with the effect), else in its
# own.


def _own_transaction(conn: Any, func: str, sql: str, params: tuple[Any, ...]) -> Any:
    _check_idle(conn, _core.IN_TRANSACTION_LEASE.format(func=func, what="psycopg connection"))
    with _core.translated():
        with conn.transaction():
            return conn.execute(sql, params).fetchone()


def lease(
    conn: Any,
    job_id: JobId,
    scope: str = "default",
    duration: Any = None,
    fingerprint: Optional[str] = None,
) -> Lease:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    scope = _core.check_scope(scope)
    duration = _core.check_duration(duration)
    fingerprint = _core.check_fingerprint(fingerprint)
    row = _own_transaction(
        conn,
        "lease",
        "SELECT status, lease_id, expires_at, result, claimed_at"
        " FROM dedup.lease(%s::text, %s::text, %s::interval, %s::text)",
        (job, scope, duration, fingerprint),
    )
    return Lease(*row)


COMPLETE_IN_IMPLICIT_TRANSACTION = (
    "dedup.complete: the psycopg connection (autocommit=False) is in an implicit transaction, "
    "which psycopg began at an earlier statement, not in a conn.transaction() block: complete "
    "would join it and commit only at a later conn.commit(), and a message acknowledged "
    "before that would lose the job's completion if it never came. Commit or roll back first "
    "(complete then runs in a transaction of its own), or put the write that goes with the "
    "effect and complete in a `with conn.transaction():` block."
)


def _in_transaction_block(conn: Any) -> bool:
    """Whether the caller is inside ``with conn.transaction():``. psycopg has no public flag
    for it: its connection counts the open blocks in ``_num_transactions`` (3.0 to 3.3). If a
    version drops the counter, this says False and complete refuses rather than guesses
    (tests/test_lease.py would fail)."""
    return bool(getattr(conn, "_num_transactions", 0))


def complete(conn: Any, job_id: JobId, lease_id: Any, result: Any = None, scope: str = "default") -> None:
    """In the caller's transaction when the caller opened one (an autocommit connection in a
    transaction, or a ``conn.transaction()`` block), else in a transaction of its own; on a
    connection without autocommit in the implicit transaction psycopg began, refused."""
    from psycopg.types.json import Jsonb

    job = _core.lease_job_text(_core.check_job_id(job_id))
    lease_id = _core.check_lease_id(lease_id)
    scope = _core.check_scope(scope)
    sql = "SELECT dedup.complete(%s::text, %s::uuid, %s::jsonb, %s::text)"
    params = (job, lease_id, None if result is None else Jsonb(result), scope)
    status, TS = _status(conn)
    if status == TS.INTRANS:
        if not (conn.autocommit or _in_transaction_block(conn)):
            raise _core.InTransaction(COMPLETE_IN_IMPLICIT_TRANSACTION)
        with _core.translated():  # in the caller's transaction: it commits with the caller's write
            conn.execute(sql, params)
        return
    _own_transaction(conn, "complete", sql, params)


def extend_lease(
    conn: Any, job_id: JobId, lease_id: Any, duration: Any = None, scope: str = "default"
) -> Any:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    lease_id = _core.check_lease_id(lease_id)
    duration = _core.check_duration(duration)
    scope = _core.check_scope(scope)
    row = _own_transaction(
        conn,
        "extend_lease",
        "SELECT dedup.extend_lease(%s::text, %s::uuid, %s::interval, %s::text)",
        (job, lease_id, duration, scope),
    )
    return row[0]


def release_lease(conn: Any, job_id: JobId, lease_id: Any, scope: str = "default") -> None:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    lease_id = _core.check_lease_id(lease_id)
    scope = _core.check_scope(scope)
    _own_transaction(
        conn,
        "release_lease",
        "SELECT dedup.release_lease(%s::text, %s::uuid, %s::text)",
        (job, lease_id, scope),
    )
