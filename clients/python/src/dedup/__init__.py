"""Client of the PostgreSQL extension dedup: exactly-once effects over at-least-once delivery.

Claim a job in the transaction of its effect; the claim and the effect commit together or
not at all, so a redelivered copy finds the claim and skips::

    import dedup

    with conn.transaction():                      # psycopg 3
        if dedup.claim(conn, job_id):
            conn.execute("INSERT INTO receipts ...")

    ran = dedup.run_once(conn, job_id, lambda conn: conn.execute("INSERT ..."))

``claim`` and ``run_once`` take a psycopg 3 ``Connection`` or a SQLAlchemy ``Session`` /
``Connection`` (``run_once`` also an ``Engine`` or ``sessionmaker``); ``claim_async`` and
``run_once_async`` an asyncpg ``Connection`` (``run_once_async`` also a ``Pool``) or a
psycopg ``AsyncConnection``. Celery: :mod:`dedup.celery`; Django: :mod:`dedup.django`;
leases for effects outside the database: ``lease``, ``complete``, ``extend_lease``,
``release_lease`` (and their ``_async`` forms). No driver is a dependency: each is imported
when first used.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional

from ._core import (
    DEFAULT_RETRIES,
    RETRYABLE,
    DedupError,
    FingerprintMismatch,
    InTransaction,
    InvalidArgument,
    JobId,
    Lease,
    LeaseNotHeld,
    NotInTransaction,
    TransactionAborted,
    backoff,
    is_retryable,
    sqlstate,
)

__version__ = "0.7.0"

__all__ = [
    "DEFAULT_RETRIES",
    "RETRYABLE",
    "DedupError",
    "FingerprintMismatch",
    "InTransaction",
    "InvalidArgument",
    "JobId",
    "Lease",
    "LeaseNotHeld",
    "NotInTransaction",
    "TransactionAborted",
    "backoff",
    "claim",
    "claim_async",
    "complete",
    "complete_async",
    "extend_lease",
    "extend_lease_async",
    "is_retryable",
    "lease",
    "lease_async",
    "release_lease",
    "release_lease_async",
    "run_once",
    "run_once_async",
    "sqlstate",
    "__version__",
]


def _driver(obj: Any) -> str:
    """Which driver an object belongs to, by its class's module (nothing is imported)."""
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if root in ("psycopg", "asyncpg", "sqlalchemy"):
            return root
    if type(obj).__module__.split(".", 1)[0] == "psycopg_pool":
        raise TypeError(
            "dedup: pass a connection from the psycopg pool (with pool.connection() as conn: ...), "
            "not the pool"
        )
    raise TypeError(
        f"dedup: unsupported connection type {type(obj).__module__}.{type(obj).__qualname__}: "
        "expected a psycopg 3 connection, an asyncpg connection or pool, or a SQLAlchemy "
        "Session, Connection, Engine or sessionmaker (Django: dedup.django)"
    )


def _is_async_psycopg(obj: Any) -> bool:
    return any(c.__name__ == "AsyncConnection" for c in type(obj).__mro__)


def _sync(obj: Any, func: str) -> str:
    driver = _driver(obj)
    if driver == "asyncpg" or (driver == "psycopg" and _is_async_psycopg(obj)):
        raise TypeError(f"dedup.{func}: this is an async connection: use await dedup.{func}_async(...)")
    return driver


def _async(obj: Any, func: str) -> str:
    driver = _driver(obj)
    if driver == "sqlalchemy" or (driver == "psycopg" and not _is_async_psycopg(obj)):
        raise TypeError(f"dedup.{func}_async: this is a sync connection: use dedup.{func}(...)")
    return driver


