-- The latency probe of bench/retention.sh: one try_claim of a new job, a few times a
-- second beside the load, each transaction's latency logged.
\set id random(1, 9000000000000000000)
SELECT dedup.try_claim(:id::bigint);
