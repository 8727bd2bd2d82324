-- dedup bootstrap: the managed claim table. Runs first in CREATE EXTENSION, with
-- search_path set to the extension's schema; every name is qualified anyway.

CREATE TABLE dedup.processed (
    scope        pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    job_id       pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    processed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT processed_pkey PRIMARY KEY (job_id, scope)
);

COMMENT ON TABLE dedup.processed IS
    'Claims taken by dedup.try_claim: one row per (scope, job_id), written in the claiming transaction.';

-- Nobody but the owner writes this table directly: try_claim is the only way in, so
-- no role can forge processed_at, delete a claim or truncate the table.
REVOKE ALL ON TABLE dedup.processed FROM PUBLIC;
GRANT USAGE ON SCHEMA dedup TO PUBLIC;

-- pg_dump dumps the claims with the extension, so dump and restore keep them.
SELECT pg_catalog.pg_extension_config_dump('dedup.processed', '');
