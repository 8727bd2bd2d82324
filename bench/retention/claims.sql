-- The load of bench/retention.sh: one batch of :batch new bigint jobs, claims only (no
-- effect), so that the WAL counted per claim is the claim's.
\set b random(1, 9000000000000000)
SELECT count(*) FROM dedup.try_claim_many(ARRAY(SELECT generate_series(:b::bigint * 1000, :b::bigint * 1000 + :batch - 1)));
