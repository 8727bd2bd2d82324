-- Candidate layouts for the claim table, compared with the same hand-written claim
-- (bench/schema.sql creates the effects table). Keys in "C" unless named otherwise.
-- chosen: primary key (job_id, scope), no index on the claim time
CREATE TABLE l_chosen (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, scope));
-- scope first in the primary key: two text comparisons per btree step
CREATE TABLE l_scope_first (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, job_id));
-- the database's default collation (C.UTF-8 here, which PostgreSQL 15 compares with strcoll)
CREATE TABLE l_default_collation (scope text NOT NULL, job_id text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, scope));
-- plus a BRIN index on the claim time
CREATE TABLE l_brin (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, scope));
CREATE INDEX ON l_brin USING brin (processed_at);
-- plus a btree index on the claim time
CREATE TABLE l_btree (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, scope));
CREATE INDEX ON l_btree (processed_at);
