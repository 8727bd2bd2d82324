"""claim_async and run_once_async: asyncpg (connection and pool) and psycopg's AsyncConnection."""

from __future__ import annotations

import asyncio

import asyncpg
import psycopg
import pytest

import dedup
from conftest import PGHOST, PGPORT, claimed, dsn, receipts


def run(coro):
    return asyncio.run(coro)


async def connect(dbname: str) -> asyncpg.Connection:
    return await asyncpg.connect(host=PGHOST, port=PGPORT, user="postgres", database=dbname)


def test_asyncpg_claim(dbname, job, conn):
    async def main():
        c = await connect(dbname)
        try:
            async with c.transaction():
                assert await dedup.claim_async(c, job) is True
                assert await dedup.claim_async(c, job) is False
            async with c.transaction():
                assert await dedup.claim_async(c, job) is False
                assert await dedup.claim_async(c, 7_000_000_000_001) is True  # bigint
            # misuse: asyncpg runs each statement on its own outside conn.transaction()
            with pytest.raises(dedup.NotInTransaction, match="asyncpg connection is not in a transaction"):
                await dedup.claim_async(c, job + "-outside")
            async with c.transaction():
                with pytest.raises(dedup.InvalidArgument, match="must not be empty"):
                    await dedup.claim_async(c, "")
                with pytest.raises(TypeError, match="not float"):
                    await dedup.claim_async(c, 1.0)
                assert await c.fetchval("SELECT 1") == 1  # not aborted
        finally:
            await c.close()

    run(main())
    assert not claimed(conn, job + "-outside")


def test_asyncpg_pool_run_once_and_retry(dbname, job, conn):
    async def main():
        pool = await asyncpg.create_pool(host=PGHOST, port=PGPORT, user="postgres", database=dbname, min_size=1, max_size=2)
        try:
            attempts = []

            async def effect(c):
                attempts.append(1)
                await c.execute("INSERT INTO receipts (job_id) VALUES ($1)", job)
                if len(attempts) == 1:  # a serialization failure at COMMIT, once
                    await c.execute("SELECT set_config('dedup_test.fail_at_commit', '40001', true)")

            assert await dedup.run_once_async(pool, job, effect) is True
            assert len(attempts) == 2
            assert await dedup.run_once_async(pool, job, effect) is False
            assert len(attempts) == 2

            with pytest.raises(TypeError, match="not a pool"):
                await dedup.claim_async(pool, job)

            async def failing(c):
                await c.execute("INSERT INTO receipts (job_id) VALUES ($1)", job + "-x")
                await c.execute("SELECT 1/0")

            with pytest.raises(asyncpg.DivisionByZeroError):
                await dedup.run_once_async(pool, job + "-x", failing)

            async with pool.acquire() as c, c.transaction():
                with pytest.raises(dedup.InTransaction):
                    await dedup.run_once_async(c, job + "-y", effect)
            # a connection (not in a transaction) works too, and a sync effect
            async with pool.acquire() as c:
                assert await dedup.run_once_async(c, job + "-z", lambda c: None) is True
        finally:
            await pool.close()

    run(main())
    assert receipts(conn, job) == 1
    assert not claimed(conn, job + "-x") and receipts(conn, job + "-x") == 0
    assert not claimed(conn, job + "-y")


def test_psycopg_async(dbname, job, conn):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn(dbname), autocommit=True) as c:
            with pytest.raises(dedup.NotInTransaction):
                await dedup.claim_async(c, job)
            with pytest.raises(TypeError, match="use await dedup.claim_async"):
                dedup.claim(c, job)
            async with c.transaction():
                assert await dedup.claim_async(c, job) is True
            attempts = []

            async def effect(c):
                attempts.append(1)
                await c.execute("INSERT INTO receipts (job_id) VALUES (%s)", (job + "-r",))
                if len(attempts) == 1:
                    await c.execute("SELECT set_config('dedup_test.fail_at_commit', '40P01', true)")

            assert await dedup.run_once_async(c, job + "-r", effect) is True
            assert await dedup.run_once_async(c, job + "-r", effect) is False
            assert len(attempts) == 2

    run(main())
    assert claimed(conn, job) and receipts(conn, job + "-r") == 1


def test_sync_and_async_forms_refuse_each_other(dbname, job, conn):
    async def main():
        c = await connect(dbname)
        try:
            with pytest.raises(TypeError, match="use await dedup.run_once_async"):
                dedup.run_once(c, job, lambda c: None)
        finally:
            await c.close()
        with pytest.raises(TypeError, match="sync connection"):
            await dedup.claim_async(conn, job)

    run(main())


def test_run_once_async_refuses_to_commit_an_aborted_transaction(dbname, job, conn):
    """asyncpg's and psycopg's COMMIT of an aborted transaction end in ROLLBACK without
    raising: run_once_async must raise, commit nothing, and a later call do the job."""

    async def main():
        pool = await asyncpg.create_pool(host=PGHOST, port=PGPORT, user="postgres", database=dbname, min_size=1, max_size=1)
        try:
            for target in ("pool", "connection"):
                j = f"{job}-{target}"

                async def swallowing(c, j=j):
                    await c.execute("INSERT INTO receipts (job_id) VALUES ($1)", j)
                    try:
                        await c.execute("SELECT 1/0")
                    except asyncpg.DivisionByZeroError:
                        pass

                async def effect(c, j=j):
                    await c.execute("INSERT INTO receipts (job_id) VALUES ($1)", j)

                if target == "pool":
                    with pytest.raises(dedup.TransactionAborted):
                        await dedup.run_once_async(pool, j, swallowing)
                    assert await dedup.run_once_async(pool, j, effect) is True
                else:
                    async with pool.acquire() as c:
                        with pytest.raises(dedup.TransactionAborted):
                            await dedup.run_once_async(c, j, swallowing)
                        assert not c.is_in_transaction()
                        assert await dedup.run_once_async(c, j, effect) is True
        finally:
            await pool.close()
        async with await psycopg.AsyncConnection.connect(dsn(dbname), autocommit=True) as c:
            j = job + "-psycopg"

            async def swallowing(c):
                await c.execute("INSERT INTO receipts (job_id) VALUES (%s)", (j,))
                try:
                    await c.execute("SELECT 1/0")
                except psycopg.errors.DivisionByZero:
                    pass

            with pytest.raises(dedup.TransactionAborted):
                await dedup.run_once_async(c, j, swallowing)
            assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert receipts(conn, j) == 0 and not claimed(conn, j)
            assert await dedup.run_once_async(c, j, lambda c: c.execute("INSERT INTO receipts (job_id) VALUES (%s)", (j,))) is True

    run(main())
    for suffix in ("-pool", "-connection", "-psycopg"):
        assert claimed(conn, job + suffix) and receipts(conn, job + suffix) == 1