def claim(conn: Any, job_id: JobId, scope: str = "default", fingerprint: Optional[str] = None) -> bool:
    """Claim ``job_id`` in ``scope`` in the connection's current transaction.

    True: this transaction now holds the claim, do the effect in it. False: the job was done
    before (or claimed earlier in this transaction): skip it, and acknowledge the message
    after COMMIT. Raises :class:`NotInTransaction` (before sending anything) when the
    connection would commit the claim on its own, ``InvalidArgument``/``TypeError`` for a
    job id or scope the server would refuse, :class:`FingerprintMismatch` for ``YD001``;
    other server errors are the driver's own.
    """
    if _sync(conn, "claim") == "psycopg":
        from . import _psycopg

        return _psycopg.claim(conn, job_id, scope, fingerprint)
    from . import _sqlalchemy

    return _sqlalchemy.claim(conn, job_id, scope, fingerprint)


async def claim_async(
    conn: Any, job_id: JobId, scope: str = "default", fingerprint: Optional[str] = None
) -> bool:
    """:func:`claim` for an asyncpg connection or a psycopg ``AsyncConnection``."""
    if _async(conn, "claim") == "asyncpg":
        from . import _asyncpg

        return await _asyncpg.claim(conn, job_id, scope, fingerprint)
    from . import _psycopg

    return await _psycopg.claim_async(conn, job_id, scope, fingerprint)


