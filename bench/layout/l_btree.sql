-- hand-written claim into layout l_btree
\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO l_btree (scope, job_id) VALUES ('default', :id::text) ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
