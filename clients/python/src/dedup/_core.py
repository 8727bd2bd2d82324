"""What every driver shares: the exceptions, the argument checks, SQLSTATEs and the backoff.

No driver is imported here (nor anywhere at import time of ``dedup``): each integration
imports its driver when first called.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterator, Optional, Union

#: What a job id may be: ``str`` (SQL ``text``), ``int`` (``bigint``) or ``uuid.UUID``.
#: ``42`` and ``"42"`` are one job, as in SQL.
JobId = Union[str, int, uuid.UUID]

MAX_JOB_ID_BYTES = 1024
MAX_SCOPE_BYTES = 128
MAX_FINGERPRINT_BYTES = 256
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1

SERIALIZATION_FAILURE = "40001"
DEADLOCK_DETECTED = "40P01"
#: The SQLSTATEs after which the whole transaction is retried.
RETRYABLE = frozenset({SERIALIZATION_FAILURE, DEADLOCK_DETECTED})

DEFAULT_RETRIES = 5


class DedupError(Exception):
    """Base class of the errors this package raises itself."""


class NotInTransaction(DedupError):
    """A claim was asked for on a connection that is not in a transaction (autocommit).

    The claim would commit on its own, before the effect: if the effect then failed, the
    job would stay claimed and never be done. Raised before anything is sent to the server.
    """


class InTransaction(DedupError):
    """A call that must own its transaction got a connection already inside one.

    ``run_once`` begins, commits and retries the transaction itself, and ``lease``,
    ``extend_lease`` and ``release_lease`` must commit at once; inside a transaction of
    the caller they could do neither. Raised before anything is sent to the server.
    """


class TransactionAborted(DedupError):
    """``run_once``: the effect's transaction was aborted by an error that the effect caught
    and did not re-raise (SQLSTATE ``25P02`` from then on; for Django, an atomic block
    marked for rollback). Its COMMIT would end in ROLLBACK without an error, and the claim
    and the effect would be lost while ``run_once`` reported success. Raised inside the
    transaction, so it rolls back; not retried: do not acknowledge the message. Let the
    effect's errors propagate, or recover from an expected one with a savepoint (a nested
    ``conn.transaction()`` / ``atomic()`` / ``begin_nested()``)."""


class InvalidArgument(DedupError, ValueError):
    """A job id, scope, fingerprint or duration the server would refuse (or misread).

    Checked before anything is sent, so a bad argument does not abort the caller's
    transaction. Wrong types raise :class:`TypeError` instead.
    """


class FingerprintMismatch(DedupError):
    """SQLSTATE ``YD001``: the job was claimed or leased before with another payload
    fingerprint. A producer bug or two jobs sharing an id, not a duplicate. The driver's
    error is the ``__cause__``."""

    sqlstate = "YD001"


class LeaseNotHeld(DedupError):
    """SQLSTATE ``YD002``: ``complete``, ``extend_lease`` or ``release_lease`` of a lease
    this caller no longer holds (it expired and another consumer took the job over, or it
    was released). Do not acknowledge the message. The driver's error is the
    ``__cause__``."""

    sqlstate = "YD002"


@dataclass(frozen=True)
class Lease:
    """The row ``dedup.lease`` returns. ``status`` is ``'acquired'``, ``'done'`` or
    ``'busy'``; the other fields are set as the SQL reference says for each status."""

    status: str
    lease_id: Optional[uuid.UUID]
    expires_at: Optional[datetime]
    result: Any
    claimed_at: Optional[datetime]

    @property
    def acquired(self) -> bool:
        """You hold the job: do the effect, then ``complete``."""
        return self.status == "acquired"

    @property
    def done(self) -> bool:
        """The job was done before: acknowledge the message (``result`` holds its result)."""
        return self.status == "done"

    @property
    def busy(self) -> bool:
        """Another consumer holds the job: leave the message unacknowledged."""
        return self.status == "busy"


def _byte_length(value: str, what: str) -> int:
    if "\x00" in value:
        raise InvalidArgument(f"dedup: {what} must not contain NUL characters (PostgreSQL text cannot)")
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"dedup: {what} is not valid Unicode text: {e}") from None


def check_job_id(job_id: object) -> JobId:
    """Return ``job_id`` if the server would accept it, else raise ``InvalidArgument``
    (a ``ValueError``) or ``TypeError`` with the reason."""
    if job_id is None:
        raise InvalidArgument(
            "dedup: job_id must not be None: a job without an id cannot be deduplicated; "
            "pass the message's unique id"
        )
    if isinstance(job_id, bool):
        raise TypeError("dedup: job_id must be str, int or uuid.UUID, not bool")
    if isinstance(job_id, int):
        if not BIGINT_MIN <= job_id <= BIGINT_MAX:
            raise InvalidArgument(
                f"dedup: job_id {job_id} is out of range for bigint; pass it as a str instead"
            )
        return job_id
    if isinstance(job_id, uuid.UUID):
        return job_id
    if isinstance(job_id, str):
        if not job_id:
            raise InvalidArgument("dedup: job_id must not be empty")
        n = _byte_length(job_id, "job_id")
        if n > MAX_JOB_ID_BYTES:
            raise InvalidArgument(
                f"dedup: job_id is {n} bytes long, longer than the limit of {MAX_JOB_ID_BYTES} "
                "bytes; claim a digest of a long key instead, e.g. "
                "hashlib.sha256(key.encode()).hexdigest(), which is 64 bytes"
            )
        return job_id
    raise TypeError(f"dedup: job_id must be str, int or uuid.UUID, not {type(job_id).__name__}")


def check_scope(scope: object) -> str:
    if scope is None:
        raise InvalidArgument("dedup: scope must not be None; leave it out to use 'default'")
    if not isinstance(scope, str):
        raise TypeError(f"dedup: scope must be str, not {type(scope).__name__}")
    if not scope:
        raise InvalidArgument("dedup: scope must not be empty")
    n = _byte_length(scope, "scope")
    if n > MAX_SCOPE_BYTES:
        raise InvalidArgument(
            f"dedup: scope is {n} bytes long, longer than the limit of {MAX_SCOPE_BYTES} bytes; "
            "use a shorter name, e.g. the queue or handler name"
        )
    return scope


def check_fingerprint(fingerprint: object) -> Optional[str]:
    if fingerprint is None:
        return None
    if not isinstance(fingerprint, str):
        raise TypeError(f"dedup: fingerprint must be str or None, not {type(fingerprint).__name__}")
    if not fingerprint:
        raise InvalidArgument("dedup: fingerprint must not be empty (pass None for none)")
    n = _byte_length(fingerprint, "fingerprint")
    if n > MAX_FINGERPRINT_BYTES:
        raise InvalidArgument(
            f"dedup: fingerprint is {n} bytes long, longer than the limit of "
            f"{MAX_FINGERPRINT_BYTES} bytes; pass a hash of the payload, e.g. its sha256 hex"
        )
    return fingerprint


def check_claim(
    job_id: object, scope: object, fingerprint: object
) -> tuple[JobId, str, Optional[str]]:
    """A claim's arguments, checked in the order the server checks them."""
    return check_job_id(job_id), check_scope(scope), check_fingerprint(fingerprint)


