"""Celery: tasks whose database effect happens once per job, whatever the redeliveries.

::

    import dedup.celery

    app = Celery("shop", broker="redis://localhost:6379/0")
    dedup.celery.configure(app, visibility_timeout=300)    # optional: see below

    @dedup.celery.exactly_once(app, dsn="postgresql:///shop", scope="orders")
    def record_order(conn, order_id, amount):
        conn.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order_id, amount))

    record_order.apply_async(args=[42, 10], task_id="order-42")  # a stable id per job

The decorated function gets a psycopg 3 connection in a transaction that has just claimed
the job; it runs only for a fresh claim and its writes commit with the claim. What the
task does (the reasons are in the README):

- ``acks_late=True``: the message is acknowledged after the task returned, that is after
  COMMIT (or after a duplicate was skipped), never before the effect.
- ``reject_on_worker_lost=True``: a pool process that dies mid-task (SIGKILL, OOM) has its
  message requeued instead of acknowledged.
- A hard time limit (``time_limit``) requeues too. billiard kills the pool process in the
  transaction, which the server rolls back; Celery then acknowledges the message unless
  told otherwise, and the job would be lost. The task's request class,
  :class:`ExactlyOnceRequest`, requeues it (Celery 5.3 to 5.6 read no ``acks_on_timeout``,
  and acknowledge by default); ``acks_on_timeout=False``, Celery 5.7's own setting, says
  the same there.
- Any error of the transaction (after its rollback) raises
  ``celery.exceptions.Reject(requeue=True)``: with ``acks_late`` Celery would otherwise
  *acknowledge a task that raised*, and the job would be lost. So does a setup mistake that
  would fail every delivery (a ``job_id=`` function that raises, a ``connect=`` function
  returning a connection in a transaction), with an error logged: failing the task would
  drop every message. Serialization failures and deadlocks are retried in the task first
  (:func:`dedup.run_once`), never with Celery's ``retry``, which publishes a new message
  instead of running the transaction again.
- The worker's prefetch multiplier is forced to 1 (a warning says so when it was not), so
  a worker holds no more unacknowledged messages than it runs.
- For Redis, kombu's restore sweep is made to run every ``restore_interval`` seconds (by
  default a quarter of ``visibility_timeout``, at most 10): kombu's defaults sweep only every
  10 s x 10 = 100 s, whatever ``visibility_timeout`` says.

The job id is the Celery task id, which redeliveries of one message keep; a producer that
may publish a job twice must give both the same ``task_id`` (or pass ``job_id=``, a
function of the task's arguments).
"""

from __future__ import annotations

import inspect
import logging
import os
import random
import threading
import time
from typing import Any, Callable, NoReturn, Optional, Tuple, Type

from . import _core
from ._core import JobId
from ._psycopg import run_once

logger = logging.getLogger("dedup.celery")

#: kombu's Redis defaults (kombu/transport/redis.py, ``Channel``): ``visibility_timeout``
#: 3600 s, ``unacked_restore_interval`` 10 s, ``unacked_restore_throttle`` 10.
KOMBU_VISIBILITY_TIMEOUT = 3600


