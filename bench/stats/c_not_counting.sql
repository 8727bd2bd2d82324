-- (c) try_claim(bigint) with the counters off for this transaction (the SET LOCAL is in both
-- scripts, so the two differ only in counting)
\set id random(1, 9000000000000000000)
BEGIN;
SET LOCAL dedup.track_stats = off;
SELECT dedup.try_claim(:id::bigint);
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
