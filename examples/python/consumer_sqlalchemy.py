"""A queue consumer that does each job's effect exactly once with dedup.try_claim
(SQLAlchemy 2 ORM, on psycopg 3).

For every message: claim its job and add the effect in one Session transaction, commit,
and only then acknowledge the message. A message whose transaction did not commit is not
acknowledged, so the queue delivers it again. The whole transaction is retried on
serialization failure (40001) and deadlock (40P01).

Environment: DATABASE_URL (postgresql://...; the psycopg 3 driver is used),
VISIBILITY_TIMEOUT_S (default 30), EXIT_WHEN_EMPTY=1 (exit once every message is
acknowledged). One job at a time: run several processes for concurrency. The queue and
the receipts table are in examples/schema.sql.
"""
import os
import sys
import time
from collections import Counter
from datetime import datetime

from psycopg import errors
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

MAX_ATTEMPTS = 5
ME = f"sqlalchemy-{os.getpid()}"
# done, skipped (a duplicate: done before), retried, failed: the guide's diagnostic hook
stats: Counter[str] = Counter()


class Base(DeclarativeBase):
    pass


class Receipt(Base):
    __tablename__ = "receipts"
    # The table has no primary key (see schema.sql); the ORM needs one to map it.
    job_id: Mapped[str] = mapped_column(primary_key=True)
    consumer: Mapped[str]
    done_at: Mapped[datetime] = mapped_column(server_default=func.now())


# [readme:python-sqlalchemy]
def handle(Session: sessionmaker, job_id: str) -> bool:
    """Claim the job and add its effect in one transaction, retried on 40001 and 40P01.
    True: done now; False: done before. Either way it committed: acknowledge the message."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with Session.begin() as session:  # commits at the end of the block
                fresh = session.scalar(select(func.dedup.try_claim(job_id)))
                if fresh:
                    session.add(Receipt(job_id=job_id, consumer=ME))
            return fresh
        except DBAPIError as e:
            retry = isinstance(e.orig, (errors.SerializationFailure, errors.DeadlockDetected))
            if not retry or attempt == MAX_ATTEMPTS:
                raise
            stats["retried"] += 1
            time.sleep(0.01 * 2**attempt)
# [/readme:python-sqlalchemy]


def consume_batch(Session: sessionmaker, visibility_timeout_s: int) -> int:
    """Receive a batch; acknowledge each message only after its transaction committed."""
    with Session.begin() as session:  # receiving commits on its own
        batch = session.execute(
            text("SELECT msg_id, job_id FROM queue.receive(10, :vt)"), {"vt": visibility_timeout_s}
        ).all()
    for msg_id, job_id in batch:
        try:
            fresh = handle(Session, job_id)
        except DBAPIError as e:
            # Not acknowledged: the queue delivers it again after the visibility timeout.
            stats["failed"] += 1
            print(f"{ME}: job {job_id} left unacknowledged: {e.orig}", file=sys.stderr)
            continue
        with Session.begin() as session:
            session.execute(text("SELECT queue.ack(:id)"), {"id": msg_id})
        stats["done" if fresh else "skipped"] += 1
    return len(batch)


def main() -> None:
    vt = int(os.environ.get("VISIBILITY_TIMEOUT_S", "30"))
    exit_when_empty = os.environ.get("EXIT_WHEN_EMPTY") == "1"
    url = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url, pool_size=1)
    Session = sessionmaker(engine)
    while True:
        if consume_batch(Session, vt) > 0:
            continue
        with Session() as session:
            if exit_when_empty and session.scalar(text("SELECT queue.pending()")) == 0:
                break
        time.sleep(0.1)
    counts = " ".join(f"{k}={stats[k]}" for k in ("done", "skipped", "retried", "failed"))
    print(f"{ME} summary {counts}")


if __name__ == "__main__":
    main()
