-- Tables of the pgbench comparison (the extension is already installed).
CREATE TABLE effects (job_id bigint NOT NULL, payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
-- The guide's own table (section 5): bigint primary key, time of the claim.
CREATE TABLE my_processed (job_id bigint PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
