-- (b2) the hand-written batch claim on a table laid out as dedup.processed (text scope and
-- job id, COLLATE "C", primary key (job_id, scope), a timestamptz): the same work per row
\set b random(1, 9000000000000000000)
BEGIN;
INSERT INTO my_processed_text (scope, job_id)
SELECT 'default', unnest(ARRAY(SELECT generate_series(:b::bigint, :b::bigint + 99)))::text
ON CONFLICT DO NOTHING RETURNING job_id;
INSERT INTO effects (job_id, payload) SELECT generate_series(:b::bigint, :b::bigint + 99), 'receipt';
COMMIT;
