-- (b) the hand-written batch claim: INSERT ... SELECT unnest(ids) ON CONFLICT DO NOTHING
-- RETURNING, then the batch's effects, in one transaction (100 new ids)
\set b random(1, 9000000000000000000)
BEGIN;
INSERT INTO my_processed (job_id)
SELECT unnest(ARRAY(SELECT generate_series(:b::bigint, :b::bigint + 99)))
ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects (job_id, payload) SELECT generate_series(:b::bigint, :b::bigint + 99), 'receipt';
COMMIT;
