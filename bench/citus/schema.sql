-- The Citus benchmark's tables (bench/citus/run.sh), on a coordinator where
-- dedup.distribute() ran. The hand-written claim table is the guide's, distributed by its
-- key like dedup.processed; the effects are either colocated with the claims (text COLLATE
-- "C", the claim and the effect on one shard: a one-node commit) or not (bigint key: the
-- transaction spans two shards, usually two nodes: two-phase commit).
CREATE TABLE my_processed (job_id text COLLATE "C" PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
SELECT create_distributed_table('my_processed', 'job_id', colocate_with => 'dedup.processed');
CREATE TABLE effects_c (job_id text COLLATE "C" NOT NULL, payload text NOT NULL);
SELECT create_distributed_table('effects_c', 'job_id', colocate_with => 'dedup.processed');
CREATE TABLE effects_n (job_id bigint NOT NULL, payload text NOT NULL);
SELECT create_distributed_table('effects_n', 'job_id', colocate_with => 'none');
-- The consumer role of docs/citus.md for the row-level security runs: its column grants on
-- dedup.processed, and the colocated effect table. (Statements of their own: Citus changes
-- roles over one connection per node.)
CREATE ROLE bench_app LOGIN;
GRANT SELECT (scope, job_id, processed_at, fingerprint, result, lease_expires_at),
      INSERT (scope, job_id, fingerprint, processed_at), UPDATE (result)
   ON dedup.processed TO bench_app;
GRANT SELECT, INSERT ON effects_c TO bench_app;
