-- dedup.try_claim + effect on a table that is not colocated (two-phase commit)
\set id random(1, 9000000000000000000)
BEGIN;
SELECT dedup.try_claim(:id::bigint);
INSERT INTO effects_n (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
