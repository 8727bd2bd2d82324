-- (b) the guide's hand-written claim: INSERT ... ON CONFLICT DO NOTHING RETURNING on a bigint table
\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO my_processed (job_id) VALUES (:id) ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