def restore_interval_for(visibility_timeout: float) -> int:
    """A quarter of the visibility timeout, 1 to 10 s."""
    return int(max(1, min(10, visibility_timeout // 4)))


def configure(app: Any, *, visibility_timeout: Optional[float] = None, restore_interval: Optional[float] = None) -> None:
    """Set the app's options that ``exactly_once`` tasks need (also done by ``exactly_once``
    itself, without overriding what you set):

    - ``worker_prefetch_multiplier = 1``;
    - ``broker_transport_options``: ``visibility_timeout`` if given (seconds after which
      kombu's Redis transport gives an unacknowledged message of a dead worker to another;
      make it longer than your longest task, or a slow task's message is delivered again
      while it runs: harmless, the copy waits for the claim and skips, but wasted), and
      ``unacked_restore_interval`` / ``unacked_restore_throttle = 1`` so that the sweep
      that returns such messages runs every ``restore_interval`` seconds.

    Explicit arguments replace values set before; without them, values you set stay.
    """
    conf = app.conf
    if conf.worker_prefetch_multiplier != 1:
        conf.worker_prefetch_multiplier = 1
    options = dict(conf.broker_transport_options or {})
    if visibility_timeout is not None:
        if visibility_timeout <= 0:
            raise _core.InvalidArgument("dedup.celery.configure: visibility_timeout must be positive")
        options["visibility_timeout"] = visibility_timeout
    vt = options.get("visibility_timeout", KOMBU_VISIBILITY_TIMEOUT)
    if restore_interval is not None:
        if restore_interval <= 0:
            raise _core.InvalidArgument("dedup.celery.configure: restore_interval must be positive")
        options["unacked_restore_interval"] = restore_interval
    else:
        options.setdefault("unacked_restore_interval", restore_interval_for(vt))
    if restore_interval is not None or visibility_timeout is not None:
        options["unacked_restore_throttle"] = 1
    else:
        options.setdefault("unacked_restore_throttle", 1)
    conf.broker_transport_options = options


_request_class: Any = None


def __getattr__(name: str) -> Any:
    """``ExactlyOnceRequest``, made when first asked for (by a worker, through the task's
    ``Request = "dedup.celery:ExactlyOnceRequest"``): ``import dedup.celery`` imports no
    Celery."""
    global _request_class
    if name != "ExactlyOnceRequest":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _request_class is None:
        from billiard.einfo import ExceptionWithTraceback
        from celery.exceptions import TimeLimitExceeded
        from celery.worker.request import Request

        def is_time_limit(exc_info: Any) -> bool:
            exc = getattr(exc_info, "exception", None)
            if isinstance(exc, ExceptionWithTraceback):
                exc = exc.exc
            return isinstance(exc, TimeLimitExceeded)

        class ExactlyOnceRequest(Request):  # type: ignore[misc, valid-type]
            """The request of an ``exactly_once`` task: a task killed by its hard time limit
            has its message requeued, never acknowledged. billiard reports the kill to both
            handlers below (``on_failure`` with ``TimeLimitExceeded``, then ``on_timeout``);
            the first to run rejects with requeue, and Celery's own handling after it
            (its ``acks_on_timeout``, or before 5.7 ``acks_on_failure_or_timeout``) finds
            the message dealt with. Everything else is Celery's."""

            def on_timeout(self, soft: bool, timeout: float) -> None:
                if not soft and self.task.acks_late:
                    self.reject(requeue=True)
                super().on_timeout(soft, timeout)

            def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
                if self.task.acks_late and is_time_limit(exc_info):
                    self.reject(requeue=True)
                return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

        ExactlyOnceRequest.__module__ = __name__
        ExactlyOnceRequest.__qualname__ = "ExactlyOnceRequest"
        _request_class = ExactlyOnceRequest
    return _request_class


_enforced: "set[int]" = set()
_enforced_lock = threading.Lock()


def _enforce(app: Any) -> None:
    """Once per app: configure it when its configuration is read, and force a prefetch
    multiplier of 1 on its workers (also one given with --prefetch-multiplier)."""
    with _enforced_lock:
        if id(app) in _enforced:
            return
        _enforced.add(id(app))
    from celery import signals

    def on_worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        if getattr(sender, "prefetch_multiplier", 1) != 1:
            logger.warning(
                "dedup.celery: worker prefetch multiplier %s set to 1 for exactly_once tasks",
                sender.prefetch_multiplier,
            )
            sender.prefetch_multiplier = 1

    signals.worker_init.connect(on_worker_init, weak=False)
    # Each time the configuration is (re)loaded, and now if it has been already.
    app.on_after_configure.connect(lambda sender, **_: configure(sender), weak=False)
    if app.configured:
        configure(app)


class _Connections:
    """One psycopg connection per process and thread, opened lazily (so a prefork child
    never uses its parent's) and again after it broke."""

    def __init__(self, dsn: Optional[str], connect: Optional[Callable[[], Any]]) -> None:
        self.dsn = dsn
        self.connect = connect
        self.local = threading.local()

    def get(self) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is not None and (getattr(self.local, "pid", None) != os.getpid() or conn.closed or conn.broken):
            self.local.conn = conn = None
        if conn is None:
            if self.connect is not None:
                conn = self.connect()
                from psycopg.pq import TransactionStatus

                if conn.info.transaction_status != TransactionStatus.IDLE:
                    _close(conn)
                    raise _core.InTransaction(
                        "dedup.celery: the connect= function returned a connection in a "
                        f"transaction ({conn.info.transaction_status.name}); run_once must "
                        "begin and commit the claim's transaction itself. Return a new "
                        "connection, with autocommit=True or with nothing run on it yet."
                    )
            else:
                import psycopg

                conn = psycopg.connect(self.dsn or "", autocommit=True)
            self.local.conn, self.local.pid = conn, os.getpid()
        return conn

    def discard_broken(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None and (conn.closed or conn.broken):
            self.local.conn = None

    def discard(self) -> None:
        """Close this thread's connection: the next task opens another."""
        conn = getattr(self.local, "conn", None)
        self.local.conn = None
        if conn is not None:
            _close(conn)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # closing a bad connection: nothing more to do
        pass


def exactly_once(
    app: Any,
    *,
    dsn: Optional[str] = None,
    connect: Optional[Callable[[], Any]] = None,
    scope: str = "default",
    job_id: Optional[Callable[..., JobId]] = None,
    retries: int = _core.DEFAULT_RETRIES,
    requeue_on: Tuple[Type[BaseException], ...] = (Exception,),
    requeue_delay: float = 0.2,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorate ``fn(conn, *args, **kwargs)`` into a Celery task of ``app`` that runs it
    once per job, in the transaction of the job's claim (see the module doc).

    ``dsn`` (a libpq connection string) or ``connect`` (a function returning a psycopg 3
    connection with no open transaction, autocommit or not): the database of the claims
    and the effect. ``scope``: the claims' scope. ``job_id``: a function of the task's
    arguments returning the job id; default: the task id. ``retries``: retries of the
    transaction on 40001/40P01. ``requeue_on``: errors that requeue the message (after the
    rollback, and after about ``requeue_delay`` seconds) instead of failing the task;
    ``FingerprintMismatch`` always fails it, as does a job id the server would refuse: such
    a message can never be done, and Celery acknowledges a failed task. A setup mistake that
    would fail every delivery (a ``job_id`` function that raises, a ``connect`` function
    returning a connection in a transaction) always requeues, with an error logged, and the
    connection is closed: failing the task would drop every message. Other keyword
    arguments go to ``app.task`` (``name``, ``queue``, ...); ``acks_late`` and
    ``reject_on_worker_lost`` cannot be turned off, nor ``acks_on_timeout`` on, and
    ``Request`` is dedup's. ``time_limit`` may be set: a task killed by it requeues.

    The task returns True when it ran the effect, False for a duplicate. ``fn`` must be a
    plain function (an ``async def`` one is refused here: nothing would await it).
    """
    if (dsn is None) == (connect is None):
        raise TypeError("dedup.celery.exactly_once: pass either dsn= or connect=")
    scope = _core.check_scope(scope)
    retries = _core.check_retries(retries)
    for key in ("acks_late", "reject_on_worker_lost"):
        if task_options.get(key, True) is not True:
            raise _core.InvalidArgument(
                f"dedup.celery.exactly_once: {key} must stay True: without it a message is "
                "acknowledged before its effect committed, and lost if the worker dies"
            )
    if task_options.get("acks_on_timeout", False) is not False:
        raise _core.InvalidArgument(
            "dedup.celery.exactly_once: acks_on_timeout must stay False: a task killed by its "
            "hard time limit rolled back, and its message must come back"
        )
    for key in ("bind", "base", "Request"):
        if key in task_options:
            raise TypeError(f"dedup.celery.exactly_once: {key}= is set by dedup")
    connections = _Connections(dsn, connect)

    def decorate(fn: Callable[..., Any]) -> Any:
        from celery.exceptions import Reject

        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"dedup.celery.exactly_once: {getattr(fn, '__qualname__', fn)!r} is an async def "
                "function: the task would get a coroutine it cannot await, and the claim would "
                "commit without the effect. Decorate a plain function."
            )

        def misconfigured(self: Any, jid: Any, what: str, e: BaseException) -> "NoReturn":
            # A mistake that fails every delivery: failing the task would have Celery
            # acknowledge, and drop, every message. Requeued instead, loudly: the messages
            # wait (or go to a worker that is set up right) until it is fixed.
            logger.error(
                "dedup.celery: job %r of %s not done, message requeued: %s: %s: %s. Every "
                "delivery fails the same way until this is fixed; the messages are kept.",
                jid, self.name, what, type(e).__name__, e,
            )
            if requeue_delay > 0:
                time.sleep(requeue_delay * random.uniform(0.5, 1.5))
            raise Reject(repr(e), requeue=True) from e

        def task(self: Any, *args: Any, **kwargs: Any) -> bool:
            try:
                jid = job_id(*args, **kwargs) if job_id is not None else self.request.id
            except Exception as e:
                misconfigured(self, self.request.id, "the job_id= function raised", e)
            # A job id the server would refuse fails the task here (it is acknowledged:
            # no redelivery could ever do it), before any transaction.
            jid = _core.check_job_id(jid)
            try:
                conn = connections.get()
                return run_once(conn, jid, lambda c: fn(c, *args, **kwargs), scope, retries)
            except _core.InTransaction as e:
                # From connect= (a connection in a transaction), or a connection left in
                # one: closed, and the next delivery gets a new one.
                connections.discard()
                misconfigured(self, jid, "the task's connection is in a transaction", e)
            except _core.FingerprintMismatch:
                raise
            except requeue_on as e:
                connections.discard_broken()
                # Not committed (or not known to be): the message must come back. Reject
                # with requeue puts it back on the queue (at its end, for Redis).
                logger.warning(
                    "dedup.celery: job %r of %s not done, message requeued: %s: %s",
                    jid, self.name, type(e).__name__, e,
                )
                if requeue_delay > 0:
                    time.sleep(requeue_delay * random.uniform(0.5, 1.5))
                raise Reject(repr(e), requeue=True) from e

        task.__name__ = getattr(fn, "__name__", "task")
        task.__qualname__ = getattr(fn, "__qualname__", task.__name__)
        task.__module__ = getattr(fn, "__module__", __name__)
        task.__doc__ = getattr(fn, "__doc__", None)
        options = dict(task_options)
        options.setdefault("name", f"{task.__module__}.{task.__qualname__}")
        options.update(
            bind=True,
            acks_late=True,
            reject_on_worker_lost=True,
            acks_on_timeout=False,  # Celery 5.7; ExactlyOnceRequest for any version
            Request="dedup.celery:ExactlyOnceRequest",
            typing=False,
        )
        _enforce(app)
        return app.task(**options)(task)

    return decorate
