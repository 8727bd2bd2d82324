"""claim and run_once on SQLAlchemy 2 (ORM on psycopg 3): Session, Connection, Engine, sessionmaker."""

from __future__ import annotations

import pytest
from psycopg import errors
from sqlalchemy import String, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

import dedup
from conftest import claimed, receipts, url


class Base(DeclarativeBase):
    pass


class Receipt(Base):
    __tablename__ = "receipts"
    job_id: Mapped[str] = mapped_column(String, primary_key=True)
    note: Mapped[str | None]


@pytest.fixture(scope="module")
def engine(dbname):
    e = create_engine(url(dbname))
    yield e
    e.dispose()


def test_session_claim(engine, job, conn):
    Sessions = sessionmaker(engine)
    with Sessions.begin() as session:
        assert dedup.claim(session, job) is True
        session.add(Receipt(job_id=job))
    with Sessions.begin() as session:
        assert dedup.claim(session, job) is False
    # A Session not yet in a transaction begins one with the claim (autobegin): it commits
    # with the effect at session.commit(), or rolls back with it.
    with Session(engine) as session:
        assert dedup.claim(session, job + "-a") is True
        session.rollback()
    assert not claimed(conn, job + "-a")
    assert receipts(conn, job) == 1


def test_connection_claim_and_autocommit_misuse(engine, job, conn):
    with engine.begin() as c:
        assert dedup.claim(c, job, scope="sa") is True
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        with pytest.raises(dedup.NotInTransaction, match="AUTOCOMMIT"):
            dedup.claim(c, job + "-auto")
    auto = create_engine(engine.url, isolation_level="AUTOCOMMIT")
    with Session(auto) as session, pytest.raises(dedup.NotInTransaction):
        dedup.claim(session, job + "-auto")
    auto.dispose()
    assert not claimed(conn, job + "-auto")
    with pytest.raises(TypeError, match="not an Engine"):
        dedup.claim(engine, job)


def test_bad_input(engine, job):
    with Session(engine) as session, session.begin():
        with pytest.raises(dedup.InvalidArgument, match="1025 bytes"):
            dedup.claim(session, "j" * 1025)
        with pytest.raises(TypeError, match="scope must be str"):
            dedup.claim(session, job, scope=b"x")
        assert session.scalar(text("SELECT 1")) == 1  # not aborted


@pytest.mark.parametrize("kind", ["sessionmaker", "engine", "session", "connection"])
def test_run_once(engine, job, conn, kind):
    attempts = []

    def effect(handle):
        attempts.append(1)
        if isinstance(handle, Session):
            handle.add(Receipt(job_id=job, note=kind))
            handle.flush()
        else:
            handle.execute(text("INSERT INTO receipts (job_id, note) VALUES (:j, :n)"), {"j": job, "n": kind})
        if len(attempts) == 1:  # injected: a serialization failure at COMMIT, once
            handle.execute(text("SELECT set_config('dedup_test.fail_at_commit', '40001', true)"))

    def target():
        return {
            "sessionmaker": lambda: sessionmaker(engine),
            "engine": lambda: engine,
            "session": lambda: Session(engine),
            "connection": lambda: engine.connect(),
        }[kind]()

    t = target()
    try:
        assert dedup.run_once(t, job, effect) is True
        assert dedup.run_once(t, job, effect) is False
    finally:
        if kind in ("session", "connection"):
            t.close()
    assert len(attempts) == 2
    assert receipts(conn, job) == 1


def test_run_once_other_errors_and_misuse(engine, job, conn):
    Sessions = sessionmaker(engine)

    def failing(session):
        session.add(Receipt(job_id=job))
        session.execute(text("SELECT 1/0"))

    with pytest.raises(DBAPIError) as info:
        dedup.run_once(Sessions, job, failing)
    assert isinstance(info.value.orig, errors.DivisionByZero)
    assert not claimed(conn, job) and receipts(conn, job) == 0

    with Sessions.begin() as session:
        with pytest.raises(dedup.InTransaction):
            dedup.run_once(session, job, failing)
    auto = create_engine(engine.url, isolation_level="AUTOCOMMIT")
    with pytest.raises(dedup.NotInTransaction):
        dedup.run_once(auto, job, failing)
    auto.dispose()
    assert not claimed(conn, job)


@pytest.mark.parametrize("kind", ["sessionmaker", "engine", "session", "connection"])
def test_run_once_refuses_to_commit_an_aborted_transaction(engine, job, conn, kind):
    """An effect that swallows a database error leaves the transaction aborted; the
    driver's COMMIT then ends in ROLLBACK without raising. run_once must raise instead of
    returning True, and a later call do the job."""

    def swallowing(handle):
        handle.execute(text("INSERT INTO receipts (job_id) VALUES (:j)"), {"j": job})
        try:
            handle.execute(text("SELECT 1/0"))
        except DBAPIError:
            pass

    def effect(handle):
        handle.execute(text("INSERT INTO receipts (job_id) VALUES (:j)"), {"j": job})

    t = {
        "sessionmaker": lambda: sessionmaker(engine),
        "engine": lambda: engine,
        "session": lambda: Session(engine),
        "connection": lambda: engine.connect(),
    }[kind]()
    try:
        with pytest.raises(dedup.TransactionAborted):
            dedup.run_once(t, job, swallowing)
        assert not claimed(conn, job) and receipts(conn, job) == 0
        assert dedup.run_once(t, job, effect) is True
    finally:
        if kind in ("session", "connection"):
            t.close()
    assert claimed(conn, job) and receipts(conn, job) == 1


def test_run_once_refuses_a_coroutine_effect(engine, job, conn):
    async def effect(session):
        session.add(Receipt(job_id=job))

    with pytest.raises(TypeError, match="coroutine"):
        dedup.run_once(sessionmaker(engine), job, effect)
    assert not claimed(conn, job) and receipts(conn, job) == 0
