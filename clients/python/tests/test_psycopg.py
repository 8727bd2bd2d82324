"""claim and run_once on psycopg 3: results, bad input, misuse, retries."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import errors

import dedup
from conftest import claimed, dsn, receipts


def insert(job_id: object, note: str = ""):
    def effect(c: psycopg.Connection) -> None:
        c.execute("INSERT INTO receipts (job_id, note) VALUES (%s, %s)", (str(job_id), note))

    return effect


def test_claim_then_duplicate(conn, job):
    with conn.transaction():
        assert dedup.claim(conn, job) is True
        assert dedup.claim(conn, job) is False  # claimed earlier in this transaction
    with conn.transaction():
        assert dedup.claim(conn, job) is False  # the redelivered copy


def test_rolled_back_claim_is_free_again(conn, job):
    with pytest.raises(RuntimeError):
        with conn.transaction():
            assert dedup.claim(conn, job)
            raise RuntimeError("the effect failed")
    assert not claimed(conn, job)
    with conn.transaction():
        assert dedup.claim(conn, job) is True


def test_int_str_and_uuid_ids(conn):
    n = uuid.uuid4().int % 2**62
    with conn.transaction():
        assert dedup.claim(conn, n) is True
        assert dedup.claim(conn, str(n)) is False  # 42 and '42' are one job
        assert dedup.claim(conn, "0" + str(n)) is True  # '042' another
        u = uuid.uuid4()
        assert dedup.claim(conn, u) is True
        assert dedup.claim(conn, str(u)) is False  # a UUID is the job of its canonical text
    assert dedup.claim.__doc__


def test_scopes_are_separate(conn, job):
    with conn.transaction():
        assert dedup.claim(conn, job, scope="emails") is True
        assert dedup.claim(conn, job, scope="payments") is True
        assert dedup.claim(conn, job, "emails") is False


def test_limits_match_the_server(conn):
    # The longest id and scope the client lets through are accepted by the server...
    with conn.transaction():
        assert dedup.claim(conn, "x" * 1024, scope="s" * 128) is True
        assert dedup.claim(conn, "é" * 512, scope="ü" * 64) is True  # bytes, not characters
    # ... and one byte more is refused by both.
    with pytest.raises(errors.StringDataRightTruncation):
        conn.execute("SELECT dedup.try_claim(repeat('x', 1025))")
    with pytest.raises(dedup.InvalidArgument, match="1025 bytes"):
        with conn.transaction():
            dedup.claim(conn, "x" * 1025)


BAD = [
    (None, dedup.InvalidArgument, "must not be None"),
    ("", dedup.InvalidArgument, "must not be empty"),
    ("x" * 1025, dedup.InvalidArgument, "1025 bytes long, longer than the limit of 1024"),
    ("é" * 513, dedup.InvalidArgument, "1026 bytes long"),
    ("a\x00b", dedup.InvalidArgument, "NUL"),
    ("\ud800", dedup.InvalidArgument, "not valid Unicode"),
    (2**63, dedup.InvalidArgument, "out of range for bigint"),
    (True, TypeError, "not bool"),
    (b"job-1", TypeError, "not bytes"),
    (1.5, TypeError, "not float"),
    (["job-1"], TypeError, "not list"),
]


@pytest.mark.parametrize("job_id, exc, message", BAD)
def test_bad_job_id_is_refused_before_the_server(conn, job_id, exc, message):
    with conn.transaction():
        conn.execute("INSERT INTO receipts (job_id) VALUES ('before-bad-input')")
        with pytest.raises(exc, match=message):
            dedup.claim(conn, job_id)
        # Nothing was sent: the transaction is not aborted and goes on.
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert issubclass(dedup.InvalidArgument, ValueError)


@pytest.mark.parametrize(
    "scope, exc, message",
    [
        (None, dedup.InvalidArgument, "scope must not be None"),
        ("", dedup.InvalidArgument, "scope must not be empty"),
        ("s" * 129, dedup.InvalidArgument, "129 bytes long, longer than the limit of 128"),
        (7, TypeError, "scope must be str"),
    ],
)
def test_bad_scope(conn, job, scope, exc, message):
    with conn.transaction():
        with pytest.raises(exc, match=message):
            dedup.claim(conn, job, scope=scope)
    with pytest.raises(exc, match=message):
        dedup.run_once(conn, job, insert(job), scope=scope)


def test_misuse_outside_a_transaction(conn, job):
    # autocommit=True and no conn.transaction(): the claim would commit on its own.
    with pytest.raises(dedup.NotInTransaction, match="autocommit=True and no conn.transaction"):
        dedup.claim(conn, job)
    assert not claimed(conn, job)  # raised before anything reached the server


def test_a_connection_without_autocommit_claims_in_its_implicit_transaction(dbname, job):
    with psycopg.connect(dsn(dbname)) as c:  # autocommit=False: psycopg sends BEGIN first
        assert dedup.claim(c, job) is True
        insert(job)(c)
        c.rollback()  # claim and effect go together
        assert dedup.claim(c, job) is True
        insert(job)(c)
        c.commit()
        assert dedup.claim(c, job) is False
        assert receipts(c, job) == 1


def test_run_once_fresh_then_duplicate(conn, job):
    assert dedup.run_once(conn, job, insert(job)) is True
    calls = []
    assert dedup.run_once(conn, job, lambda c: calls.append(1)) is False
    assert calls == []
    assert receipts(conn, job) == 1
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_run_once_reraises_other_errors_after_rollback(conn, job):
    attempts = []

    def effect(c):
        attempts.append(1)
        insert(job)(c)
        c.execute("SELECT 1/0")

    with pytest.raises(errors.DivisionByZero):
        dedup.run_once(conn, job, effect)
    assert attempts == [1]  # not retried
    assert not claimed(conn, job) and receipts(conn, job) == 0  # rolled back together
    assert dedup.run_once(conn, job, insert(job)) is True  # the redelivered copy does the job


@pytest.mark.parametrize("code, where", [("40001", "commit"), ("40P01", "commit"), ("40001", "statement")])
def test_run_once_retries_serialization_failures_and_deadlocks(conn, job, code, where):
    attempts = []

    def effect(c):
        attempts.append(1)
        insert(job)(c)
        if len(attempts) <= 2:
            if where == "commit":  # the deferred trigger raises it at COMMIT
                c.execute("SELECT set_config('dedup_test.fail_at_commit', %s, true)", (code,))
            else:
                c.execute(
                    f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{code}'; END $$"
                )

    assert dedup.run_once(conn, job, effect) is True
    assert len(attempts) == 3
    assert receipts(conn, job) == 1 and claimed(conn, job)


def test_run_once_gives_up_after_retries(conn, job):
    attempts = []

    def effect(c):
        attempts.append(1)
        insert(job)(c)
        c.execute("SELECT set_config('dedup_test.fail_at_commit', '40001', true)")

    with pytest.raises(errors.SerializationFailure):
        dedup.run_once(conn, job, effect, retries=2)
    assert len(attempts) == 3
    assert not claimed(conn, job) and receipts(conn, job) == 0


def test_run_once_real_serialization_failure(dbname, job):
    """A copy at REPEATABLE READ whose snapshot predates the first copy's commit gets
    40001 from try_claim (not an injected one); its retry returns False."""
    with psycopg.connect(dsn(dbname), autocommit=True) as a, psycopg.connect(dsn(dbname), autocommit=True) as b:
        a.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        attempts = []

        def effect(c):
            attempts.append(1)

        with a.transaction():
            a.execute("SELECT 1")  # take the snapshot
            assert dedup.run_once(b, job, insert(job)) is True  # another consumer commits
            with pytest.raises(errors.SerializationFailure):
                dedup.claim(a, job)
        assert dedup.run_once(a, job, effect) is False
        assert attempts == []


def test_run_once_needs_its_own_transaction(conn, job):
    with conn.transaction():
        with pytest.raises(dedup.InTransaction, match="already in a transaction"):
            dedup.run_once(conn, job, insert(job))
    assert not claimed(conn, job)


def test_fingerprint(conn, job):
    with conn.transaction():
        assert dedup.claim(conn, job, fingerprint="aa") is True
    with conn.transaction():
        assert dedup.claim(conn, job, fingerprint="aa") is False
    with pytest.raises(dedup.FingerprintMismatch, match="different payload fingerprint") as info:
        with conn.transaction():
            dedup.claim(conn, job, fingerprint="bb")
    assert dedup.sqlstate(info.value.__cause__) == "YD001"


def test_wrong_objects(conn, job):
    with pytest.raises(TypeError, match="unsupported connection type"):
        dedup.claim(object(), job)
    with pytest.raises(TypeError, match="retries must be int"):
        dedup.run_once(conn, job, insert(job), retries="3")



def test_run_once_refuses_to_commit_an_aborted_transaction(conn, job):
    """An effect that catches a database error and carries on leaves the transaction
    aborted: psycopg's COMMIT then ends in ROLLBACK without raising. run_once must raise
    (the message must not be acknowledged), and a later delivery do the job."""

    def swallowing(c):
        insert(job)(c)
        try:
            c.execute("SELECT 1/0")
        except errors.DivisionByZero:
            pass  # the mistake: the transaction is aborted, and the effect goes on

    with pytest.raises(dedup.TransactionAborted, match="aborted"):
        dedup.run_once(conn, job, swallowing)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not claimed(conn, job) and receipts(conn, job) == 0
    assert dedup.run_once(conn, job, insert(job)) is True
    assert receipts(conn, job) == 1
    # An effect that recovers with a savepoint (a nested conn.transaction()) is fine.

    def recovering(c):
        insert(job + "-sp")(c)
        with pytest.raises(errors.DivisionByZero):
            with c.transaction():
                c.execute("SELECT 1/0")

    assert dedup.run_once(conn, job + "-sp", recovering) is True
    assert claimed(conn, job + "-sp") and receipts(conn, job + "-sp") == 1


def test_run_once_refuses_a_coroutine_effect(conn, job):
    """A sync run_once never awaits what an async def effect returns: the claim would
    commit without the effect. It raises TypeError inside the transaction instead."""
    import gc
    import warnings

    async def effect(c):
        insert(job)(c)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match="run_once_async"):
            dedup.run_once(conn, job, effect)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]  # closed, not leaked
    assert not claimed(conn, job) and receipts(conn, job) == 0
