-- (d) one dedup.advance for the batch of 100 (a partition of 64, its position moving on),
-- then the effects
\set b random(1, 9000000000000000000)
\set p random(0, 63)
BEGIN;
SELECT dedup.advance('bench', :p, :b);
INSERT INTO effects (job_id, payload) SELECT generate_series(:b::bigint, :b::bigint + 99), 'receipt';
COMMIT;
