-- hand-written claim + effect on a table that is not colocated (two-phase commit)
\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO my_processed (job_id) VALUES (:id::text) ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects_n (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
