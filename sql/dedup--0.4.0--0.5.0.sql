-- dedup 0.4.0 -> 0.5.0: hardening (issue 11). Keeps every claim. dedup.stats_info() reports
-- the calls counted in the overflow row instead of evictions (the counter table no longer
-- evicts); the rest is sql/hardening.sql, which a new install runs too.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.5.0'" to load this file. \quit

DROP FUNCTION dedup.stats_info();
CREATE FUNCTION dedup.stats_info() RETURNS TABLE (
	"counting" pg_catalog.bool,
	"entries" pg_catalog.int8,
	"max_entries" pg_catalog.int8,
	"overflowed" pg_catalog.int8,
	"reset_at" pg_catalog.timestamptz
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_info_wrapper';
REVOKE ALL ON FUNCTION dedup.stats_info() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.stats_info() TO pg_monitor;

-- dedup 0.5.0: nobody gains a privilege through dedup, nobody can stop pruning, no done job
-- is pruned early (issue 11). sql/dedup--0.4.0--0.5.0.sql makes the same changes for an
-- upgrade (it includes this file's text; a test compares the two catalogs).

-- YD001 for every caller: the function that raises it runs as its owner, who may call
-- dedup._raise (not granted to PUBLIC). It raises the error and does nothing else.
ALTER FUNCTION dedup._fingerprint_mismatch(pg_catalog.text, pg_catalog.text, pg_catalog.text)
    SECURITY DEFINER;

-- A completed lease is done from its completion: retention counts from there.
CREATE OR REPLACE FUNCTION dedup.complete(
    job_id   pg_catalog.text,
    lease_id pg_catalog.uuid,
    result   pg_catalog.jsonb DEFAULT NULL,
    scope    pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._check_claim('dedup.complete', job_id, scope, NULL);
    IF lease_id IS NULL THEN
        PERFORM dedup._raise('22004', 'dedup.complete: lease_id must not be NULL',
                             'Pass the lease_id that dedup.lease returned with status ''acquired''.');
    END IF;
    -- Done from now on: processed_at becomes the moment the job was done, which retention
    -- counts from, so it stays done for its scope's whole retention after this.
    UPDATE dedup.processed AS p
       SET lease_expires_at = NULL, result = complete.result, processed_at = clock_timestamp()
     WHERE p.job_id = complete.job_id AND p.scope = complete.scope
       AND p.lease_id = complete.lease_id AND p.lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        -- Completing twice with the same lease is a no-op: the first result stays.
        PERFORM FROM dedup.processed AS p
         WHERE p.job_id = complete.job_id AND p.scope = complete.scope
           AND p.lease_id = complete.lease_id AND p.lease_expires_at IS NULL;
        IF NOT FOUND THEN
            PERFORM dedup._lease_lost('dedup.complete', job_id, scope, lease_id);
        END IF;
    END IF;
END
$$;

-- An extension longer than the scope's retention is refused, as a lease that long is.
CREATE OR REPLACE FUNCTION dedup.extend_lease(
    job_id   pg_catalog.text,
    lease_id pg_catalog.uuid,
    duration pg_catalog.interval DEFAULT NULL,
    scope    pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d     interval;
    until timestamptz;
BEGIN
    PERFORM dedup._check_claim('dedup.extend_lease', job_id, scope, NULL);
    d := coalesce(duration, pg_catalog.current_setting('dedup.lease_duration')::interval);
    IF d <= interval '0' THEN
        PERFORM dedup._raise('22023', format('dedup.extend_lease: duration must be positive, not %s', d),
                             'Pass how much longer the external effect may take.');
    END IF;
    IF d > dedup.retention(scope) THEN
        PERFORM dedup._raise('22023',
            format('dedup.extend_lease: an extension of %s is longer than the retention of scope %L (%s)',
                   d, scope, dedup.retention(scope)),
            'A lease must end before its claim could be pruned: extend it by less and more often, '
            'or lengthen the retention (dedup.set_retention).');
    END IF;
    UPDATE dedup.processed AS p SET lease_expires_at = clock_timestamp() + d
     WHERE p.job_id = extend_lease.job_id AND p.scope = extend_lease.scope
       AND p.lease_id = extend_lease.lease_id AND p.lease_expires_at IS NOT NULL
    RETURNING p.lease_expires_at INTO until;
    IF NOT FOUND THEN
        PERFORM dedup._lease_lost('dedup.extend_lease', job_id, scope, lease_id);
    END IF;
    RETURN until;
END
$$;

-- overdue: for the row of the last pass over all scopes (scope NULL), true when it ended
-- more than two dedup.prune_interval ago, i.e. a pass that was due has not happened for a
-- whole interval; NULL when the worker is off (interval 0) or not loaded.
CREATE OR REPLACE VIEW dedup.prune_status AS
    SELECT NULLIF(s.scope, '') AS scope, s.last_pass_at, s.rows_deleted, s.duration,
           s.pruned_by, s.consecutive_failures, s.last_error, s.last_error_at,
           CASE WHEN s.scope OPERATOR(pg_catalog.=) '' THEN
                COALESCE(s.last_pass_at, '-infinity'::pg_catalog.timestamptz)
                  OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-)
                    (NULLIF(pg_catalog.current_setting('dedup.prune_interval', true), '0')::pg_catalog.interval
                       OPERATOR(pg_catalog.*) 2::pg_catalog.float8))
           END AS overdue
      FROM dedup._prune_status AS s;
COMMENT ON VIEW dedup.prune_status IS
    'The last prune pass per scope (scope NULL: the last pass over all scopes, the worker''s failures, and whether a pass is overdue).';

COMMENT ON FUNCTION dedup.stats_info() IS
    'Whether claims are counted, entries in use (the overflow row included), the bound dedup.stats_max, calls counted in the overflow row, and the last reset.';
