-- (c) dedup.try_claim(bigint)
\set id random(1, 9000000000000000000)
BEGIN;
SELECT dedup.try_claim(:id::bigint);
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
