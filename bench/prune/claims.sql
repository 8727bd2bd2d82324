-- The claim workload that runs while a prune does: mostly new jobs, and one in ten a
-- redelivery of a job whose old, expired claim may be being pruned at that moment.
\set id random(1, 9000000000000000000)
\set old random(1, 10000000)
\set redelivery random(1, 10)
BEGIN;
SELECT dedup.try_claim(CASE WHEN :redelivery = 1 THEN 'old-' || :old ELSE :id::text END);
INSERT INTO effects (job_id, payload) VALUES (:id, 'receipt');
COMMIT;
