"""asyncpg: ``Connection`` and ``Pool`` (async only)."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, Callable, Optional

from . import _core
from ._core import JobId, Lease


def is_pool(obj: Any) -> bool:
    return type(obj).__name__ == "Pool" and hasattr(obj, "acquire")


def _check_connection(conn: Any, func: str) -> None:
    if is_pool(conn):
        raise TypeError(
            f"dedup.{func}: pass the asyncpg connection of the transaction, not a pool: "
            "each statement on a pool may run on another connection "
            "(async with pool.acquire() as conn, conn.transaction(): ...)"
        )


def _claim_sql(job_id: JobId, fingerprint: Optional[str]) -> str:
    cast = _core.job_cast(job_id)
    if fingerprint is None:
        return f"SELECT dedup.try_claim($1::{cast}, $2::text)"
    return f"SELECT dedup.try_claim($1::{cast}, $2::text, $3::text)"


async def _execute_claim(conn: Any, job_id: JobId, scope: str, fingerprint: Optional[str]) -> bool:
    args = (job_id, scope) if fingerprint is None else (job_id, scope, fingerprint)
    with _core.translated():
        return bool(await conn.fetchval(_claim_sql(job_id, fingerprint), *args))


async def _check_not_aborted(conn: Any) -> None:
    """After a fresh effect, before COMMIT: asyncpg commits an aborted transaction (the
    server answers ROLLBACK) without raising, and keeps no public transaction status. A
    statement fails with 25P02 in an aborted transaction."""
    try:
        await conn.execute("SELECT 1")
    except Exception as e:
        if _core.sqlstate(e) == _core.IN_FAILED_SQL_TRANSACTION:
            raise _core.aborted(
                "dedup.run_once_async", "a nested async with conn.transaction(): block", " (SELECT 1 fails with 25P02)"
            ) from e
        raise


async def claim(conn: Any, job_id: JobId, scope: str = "default", fingerprint: Optional[str] = None) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    _check_connection(conn, "claim")
    if not conn.is_in_transaction():
        raise _core.NotInTransaction(
            _core.NOT_IN_TRANSACTION.format(
                what="asyncpg connection",
                why="no conn.transaction() block: asyncpg runs each statement on its own",
                how="async with conn.transaction(): ...",
            )
        )
    return await _execute_claim(conn, job_id, scope, fingerprint)


async def run_once(
    conn_or_pool: Any,
    job_id: JobId,
    effect: Callable[[Any], Any],
    scope: str = "default",
    retries: int = _core.DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    retries = _core.check_retries(retries)
    pool = conn_or_pool if is_pool(conn_or_pool) else None
    if pool is None and conn_or_pool.is_in_transaction():
        raise _core.InTransaction(_core.IN_TRANSACTION_RUN_ONCE.format(what="asyncpg connection"))

    async def attempt_on(conn: Any) -> bool:
        async with conn.transaction():
            fresh = await _execute_claim(conn, job_id, scope, fingerprint)
            if fresh:
                result = effect(conn)
                if inspect.isawaitable(result):
                    await result
                await _check_not_aborted(conn)
        return fresh

    attempt = 0
    while True:
        try:
            if pool is not None:
                async with pool.acquire() as conn:  # one connection per attempt
                    return await attempt_on(conn)
            return await attempt_on(conn_or_pool)
        except Exception as e:
            if attempt >= retries or not _core.is_retryable(e):
                raise
            if pool is None and conn_or_pool.is_closed():
                raise
        attempt += 1
        await asyncio.sleep(_core.backoff(attempt))


# Leases: on a pool each call takes a connection for one statement; on a connection it must
# not be inside a transaction (but complete may be: it then commits with the caller's write).


async def _own_statement(conn_or_pool: Any, func: str, sql: str, *args: Any) -> Any:
    if not is_pool(conn_or_pool) and conn_or_pool.is_in_transaction():
        raise _core.InTransaction(_core.IN_TRANSACTION_LEASE.format(func=func, what="asyncpg connection"))
    with _core.translated():
        return await conn_or_pool.fetchrow(sql, *args)


async def lease(
    conn_or_pool: Any,
    job_id: JobId,
    scope: str = "default",
    duration: Any = None,
    fingerprint: Optional[str] = None,
) -> Lease:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    scope = _core.check_scope(scope)
    duration = _core.check_duration(duration)
    fingerprint = _core.check_fingerprint(fingerprint)
    # result as text, decoded here: a jsonb codec of the caller's (set_type_codec, a common
    # asyncpg setting) would decode it before us, and a JSON string result twice.
    row = await _own_statement(
        conn_or_pool,
        "lease",
        "SELECT status, lease_id, expires_at, result::text AS result, claimed_at"
        " FROM dedup.lease($1::text, $2::text, $3::interval, $4::text)",
        job,
        scope,
        duration,
        fingerprint,
    )
    result = row["result"]
    return Lease(
        row["status"],
        row["lease_id"],
        row["expires_at"],
        None if result is None else json.loads(result),
        row["claimed_at"],
    )


async def complete(
    conn_or_pool: Any, job_id: JobId, lease_id: Any, result: Any = None, scope: str = "default"
) -> None:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    lease_id = _core.check_lease_id(lease_id)
    scope = _core.check_scope(scope)
    # The JSON text as a text parameter, cast by the server: a jsonb codec of the caller's
    # would encode our JSON text again (a JSON string of it) if the parameter were jsonb.
    sql = "SELECT dedup.complete($1::text, $2::uuid, $3::text::jsonb, $4::text)"
    args = (job, lease_id, None if result is None else json.dumps(result), scope)
    with _core.translated():
        await conn_or_pool.execute(sql, *args)  # in the caller's transaction, if any


async def extend_lease(
    conn_or_pool: Any, job_id: JobId, lease_id: Any, duration: Any = None, scope: str = "default"
) -> Any:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    lease_id = _core.check_lease_id(lease_id)
    duration = _core.check_duration(duration)
    scope = _core.check_scope(scope)
    row = await _own_statement(
        conn_or_pool,
        "extend_lease",
        "SELECT dedup.extend_lease($1::text, $2::uuid, $3::interval, $4::text)",
        job,
        lease_id,
        duration,
        scope,
    )
    return row[0]


async def release_lease(conn_or_pool: Any, job_id: JobId, lease_id: Any, scope: str = "default") -> None:
    job = _core.lease_job_text(_core.check_job_id(job_id))
    lease_id = _core.check_lease_id(lease_id)
    scope = _core.check_scope(scope)
    await _own_statement(
        conn_or_pool,
        "release_lease",
        "SELECT dedup.release_lease($1::text, $2::uuid, $3::text)",
        job,
        lease_id,
        scope,
    )
