-- dedup's counters: the view dedup.stats over the counters the library keeps in shared
-- memory (src/stats/), with each scope's last prune pass and live claims.

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
           e.claims AS live_claims_estimate,
           c.late_duplicates, c.duplicate_age_max,
           c.duplicate_age_sum OPERATOR(pg_catalog./) NULLIF(
               (SELECT pg_catalog.sum(a) FROM pg_catalog.unnest(c.duplicate_ages) AS a), 0)::pg_catalog.float8
               AS duplicate_age_avg,
           c.duplicate_ages,
           c.waits, c.wait_time, c.wait_max,
           CASE WHEN c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
                 AND c.scope OPERATOR(pg_catalog.<>) '(overflow)'
                THEN dedup.retention(c.scope) END AS retention,
           c.batches, c.advances,
           c.expired_duplicates, c.last_expired_duplicate_at, c.expired_duplicate_after_max,
           c.expired_duplicates_expected,
           c.unsummarised_probes, c.summary_false_positives
      FROM dedup.stats_counters() AS c
      LEFT JOIN dedup._prune_status AS p
             ON c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
            AND p.scope OPERATOR(pg_catalog.=) c.scope
      LEFT JOIN dedup._live_claims_estimate() AS e
             ON c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
            AND e.scope OPERATOR(pg_catalog.=) c.scope;
COMMENT ON VIEW dedup.stats IS
    'Claims won, duplicates skipped, busy and fingerprint mismatches per database, scope and consumer (needs shared_preload_libraries = ''dedup''); the ages of the claims duplicates hit and the waits for concurrent holders; copies that ran again because their claim had expired; prune columns and retention for this database.';
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
REVOKE ALL ON FUNCTION dedup._count(pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz) FROM PUBLIC;

COMMENT ON FUNCTION dedup.stats_counters() IS
    'The counters behind dedup.stats, for every database.';
COMMENT ON FUNCTION dedup.stats_info() IS
    'Whether claims are counted, entries in use (the overflow row included), the bound dedup.stats_max, calls counted in the overflow row, and the last reset.';
COMMENT ON FUNCTION dedup.stats_reset() IS
    'Forget every counter of dedup.stats.';

-- The retention each scope of this database needs, from what was seen: the oldest claim a
-- duplicate hit, and the copies that came after their claim expired (each at most
-- expired_duplicate_after_max past its scope's retention), when there are more of them than
-- the summaries' false positives explain (expired_duplicates_expected, and four standard
-- deviations of it): otherwise the time past expiry may be a false positive's. Half again
-- the latest copy seen, rounded up to a minute, and never shorter than the retention in
-- force: copies seen so far are not the latest that can come.
CREATE FUNCTION dedup.suggest_retention(
    OUT scope pg_catalog.text, OUT retention pg_catalog.interval,
    OUT duplicate_age_max pg_catalog.interval, OUT expired_duplicates pg_catalog.int8,
    OUT expired_duplicates_expected pg_catalog.float8,
    OUT expired_duplicate_after_max pg_catalog.interval, OUT latest_copy pg_catalog.interval,
    OUT suggested pg_catalog.interval)
RETURNS SETOF record
LANGUAGE sql VOLATILE PARALLEL RESTRICTED
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT g.scope, g.retention, g.duplicate_age_max, g.expired_duplicates, g.expected,
           g.expired_duplicate_after_max, g.latest_copy,
           GREATEST(g.retention,
                    make_interval(secs => ceil(extract(epoch FROM g.latest_copy) * 1.5 / 60) * 60))
      FROM (SELECT s.scope, dedup.retention(s.scope) AS retention,
                   max(s.duplicate_age_max) AS duplicate_age_max,
                   sum(s.expired_duplicates)::int8 AS expired_duplicates,
                   sum(s.expired_duplicates_expected) AS expected,
                   max(s.expired_duplicate_after_max) AS expired_duplicate_after_max,
                   GREATEST(max(s.duplicate_age_max),
                            CASE WHEN sum(s.expired_duplicates) >
                                      sum(s.expired_duplicates_expected)
                                      + 4 * sqrt(sum(s.expired_duplicates_expected))
                                 THEN dedup.retention(s.scope) + max(s.expired_duplicate_after_max)
                            END) AS latest_copy
              FROM dedup.stats AS s
             WHERE s.datname = current_database() AND s.scope <> '(overflow)'
             GROUP BY s.scope) AS g
     ORDER BY g.scope
$$;
REVOKE ALL ON FUNCTION dedup.suggest_retention() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.suggest_retention() TO pg_monitor;
COMMENT ON FUNCTION dedup.suggest_retention() IS
    'Per scope of this database: the retention in force, the latest copies seen (duplicates before expiry, expired duplicates after, when more than false positives explain), and a retention that would have caught them with half again as margin.';
REVOKE ALL ON FUNCTION dedup.expired_summaries() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.expired_summaries() TO pg_monitor;
COMMENT ON FUNCTION dedup.expired_summaries() IS
    'The summaries of pruned claims that count expired duplicates (needs shared_preload_libraries = ''dedup''), newest first: their keys, the keys they could not take, their expiry range, databases and false-positive rate.';