def check_retries(retries: object) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise TypeError(f"dedup: retries must be int, not {type(retries).__name__}")
    if retries < 0:
        raise InvalidArgument("dedup: retries must not be negative")
    return retries


def check_duration(duration: object) -> Optional[timedelta]:
    """A lease duration: ``timedelta``, seconds as ``int``/``float``, or None (the
    server's ``dedup.lease_duration``)."""
    if duration is None:
        return None
    if isinstance(duration, bool):
        raise TypeError("dedup: duration must be timedelta or seconds, not bool")
    if isinstance(duration, (int, float)):
        duration = timedelta(seconds=duration)
    if not isinstance(duration, timedelta):
        raise TypeError(f"dedup: duration must be timedelta or seconds, not {type(duration).__name__}")
    if duration <= timedelta(0):
        raise InvalidArgument("dedup: duration must be positive, e.g. timedelta(seconds=30)")
    return duration


def check_lease_id(lease_id: object) -> uuid.UUID:
    if lease_id is None:
        raise InvalidArgument("dedup: lease_id must not be None: pass the lease_id of an 'acquired' lease")
    if isinstance(lease_id, str):
        try:
            return uuid.UUID(lease_id)
        except ValueError:
            raise InvalidArgument(f"dedup: lease_id {lease_id!r} is not a UUID") from None
    if not isinstance(lease_id, uuid.UUID):
        raise TypeError(f"dedup: lease_id must be uuid.UUID, not {type(lease_id).__name__}")
    return lease_id


