-- dedup 0.3.0 -> 0.4.0: the diagnostic hook. Keeps every claim; adds the view dedup.stats,
-- the functions behind it, and dedup.lease counting its outcomes. The objects are the ones
-- src/stats.rs and sql/stats.sql create in a new install. The counters need
-- shared_preload_libraries = 'dedup'.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.4.0'" to load this file. \quit

CREATE FUNCTION dedup.stats_counters() RETURNS TABLE (
	"datname" pg_catalog.text,
	"scope" pg_catalog.text,
	"consumer" pg_catalog.text,
	"claims" pg_catalog.int8,
	"duplicates" pg_catalog.int8,
	"busy" pg_catalog.int8,
	"fingerprint_mismatches" pg_catalog.int8,
	"last_claim_at" pg_catalog.timestamptz,
	"last_duplicate_at" pg_catalog.timestamptz
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_counters_wrapper';

CREATE FUNCTION dedup.stats_info() RETURNS TABLE (
	"counting" pg_catalog.bool,
	"entries" pg_catalog.int8,
	"max_entries" pg_catalog.int8,
	"evictions" pg_catalog.int8,
	"reset_at" pg_catalog.timestamptz
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_info_wrapper';

CREATE FUNCTION dedup.stats_reset() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_reset_wrapper';

CREATE FUNCTION dedup._count(
	"scope" pg_catalog.text,
	"event" pg_catalog.text
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'count_event_wrapper';

-- dedup.lease, now counting its outcomes in dedup.stats (the 0.3.0 function, plus the
-- dedup._count calls).
CREATE OR REPLACE FUNCTION dedup.lease(
    job_id      pg_catalog.text,
    scope       pg_catalog.text DEFAULT 'default',
    duration    pg_catalog.interval DEFAULT NULL,
    fingerprint pg_catalog.text DEFAULT NULL,
    OUT status     pg_catalog.text,
    OUT lease_id   pg_catalog.uuid,
    OUT expires_at pg_catalog.timestamptz,
    OUT result     pg_catalog.jsonb,
    OUT claimed_at pg_catalog.timestamptz)
RETURNS record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d     interval;
    held  dedup.processed;
BEGIN
    -- (loads the library, and with it the setting dedup.lease_duration)
    PERFORM dedup._check_claim('dedup.lease', job_id, scope, fingerprint);
    d := coalesce(duration, pg_catalog.current_setting('dedup.lease_duration')::interval);
    IF d <= interval '0' THEN
        PERFORM dedup._raise('22023', format('dedup.lease: duration must be positive, not %s', d),
                             'Pass how long the external effect may take, e.g. ''30 seconds''.');
    END IF;
    IF d > dedup.retention(scope) THEN
        PERFORM dedup._raise('22023',
            format('dedup.lease: a lease of %s is longer than the retention of scope %L (%s)', d, scope,
                   dedup.retention(scope)),
            'A lease must end before its claim could be pruned: shorten the lease, extend it while '
            'working (dedup.extend_lease), or lengthen the retention (dedup.set_retention).');
    END IF;

    -- A new claim, or the takeover of an expired lease with a compatible fingerprint: one
    -- statement, so one caller wins. Otherwise the row stays locked until we commit.
    INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint, lease_id, lease_expires_at)
    VALUES (scope, job_id, now(), fingerprint, gen_random_uuid(), clock_timestamp() + d)
    ON CONFLICT ON CONSTRAINT processed_pkey DO UPDATE
        SET processed_at = excluded.processed_at,
            fingerprint = coalesce(excluded.fingerprint, p.fingerprint),
            lease_id = excluded.lease_id,
            lease_expires_at = excluded.lease_expires_at
        WHERE p.lease_expires_at < clock_timestamp()
          AND (p.fingerprint IS NULL OR excluded.fingerprint IS NULL OR p.fingerprint = excluded.fingerprint)
    RETURNING p.lease_id, p.lease_expires_at, p.processed_at INTO lease_id, expires_at, claimed_at;
    IF FOUND THEN
        status := 'acquired';
        PERFORM dedup._count(scope, status);
        RETURN;
    END IF;

    SELECT * INTO STRICT held FROM dedup.processed AS p
     WHERE p.job_id = lease.job_id AND p.scope = lease.scope;
    IF held.fingerprint IS NOT NULL AND fingerprint IS NOT NULL AND held.fingerprint <> fingerprint THEN
        PERFORM dedup._count(scope, 'fingerprint_mismatch');
        PERFORM dedup._fingerprint_mismatch('dedup.lease', job_id, scope);
    END IF;
    claimed_at := held.processed_at;
    IF held.lease_expires_at IS NULL THEN
        status := 'done';
        result := held.result;
    ELSE
        status := 'busy';
        expires_at := held.lease_expires_at;
    END IF;
    PERFORM dedup._count(scope, status);
END
$$;

-- Live claims per scope, estimated from the planner's statistics of dedup.processed (the
-- share of each scope among its most common values, times the table's row estimate).
-- SECURITY DEFINER: monitoring roles cannot read the statistics of a table they cannot read.
CREATE FUNCTION dedup._live_claims_estimate(OUT scope pg_catalog.text, OUT claims pg_catalog.int8)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT v.scope, round(c.reltuples * v.freq)::int8
      FROM pg_class AS c
      JOIN pg_stats AS s ON s.schemaname = 'dedup' AND s.tablename = 'processed' AND s.attname = 'scope'
     CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(scope, freq)
     WHERE c.oid = 'dedup.processed'::regclass AND c.reltuples >= 0
$$;

CREATE VIEW dedup.stats AS
    SELECT c.datname, c.scope, c.consumer, c.claims, c.duplicates, c.busy, c.fingerprint_mismatches,
           c.last_claim_at, c.last_duplicate_at,
           p.rows_deleted AS rows_pruned, p.last_pass_at AS last_pruned_at,
           e.claims AS live_claims_estimate
      FROM dedup.stats_counters() AS c
      LEFT JOIN dedup._prune_status AS p
             ON c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
            AND p.scope OPERATOR(pg_catalog.=) c.scope
      LEFT JOIN dedup._live_claims_estimate() AS e
             ON c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
            AND e.scope OPERATOR(pg_catalog.=) c.scope;
COMMENT ON VIEW dedup.stats IS
    'Claims won, duplicates skipped, busy and fingerprint mismatches per database, scope and consumer (needs shared_preload_libraries = ''dedup''); prune columns for this database.';

REVOKE ALL ON TABLE dedup.stats FROM PUBLIC;
GRANT SELECT ON TABLE dedup.stats TO pg_monitor;
REVOKE ALL ON FUNCTION dedup.stats_counters() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.stats_counters() TO pg_monitor;
REVOKE ALL ON FUNCTION dedup.stats_info() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.stats_info() TO pg_monitor;
REVOKE ALL ON FUNCTION dedup._live_claims_estimate() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup._live_claims_estimate() TO pg_monitor;
REVOKE ALL ON FUNCTION dedup.stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._count(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

COMMENT ON FUNCTION dedup.stats_counters() IS
    'The counters behind dedup.stats, for every database.';
COMMENT ON FUNCTION dedup.stats_info() IS
    'Whether claims are counted, entries in use, the bound dedup.stats_max, evictions, and the last reset.';
COMMENT ON FUNCTION dedup.stats_reset() IS
    'Forget every counter of dedup.stats.';
