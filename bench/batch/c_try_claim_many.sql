-- (c) dedup.try_claim_many(bigint[]) of 100 new ids, then the batch's effects
\set b random(1, 9000000000000000000)
BEGIN;
SELECT dedup.try_claim_many(ARRAY(SELECT generate_series(:b::bigint, :b::bigint + 99)));
INSERT INTO effects (job_id, payload) SELECT generate_series(:b::bigint, :b::bigint + 99), 'receipt';
COMMIT;
