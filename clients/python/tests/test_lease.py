"""Leases for external effects: lease / complete / extend_lease / release_lease."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import asyncpg
import pytest

import dedup
from conftest import PGHOST, PGPORT


def test_lease_flow(conn, job):
    lease = dedup.lease(conn, job, scope="payments", duration=30)
    assert lease.acquired and lease.lease_id is not None and lease.expires_at is not None
    again = dedup.lease(conn, job, scope="payments")
    assert again.busy and again.lease_id is None  # held: leave the message unacknowledged
    expiry = dedup.extend_lease(conn, job, lease.lease_id, timedelta(minutes=2), scope="payments")
    assert expiry > lease.expires_at
    dedup.complete(conn, job, lease.lease_id, {"charge": "ch_1"}, scope="payments")
    done = dedup.lease(conn, job, scope="payments")
    assert done.done and done.result == {"charge": "ch_1"}
    # A second complete with the same lease is a no-op; a lease no longer held is YD002.
    dedup.complete(conn, job, lease.lease_id, {"charge": "other"}, scope="payments")
    with pytest.raises(dedup.LeaseNotHeld, match="is not held") as info:
        dedup.extend_lease(conn, job, lease.lease_id, 10, scope="payments")
    assert dedup.sqlstate(info.value.__cause__) == "YD002"


def test_release_and_take_over(conn, job):
    first = dedup.lease(conn, job)
    dedup.release_lease(conn, job, first.lease_id)
    second = dedup.lease(conn, job, duration=timedelta(seconds=1))
    assert second.acquired and second.lease_id != first.lease_id
    with pytest.raises(dedup.LeaseNotHeld):
        dedup.complete(conn, job, first.lease_id)
    time.sleep(1.1)  # expired: the next caller takes the job over
    third = dedup.lease(conn, job)
    assert third.acquired
    with pytest.raises(dedup.LeaseNotHeld, match="another lease_id"):
        dedup.complete(conn, job, second.lease_id, {"late": True})
    dedup.complete(conn, job, third.lease_id)
    assert dedup.lease(conn, job).done


def test_lease_transaction_rules(conn, job):
    with conn.transaction():
        with pytest.raises(dedup.InTransaction, match="short transaction of its own"):
            dedup.lease(conn, job)
    lease = dedup.lease(conn, job)
    with conn.transaction():
        with pytest.raises(dedup.InTransaction):
            dedup.extend_lease(conn, job, lease.lease_id)
        with pytest.raises(dedup.InTransaction):
            dedup.release_lease(conn, job, lease.lease_id)
    # complete may join the transaction of a database write that goes with the effect:
    # rolled back, the lease is still held; committed, the job is done.
    with pytest.raises(RuntimeError):
        with conn.transaction():
            conn.execute("INSERT INTO receipts (job_id) VALUES (%s)", (job,))
            dedup.complete(conn, job, lease.lease_id, {"n": 1})
            raise RuntimeError("rolled back")
    assert dedup.lease(conn, job).busy
    with conn.transaction():
        conn.execute("INSERT INTO receipts (job_id) VALUES (%s)", (job,))
        dedup.complete(conn, job, lease.lease_id, {"n": 2})
    assert dedup.lease(conn, job).result == {"n": 2}


def test_lease_bad_input_and_one_api_per_scope(conn, job):
    with pytest.raises(dedup.InvalidArgument, match="duration must be positive"):
        dedup.lease(conn, job, duration=0)
    with pytest.raises(TypeError, match="duration must be timedelta"):
        dedup.lease(conn, job, duration="30s")
    with pytest.raises(dedup.InvalidArgument, match="lease_id must not be None"):
        dedup.complete(conn, job, None)
    with pytest.raises(dedup.InvalidArgument, match="not a UUID"):
        dedup.complete(conn, job, "nope")
    with pytest.raises(dedup.InvalidArgument, match="must not be empty"):
        dedup.lease(conn, "")
    # A job claimed with try_claim is done for lease (42 and '42' are one job).
    with conn.transaction():
        assert dedup.claim(conn, 4242)
    assert dedup.lease(conn, 4242).done


def test_asyncpg_leases(dbname, job):
    async def main():
        pool = await asyncpg.create_pool(host=PGHOST, port=PGPORT, user="postgres", database=dbname, min_size=1, max_size=2)
        try:
            lease = await dedup.lease_async(pool, job, duration=30)
            assert lease.acquired
            assert (await dedup.lease_async(pool, job)).busy
            await dedup.extend_lease_async(pool, job, lease.lease_id, 60)
            await dedup.complete_async(pool, job, lease.lease_id, {"ok": [1, 2]})
            done = await dedup.lease_async(pool, job)
            assert done.done and done.result == {"ok": [1, 2]}
            with pytest.raises(dedup.LeaseNotHeld):
                await dedup.release_lease_async(pool, job, lease.lease_id)
            async with pool.acquire() as c, c.transaction():
                with pytest.raises(dedup.InTransaction):
                    await dedup.lease_async(c, job + "-t")
            with pytest.raises(TypeError, match="asyncpg"):
                await dedup.lease_async(object(), job)
        finally:
            await pool.close()

    asyncio.run(main())


def test_lease_on_a_connection_without_autocommit(dbname, job):
    import psycopg

    from conftest import dsn

    with psycopg.connect(dsn(dbname)) as c:  # autocommit=False
        lease = dedup.lease(c, job)  # its own transaction, committed at once
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        dedup.complete(c, job, lease.lease_id, {"ok": True})  # idle: its own transaction too
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(dsn(dbname), autocommit=True) as other:
        assert dedup.lease(other, job).done


def test_complete_joins_only_a_transaction_the_caller_opened(dbname, job):
    """On a connection without autocommit psycopg opens a transaction at the first
    statement: complete must not slip into one the caller may not know is open (it would
    commit only at a conn.commit() that may never come, and the caller would acknowledge a
    job whose completion then rolls back). Inside conn.transaction() it joins."""
    import psycopg

    from conftest import dsn

    with psycopg.connect(dsn(dbname)) as c:  # autocommit=False
        lease = dedup.lease(c, job, duration=60)
        c.execute("SELECT 1")  # psycopg sent BEGIN: an implicit transaction
        with pytest.raises(dedup.InTransaction, match="implicit transaction"):
            dedup.complete(c, job, lease.lease_id, {"n": 0})
        c.rollback()
        # An explicit block on this connection: complete joins it, and rolls back with it ...
        with pytest.raises(RuntimeError):
            with c.transaction():
                c.execute("INSERT INTO receipts (job_id) VALUES (%s)", (job,))
                dedup.complete(c, job, lease.lease_id, {"n": 1})
                raise RuntimeError("rolled back")
        assert dedup.lease(c, job).busy
        # ... or commits with the write at its end.
        with c.transaction():
            c.execute("INSERT INTO receipts (job_id) VALUES (%s)", (job,))
            dedup.complete(c, job, lease.lease_id, {"n": 2})
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(dsn(dbname), autocommit=True) as other:
        done = dedup.lease(other, job)
        assert done.done and done.result == {"n": 2}


def test_asyncpg_leases_with_a_json_codec(dbname, job):
    """A connection whose jsonb codec encodes and decodes JSON itself (a common asyncpg
    setting): the result must be stored once-encoded and read back once-decoded."""
    import json

    import psycopg

    from conftest import dsn

    async def main():
        c = await asyncpg.connect(host=PGHOST, port=PGPORT, user="postgres", database=dbname)
        try:
            await c.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
            results = {"-obj": {"ok": [1, 2]}, "-str": "ch_1", "-num": "42"}
            for suffix, result in results.items():
                lease = await dedup.lease_async(c, job + suffix)
                assert lease.acquired
                await dedup.complete_async(c, job + suffix, lease.lease_id, result)
                done = await dedup.lease_async(c, job + suffix)
                assert done.done and done.result == result
            # A result stored by another client (psycopg, below) is decoded once too.
            return results, (await dedup.lease_async(c, job + "-by-psycopg")).result
        finally:
            await c.close()

    with psycopg.connect(dsn(dbname), autocommit=True) as other:
        lease = dedup.lease(other, job + "-by-psycopg")
        dedup.complete(other, job + "-by-psycopg", lease.lease_id, "ch_2")
    results, by_psycopg = asyncio.run(main())
    assert by_psycopg == "ch_2"
    with psycopg.connect(dsn(dbname), autocommit=True) as other:  # stored as JSON once
        for suffix, result in results.items():
            assert dedup.lease(other, job + suffix).result == result
