-- hand-written claim into layout l_scope_first
\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO l_scope_first (scope, job_id) VALUES ('default', :id::text) ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
