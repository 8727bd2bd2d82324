"""SQLAlchemy 2: ``Session``, ``Connection``, and for ``run_once`` also ``Engine`` and
``sessionmaker``."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from . import _core
from ._core import JobId


def _kind(obj: Any) -> str:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.orm import Session, sessionmaker

    if isinstance(obj, Session):
        return "session"
    if isinstance(obj, Connection):
        return "connection"
    if isinstance(obj, Engine):
        return "engine"
    if isinstance(obj, sessionmaker):
        return "sessionmaker"
    raise TypeError(f"dedup: not a SQLAlchemy Session, Connection, Engine or sessionmaker: {type(obj).__name__}")


def _autocommit(conn: Any) -> bool:
    """Whether statements on this Connection commit on their own: the AUTOCOMMIT isolation
    level (of the engine or the connection), seen by the driver's own flag."""
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return True
    dbapi = conn.connection.dbapi_connection
    return bool(getattr(dbapi, "autocommit", False))


def _claim_statement(job_id: JobId, scope: str, fingerprint: Optional[str]) -> Any:
    from sqlalchemy import BigInteger, Text, Uuid, bindparam, func, select

    type_: Any = {"bigint": BigInteger(), "uuid": Uuid(), "text": Text()}[_core.job_cast(job_id)]
    args = [bindparam("job_id", job_id, type_=type_), bindparam("scope", scope, type_=Text())]
    if fingerprint is not None:
        args.append(bindparam("fingerprint", fingerprint, type_=Text()))
    return select(func.dedup.try_claim(*args))


def _execute_claim(target: Any, job_id: JobId, scope: str, fingerprint: Optional[str]) -> bool:
    with _core.translated():
        return bool(target.scalar(_claim_statement(job_id, scope, fingerprint)))


def claim(target: Any, job_id: JobId, scope: str = "default", fingerprint: Optional[str] = None) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    kind = _kind(target)
    if kind in ("engine", "sessionmaker"):
        raise TypeError(
            "dedup.claim: pass the Session or Connection of the effect's transaction, not an "
            f"{'Engine' if kind == 'engine' else 'sessionmaker'}: a claim through another "
            "connection is a second transaction"
        )
    # A Session or Connection that is not in a transaction yet begins one (autobegin) with
    # the claim, which then commits with the effect: that is fine. Under AUTOCOMMIT there is
    # no transaction at all.
    conn = target.connection() if kind == "session" else target
    if _autocommit(conn):
        raise _core.NotInTransaction(
            _core.NOT_IN_TRANSACTION.format(
                what=f"SQLAlchemy {kind}",
                why="isolation_level='AUTOCOMMIT'",
                how="a Session or Connection without AUTOCOMMIT, e.g. with Session.begin() as session: ...",
            )
        )
    return _execute_claim(target, job_id, scope, fingerprint)


def run_once(
    target: Any,
    job_id: JobId,
    effect: Callable[[Any], Any],
    scope: str = "default",
    retries: int = _core.DEFAULT_RETRIES,
    fingerprint: Optional[str] = None,
) -> bool:
    job_id, scope, fingerprint = _core.check_claim(job_id, scope, fingerprint)
    retries = _core.check_retries(retries)
    kind = _kind(target)
    if kind in ("session", "connection") and target.in_transaction():
        raise _core.InTransaction(_core.IN_TRANSACTION_RUN_ONCE.format(what=f"SQLAlchemy {kind}"))

    def begin() -> Any:
        if kind == "engine":
            return target.begin()  # a Connection in a transaction, committed at the end
        if kind == "sessionmaker":
            return target.begin()  # a Session in a transaction, committed at the end
        return _Begun(target)

    attempt = 0
    while True:
        try:
            with begin() as handle:
                conn = handle.connection() if kind in ("session", "sessionmaker") else handle
                if _autocommit(conn):
                    raise _core.NotInTransaction(
                        _core.NOT_IN_TRANSACTION.format(
                            what=f"SQLAlchemy {kind}",
                            why="isolation_level='AUTOCOMMIT'",
                            how="an engine or connection without AUTOCOMMIT",
                        )
                    )
                fresh = _execute_claim(handle, job_id, scope, fingerprint)
                if fresh:
                    _core.call_sync_effect("dedup.run_once", effect, handle)
                    _check_not_aborted(handle, kind)
            return fresh
        except Exception as e:
            if attempt >= retries or not _core.is_retryable(e):
                raise
        attempt += 1
        time.sleep(_core.backoff(attempt))


def _check_not_aborted(handle: Any, kind: str) -> None:
    """After a fresh effect, before COMMIT: the driver commits an aborted transaction (the
    server answers ROLLBACK) without raising. A statement fails with 25P02 in an aborted
    transaction; a Session whose flush failed refuses with PendingRollbackError."""
    from sqlalchemy.exc import PendingRollbackError

    try:
        conn = handle.connection() if kind in ("session", "sessionmaker") else handle
        conn.exec_driver_sql("SELECT 1")
    except Exception as e:
        if isinstance(e, PendingRollbackError) or _core.sqlstate(e) == _core.IN_FAILED_SQL_TRANSACTION:
            raise _core.aborted(
                "dedup.run_once",
                "session.begin_nested() or connection.begin_nested()",
                " (SELECT 1 fails with 25P02)" if _core.sqlstate(e) else " (the Session needs a rollback)",
            ) from e
        raise


class _Begun:
    """``with session.begin():`` / ``with connection.begin():`` yielding the session or
    connection itself (their ``begin()`` yields the transaction object)."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.tx: Any = None

    def __enter__(self) -> Any:
        self.tx = self.target.begin()
        self.tx.__enter__()
        return self.target

    def __exit__(self, *exc: Any) -> Any:
        return self.tx.__exit__(*exc)
