-- dedup 0.1.0 -> 0.2.0: retention. Keeps every claim; adds per-scope retention, the
-- record of prune passes and the functions dedup.prune, dedup.set_retention and
-- dedup.retention. The objects are the ones sql/retention.sql creates in a new install.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.2.0'" to load this file. \quit

CREATE TABLE dedup.scope_retention (
    scope     pg_catalog.text COLLATE pg_catalog."C" NOT NULL PRIMARY KEY,
    retention pg_catalog.interval NOT NULL
              CHECK (retention OPERATOR(pg_catalog.>) '0 seconds'::pg_catalog.interval),
    set_at    pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    set_by    pg_catalog.name NOT NULL DEFAULT CURRENT_USER
);
COMMENT ON TABLE dedup.scope_retention IS
    'Scopes with a retention of their own (dedup.set_retention); the others use dedup.retention.';
REVOKE ALL ON TABLE dedup.scope_retention FROM PUBLIC;
GRANT SELECT ON TABLE dedup.scope_retention TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('dedup.scope_retention', '');

-- Written by every prune pass: the row with scope '' is the last pass over all scopes
-- (or the worker's failures), the others the last pass that deleted from that scope.
CREATE TABLE dedup._prune_status (
    scope                pg_catalog.text COLLATE pg_catalog."C" NOT NULL PRIMARY KEY,
    last_pass_at         pg_catalog.timestamptz,
    rows_deleted         pg_catalog.int8,
    duration             pg_catalog.interval,
    pruned_by            pg_catalog.text NOT NULL,
    consecutive_failures pg_catalog.int4 NOT NULL DEFAULT 0,
    last_error           pg_catalog.text,
    last_error_at        pg_catalog.timestamptz
);
REVOKE ALL ON TABLE dedup._prune_status FROM PUBLIC;

CREATE VIEW dedup.prune_status AS
    SELECT NULLIF(s.scope, '') AS scope, s.last_pass_at, s.rows_deleted, s.duration,
           s.pruned_by, s.consecutive_failures, s.last_error, s.last_error_at
      FROM dedup._prune_status AS s;
COMMENT ON VIEW dedup.prune_status IS
    'The last prune pass per scope (scope NULL: the last pass over all scopes, and the worker''s failures).';
REVOKE ALL ON TABLE dedup.prune_status FROM PUBLIC;
GRANT SELECT ON TABLE dedup.prune_status TO pg_monitor;

CREATE FUNCTION dedup.prune(
	"scope" pg_catalog.text DEFAULT NULL,
	"max_rows" pg_catalog.int8 DEFAULT NULL
) RETURNS pg_catalog.int8
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'prune_wrapper';

CREATE FUNCTION dedup.set_retention(
	"scope" pg_catalog.text,
	"retention" pg_catalog.interval
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_retention_wrapper';

CREATE FUNCTION dedup.retention(
	"scope" pg_catalog.text DEFAULT 'default'
) RETURNS pg_catalog.interval
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'retention_wrapper';

REVOKE ALL ON FUNCTION dedup.prune(pg_catalog.text, pg_catalog.int8) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup.set_retention(pg_catalog.text, pg_catalog.interval) FROM PUBLIC;
COMMENT ON FUNCTION dedup.prune(pg_catalog.text, pg_catalog.int8) IS
'Delete claims older than their retention (all scopes, or one), at most max_rows; returns how many. Runs in the caller''s transaction; waits for a prune already running in this database.';
COMMENT ON FUNCTION dedup.set_retention(pg_catalog.text, pg_catalog.interval) IS
'Give a scope its own retention, overriding dedup.retention; NULL removes it.';
COMMENT ON FUNCTION dedup.retention(pg_catalog.text) IS
'The retention in force for a scope: its own, or dedup.retention.';