def run_once(
    conn: Any,
    job_id: JobId,
    effect: Callable[[Any], Any],
    scope: str = "default",
    retries: int = DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    """Run ``effect`` once per job: begin a transaction, claim, call ``effect(handle)`` only
    when the claim is fresh, commit. On 40001 or 40P01 (also from COMMIT) the whole
    transaction is rolled back and run again, up to ``retries`` more times with a jittered
    backoff; any other error is re-raised after the rollback.

    Returns True when it ran the effect and committed, False for a duplicate (committed,
    nothing done). Either way the message can be acknowledged; after an exception it must
    not be. An effect that catches a database error and goes on leaves the transaction
    aborted, which would "commit" as a ROLLBACK without an error: run_once raises
    :class:`TransactionAborted` (rolled back, not retried) instead. ``handle`` is the psycopg connection, or the SQLAlchemy Session (from a Session
    or sessionmaker) or Connection (from a Connection or Engine) of the transaction; do the
    effect's writes through it. The connection must not be in a transaction already
    (:class:`InTransaction`).
    """
    if _sync(conn, "run_once") == "psycopg":
        from . import _psycopg

        return _psycopg.run_once(conn, job_id, effect, scope, retries, fingerprint)
    from . import _sqlalchemy

    return _sqlalchemy.run_once(conn, job_id, effect, scope, retries, fingerprint)


async def run_once_async(
    conn_or_pool: Any,
    job_id: JobId,
    effect: Callable[[Any], Any],
    scope: str = "default",
    retries: int = DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    """:func:`run_once` for an asyncpg connection or pool (a pool gives each attempt a
    connection of its own) or a psycopg ``AsyncConnection``. ``effect`` may be a coroutine
    function."""
    if _async(conn_or_pool, "run_once") == "asyncpg":
        from . import _asyncpg

        return await _asyncpg.run_once(conn_or_pool, job_id, effect, scope, retries, fingerprint)
    from . import _psycopg

    return await _psycopg.run_once_async(conn_or_pool, job_id, effect, scope, retries, fingerprint)


def lease(
    conn: Any,
    job_id: JobId,
    scope: str = "default",
    duration: Any = None,
    fingerprint: Optional[str] = None,
) -> Lease:
    """``dedup.lease`` in a transaction of its own, committed at once (psycopg 3). Take the
    job before an external effect; ``duration`` is a ``timedelta`` or seconds (None: the
    server's ``dedup.lease_duration``). Raises :class:`InTransaction` inside a transaction."""
    if _sync(conn, "lease") != "psycopg":
        raise TypeError("dedup.lease: pass a psycopg 3 connection (asyncpg: lease_async)")
    from . import _psycopg

    return _psycopg.lease(conn, job_id, scope, duration, fingerprint)


def complete(conn: Any, job_id: JobId, lease_id: Any, result: Any = None, scope: str = "default") -> None:
    """``dedup.complete`` after the external effect: in the caller's transaction when the
    caller opened one (with a database write that goes with the effect): a ``with
    conn.transaction():`` block, or any transaction of an autocommit connection; on an idle
    connection in a transaction of its own, committed at once. A connection without
    autocommit in the implicit transaction psycopg began at an earlier statement raises
    :class:`InTransaction` (commit or roll back first): complete would not commit before
    your ``conn.commit()``. ``result`` is stored as jsonb. Raises :class:`LeaseNotHeld`
    (``YD002``): do not acknowledge then."""
    if _sync(conn, "complete") != "psycopg":
        raise TypeError("dedup.complete: pass a psycopg 3 connection (asyncpg: complete_async)")
    from . import _psycopg

    _psycopg.complete(conn, job_id, lease_id, result, scope)


def extend_lease(conn: Any, job_id: JobId, lease_id: Any, duration: Any = None, scope: str = "default") -> Any:
    """``dedup.extend_lease`` (a heartbeat) in a transaction of its own; returns the new
    expiry. Raises :class:`LeaseNotHeld` when the lease was lost."""
    if _sync(conn, "extend_lease") != "psycopg":
        raise TypeError("dedup.extend_lease: pass a psycopg 3 connection (asyncpg: extend_lease_async)")
    from . import _psycopg

    return _psycopg.extend_lease(conn, job_id, lease_id, duration, scope)


def release_lease(conn: Any, job_id: JobId, lease_id: Any, scope: str = "default") -> None:
    """``dedup.release_lease`` after a failed effect, in a transaction of its own, so the
    redelivered copy need not wait for the lease to expire."""
    if _sync(conn, "release_lease") != "psycopg":
        raise TypeError("dedup.release_lease: pass a psycopg 3 connection (asyncpg: release_lease_async)")
    from . import _psycopg

    _psycopg.release_lease(conn, job_id, lease_id, scope)


def _asyncpg_only(conn: Any, func: str) -> Any:
    if _driver(conn) != "asyncpg":
        raise TypeError(f"dedup.{func}_async: pass an asyncpg connection or pool (psycopg: dedup.{func})")
    from . import _asyncpg

    return _asyncpg


def lease_async(
    conn_or_pool: Any,
    job_id: JobId,
    scope: str = "default",
    duration: Any = None,
    fingerprint: Optional[str] = None,
) -> Awaitable[Lease]:
    """:func:`lease` for an asyncpg connection (not in a transaction) or pool."""
    return _asyncpg_only(conn_or_pool, "lease").lease(conn_or_pool, job_id, scope, duration, fingerprint)  # type: ignore[no-any-return]


def complete_async(
    conn_or_pool: Any, job_id: JobId, lease_id: Any, result: Any = None, scope: str = "default"
) -> Awaitable[None]:
    """:func:`complete` for an asyncpg connection or pool."""
    return _asyncpg_only(conn_or_pool, "complete").complete(conn_or_pool, job_id, lease_id, result, scope)  # type: ignore[no-any-return]


def extend_lease_async(
    conn_or_pool: Any, job_id: JobId, lease_id: Any, duration: Any = None, scope: str = "default"
) -> Awaitable[Any]:
    """:func:`extend_lease` for an asyncpg connection (not in a transaction) or pool."""
    return _asyncpg_only(conn_or_pool, "extend_lease").extend_lease(conn_or_pool, job_id, lease_id, duration, scope)  # type: ignore[no-any-return]


def release_lease_async(conn_or_pool: Any, job_id: JobId, lease_id: Any, scope: str = "default") -> Awaitable[None]:
    """:func:`release_lease` for an asyncpg connection (not in a transaction) or pool."""
    return _asyncpg_only(conn_or_pool, "release_lease").release_lease(conn_or_pool, job_id, lease_id, scope)  # type: ignore[no-any-return]
