-- What the client examples in examples/ need besides the extension: the effect table and
-- a small message queue. The tests load this file into each example's database.

CREATE EXTENSION IF NOT EXISTS dedup;

-- The effect: one row per job done. On purpose there is no unique key on job_id: the
-- claim is what keeps duplicates out, and the tests count the rows per job.
CREATE TABLE receipts (
    job_id   text NOT NULL,
    consumer text NOT NULL,
    done_at  timestamptz NOT NULL DEFAULT now()
);

-- A stand-in for your message broker (Redis Streams, SQS, RabbitMQ, pgmq), with the same
-- at-least-once contract: queue.receive hands out messages and hides them for a
-- visibility timeout; a message that is not acknowledged (queue.ack) within it is
-- delivered again, to any consumer. The examples receive and acknowledge in transactions
-- of their own, never in the transaction of the effect, exactly as they would with a
-- broker that is not the database. Producers may also send a job more than once.
CREATE SCHEMA queue;

CREATE TABLE queue.messages (
    msg_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     text NOT NULL,
    visible_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    deliveries integer NOT NULL DEFAULT 0
);

CREATE FUNCTION queue.send(job_id text) RETURNS bigint
LANGUAGE sql VOLATILE STRICT AS $$
    INSERT INTO queue.messages (job_id) VALUES (job_id) RETURNING msg_id
$$;

-- Up to n visible messages, oldest first, each hidden for visibility_timeout_s seconds.
CREATE FUNCTION queue.receive(n integer, visibility_timeout_s integer)
RETURNS TABLE (msg_id bigint, job_id text, deliveries integer)
LANGUAGE sql VOLATILE STRICT AS $$
    UPDATE queue.messages AS m
    SET visible_at = pg_catalog.clock_timestamp()
                     + pg_catalog.make_interval(secs => visibility_timeout_s),
        deliveries = m.deliveries + 1
    WHERE m.msg_id IN (SELECT v.msg_id FROM queue.messages AS v
                       WHERE v.visible_at <= pg_catalog.clock_timestamp()
                       ORDER BY v.msg_id LIMIT n
                       FOR UPDATE SKIP LOCKED)
    RETURNING m.msg_id, m.job_id, m.deliveries
$$;

-- Acknowledge: the message is gone for good. False if it was acknowledged already.
CREATE FUNCTION queue.ack(msg_id bigint) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    WITH d AS (DELETE FROM queue.messages AS m WHERE m.msg_id = ack.msg_id RETURNING 1)
    SELECT count(*) > 0 FROM d
$$;

-- Messages not yet acknowledged, visible or in flight.
CREATE FUNCTION queue.pending() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM queue.messages
$$;
