-- Candidate layouts for dedup.processed, compared with the same hand-written claim
-- (bench/schema.sql creates the effects table).
-- chosen: key columns in "C", BRIN on the claim time
CREATE TABLE l_c_brin (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, job_id));
CREATE INDEX ON l_c_brin USING brin (processed_at);
-- the database's default collation (C.UTF-8 here, which PostgreSQL 15 compares with strcoll)
CREATE TABLE l_default_brin (scope text NOT NULL, job_id text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, job_id));
CREATE INDEX ON l_default_brin USING brin (processed_at);
-- a btree on the claim time instead of BRIN
CREATE TABLE l_c_btree (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, job_id));
CREATE INDEX ON l_c_btree (processed_at);
-- no index on the claim time at all
CREATE TABLE l_c_none (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, job_id));
