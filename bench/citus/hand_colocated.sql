-- hand-written claim + colocated effect
\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO my_processed (job_id) VALUES (:id::text) ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects_c (job_id, payload) VALUES (:id::text, 'receipt');
COMMIT;
