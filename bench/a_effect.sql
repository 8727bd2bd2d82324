-- (a) the effect alone
\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
