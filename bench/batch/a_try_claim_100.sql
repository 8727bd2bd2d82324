-- (a) 100 dedup.try_claim calls (one statement over the same array), then the effects
\set b random(1, 9000000000000000000)
BEGIN;
SELECT count(*) FILTER (WHERE dedup.try_claim(id))
  FROM unnest(ARRAY(SELECT generate_series(:b::bigint, :b::bigint + 99))) AS id;
INSERT INTO effects (job_id, payload) SELECT generate_series(:b::bigint, :b::bigint + 99), 'receipt';
COMMIT;
