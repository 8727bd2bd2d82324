-- dedup.try_claim + colocated effect
\set id random(1, 9000000000000000000)
BEGIN;
SELECT dedup.try_claim(:id::bigint);
INSERT INTO effects_c (job_id, payload) VALUES (:id::text, 'receipt');
COMMIT;
