-- (d) dedup.try_claim(text, scope)
\set id random(1, 9000000000000000000)
BEGIN;
SELECT dedup.try_claim(:id::text, 'bench');
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