def lease_job_text(job_id: JobId) -> str:
    """The lease functions take text: an int is its decimal text and a UUID its canonical
    text, the job ``try_claim`` would make of them."""
    return str(job_id)


def job_cast(job_id: JobId) -> str:
    """The SQL type to cast the parameter to, picking the ``try_claim`` overload."""
    if isinstance(job_id, int):
        return "bigint"
    if isinstance(job_id, uuid.UUID):
        return "uuid"
    return "text"


def sqlstate(exc: BaseException) -> Optional[str]:
    """The SQLSTATE of a driver error, also when wrapped (SQLAlchemy's ``.orig``, Django's
    and others' ``__cause__``): psycopg and asyncpg call it ``sqlstate``, psycopg2
    ``pgcode``."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for attr in ("sqlstate", "pgcode"):
            code = getattr(e, attr, None)
            if isinstance(code, str) and code:
                return code
        orig = getattr(e, "orig", None)
        e = orig if isinstance(orig, BaseException) else e.__cause__
    return None


def is_retryable(exc: BaseException) -> bool:
    """True for serialization failures (40001) and deadlocks (40P01)."""
    return sqlstate(exc) in RETRYABLE


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...): 20 ms doubling, at
    most 1 s, jittered to 50 to 150 % so that colliding transactions spread out."""
    return min(1.0, 0.01 * 2.0**attempt) * random.uniform(0.5, 1.5)


IN_FAILED_SQL_TRANSACTION = "25P02"

TRANSACTION_ABORTED = (
    "{func}: the effect's transaction is aborted: an error inside it was caught and not "
    "re-raised{how}. Its COMMIT would have ended in ROLLBACK, losing the claim and the effect "
    "while {func} reported success; it was rolled back instead. Do not acknowledge the "
    "message. Let the effect's errors propagate, or recover from an expected one inside a "
    "savepoint ({savepoint})."
)


def aborted(func: str, savepoint: str, how: str) -> TransactionAborted:
    """The :class:`TransactionAborted` that ``func`` raises; ``how`` says how it was seen."""
    return TransactionAborted(TRANSACTION_ABORTED.format(func=func, how=how, savepoint=savepoint))


def call_sync_effect(func: str, effect: Any, *args: Any) -> Any:
    """Call the effect of a sync ``run_once``. One that returns an awaitable (an ``async
    def`` function) did nothing yet, and nothing here could await it: the claim would commit
    without the effect. Close the coroutine (no "never awaited" warning) and raise
    ``TypeError`` inside the transaction, so that it rolls back."""
    result = effect(*args)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise TypeError(
            f"{func}: the effect returned {type(result).__name__} (a coroutine: an async def "
            "function?), which a sync run_once cannot await: the claim would commit without "
            "the effect. Pass a plain function, or use await dedup.run_once_async(...) with an "
            "async connection."
        )
    return result


def translate(exc: BaseException) -> Optional[DedupError]:
    """dedup's own SQLSTATEs as typed errors (the driver's error becomes the cause)."""
    code = sqlstate(exc)
    if code == "YD001":
        return FingerprintMismatch(str(exc))
    if code == "YD002":
        return LeaseNotHeld(str(exc))
    return None


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Around a statement: a server error with a typed error of dedup's ([translate]) is
    raised as that, the driver's error its cause; any other exception as it is."""
    try:
        yield
    except Exception as e:
        mapped = translate(e)
        if mapped is not None:
            raise mapped from e
        raise


NOT_IN_TRANSACTION = (
    "dedup.claim: the {what} is not in a transaction ({why}), so the claim would commit on "
    "its own, before the effect: if the effect failed, the job would stay claimed and never "
    "be done. Claim inside the effect's transaction ({how}), or use dedup.run_once, which "
    "opens it."
)

IN_TRANSACTION_RUN_ONCE = (
    "dedup.run_once: the {what} is already in a transaction; run_once begins, commits and "
    "retries the transaction itself. Pass a connection with no open transaction (or a pool), "
    "or call dedup.claim inside your own transaction."
)

IN_TRANSACTION_LEASE = (
    "dedup.{func}: the {what} is in a transaction; a lease must be taken, extended and "
    "released in a short transaction of its own that commits at once (the row stays locked "
    "until it ends, and a rollback would undo it). Call it outside the transaction, e.g. on "
    "an autocommit connection."
)
