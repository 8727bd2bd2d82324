-- dedup's retention: per-scope retention, the record of prune passes, the horizons that
-- keep a claim its whole retention from when it became visible, the table's health, and
-- dedup.forget with its audit table. The prune itself is src/prune/ and src/worker.rs.

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
-- resume_target and resume_block: where the worker's last pass over all scopes stopped
-- when its share of time ran out (a database is visited at most a minute, or one prune
-- interval if shorter, at a time, and the next visit goes on from there); NULL after a
-- whole pass.
CREATE TABLE dedup._prune_status (
    scope                pg_catalog.text COLLATE pg_catalog."C" NOT NULL PRIMARY KEY,
    last_pass_at         pg_catalog.timestamptz,
    rows_deleted         pg_catalog.int8,
    duration             pg_catalog.interval,
    pruned_by            pg_catalog.text NOT NULL,
    consecutive_failures pg_catalog.int4 NOT NULL DEFAULT 0,
    last_error           pg_catalog.text,
    last_error_at        pg_catalog.timestamptz,
    resume_target        pg_catalog.text,
    resume_block         pg_catalog.int8
);
REVOKE ALL ON TABLE dedup._prune_status FROM PUBLIC;

-- overdue: for the row of the last pass over all scopes (scope NULL), true when it ended
-- more than two dedup.prune_interval ago, i.e. a pass that was due has not happened for a
-- whole interval; NULL when the worker is off (interval 0) or not loaded.
CREATE VIEW dedup.prune_status AS
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
REVOKE ALL ON TABLE dedup.prune_status FROM PUBLIC;
GRANT SELECT ON TABLE dedup.prune_status TO pg_monitor;

-- A claim is kept its retention from when it became visible.
--
-- A claim's processed_at is its transaction's start, which is all a row can know of
-- itself: a transaction (or a prepared one, Citus's included) that lasts longer than the
-- retention would otherwise commit a claim already old enough to prune. Every pass first
-- records a horizon: the oldest transaction still running when it read its snapshot
-- (pg_snapshot_xmin), so every transaction ID below it had ended by then. A claim is pruned
-- only if its row's xmin is below the horizon of a pass at least a retention old: it was
-- visible for a whole retention. Until a pass that old exists (after CREATE EXTENSION, or
-- ALTER EXTENSION UPDATE, the row below), claims older than the oldest horizon are judged
-- by processed_at alone, as before; on a server of its own no transaction it took began
-- before then.
CREATE TABLE dedup._horizons (
    at      pg_catalog.timestamptz NOT NULL PRIMARY KEY,
    horizon pg_catalog.xid8 NOT NULL
);
COMMENT ON TABLE dedup._horizons IS
    'Prune passes'' horizons: every transaction ID below horizon had ended at time at (written by dedup.prune and the worker; transaction IDs are this server''s, so never dumped).';
REVOKE ALL ON TABLE dedup._horizons FROM PUBLIC;
INSERT INTO dedup._horizons (at, horizon)
    VALUES (pg_catalog.clock_timestamp(), pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()));

-- Record a horizon at every pass, and forget those no cutoff needs: every one older than
-- the newest at or before the earliest cutoff of any retention (computed as the cutoffs
-- are, from this transaction's start, in UTC with calendar months), and, past the last
-- step (a twentieth of the shortest retention, between 1 second and 1 hour), all but the
-- newest of each step. The first one (CREATE EXTENSION's, or the upgrade's) is never
-- removed: every cutoff after it has a horizon at or before it (an older one than it
-- needs, if a pass whose transaction began later removed that: fewer claims pruned, never
-- a claim too young), and only claims from before it are judged by processed_at alone.
-- global_retention: dedup.retention, in seconds.
CREATE FUNCTION dedup._mark_horizon(global_retention pg_catalog.float8)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    step     pg_catalog.float8;
    earliest pg_catalog.timestamptz;
    recent   pg_catalog.timestamptz;
    oldest   pg_catalog.timestamptz;
BEGIN
    INSERT INTO dedup._horizons (at, horizon)
    VALUES (pg_catalog.clock_timestamp(), pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()))
    ON CONFLICT DO NOTHING;
    -- (PL/pgSQL, not SQL: on Citus dedup.scope_retention is a reference table, which Citus
    -- does not plan in a SQL function with parameters.)
    SELECT GREATEST(1, LEAST(3600, pg_catalog.min(a.secs) OPERATOR(pg_catalog./) 20)),
           pg_catalog.min(a.cutoff)
      INTO step, earliest
      FROM (SELECT pg_catalog.date_part('epoch', t.retention) AS secs,
                   pg_catalog.timezone('UTC'::pg_catalog.text,
                       pg_catalog.timezone('UTC'::pg_catalog.text, pg_catalog.now())
                       OPERATOR(pg_catalog.-) t.retention) AS cutoff
              FROM dedup.scope_retention AS t
            UNION ALL
            SELECT global_retention,
                   pg_catalog.now() OPERATOR(pg_catalog.-)
                       pg_catalog.make_interval(secs => global_retention)) AS a;
    recent := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => step);
    SELECT pg_catalog.min(h.at) INTO oldest FROM dedup._horizons AS h;
    DELETE FROM dedup._horizons AS h
     WHERE h.at OPERATOR(pg_catalog.>) oldest
       AND (h.at OPERATOR(pg_catalog.<) (
               SELECT pg_catalog.max(k.at) FROM dedup._horizons AS k
                WHERE k.at OPERATOR(pg_catalog.<=) earliest)
        OR (h.at OPERATOR(pg_catalog.<) recent
            AND EXISTS (SELECT FROM dedup._horizons AS k
                         WHERE k.at OPERATOR(pg_catalog.>) h.at
                           AND k.at OPERATOR(pg_catalog.<) recent
                           AND pg_catalog.floor(pg_catalog.date_part('epoch', k.at) OPERATOR(pg_catalog./) step)
                               OPERATOR(pg_catalog.=)
                               pg_catalog.floor(pg_catalog.date_part('epoch', h.at) OPERATOR(pg_catalog./) step))));
END
$$;
REVOKE ALL ON FUNCTION dedup._mark_horizon(pg_catalog.float8) FROM PUBLIC;

-- The horizon a claim older than cutoff must be below to be pruned, as an xid: that of the
-- newest pass at or before cutoff (not one from the future of this server's transaction
-- IDs, which a copy of the table from elsewhere could hold); NULL when no pass is that old
-- (judge by processed_at alone); and 0 (which no xid's age exceeds) when that pass is two
-- billion transactions ago or more, too far for a 32-bit xid: nothing is pruned then,
-- rather than something too young (docs/retention.md).
CREATE FUNCTION dedup._horizon(cutoff pg_catalog.timestamptz)
RETURNS pg_catalog.xid
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
             WHEN m.h IS NULL THEN NULL
             WHEN (pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::pg_catalog.text::pg_catalog.int8
                   OPERATOR(pg_catalog.-) m.h::pg_catalog.text::pg_catalog.int8)
                  OPERATOR(pg_catalog.<) 2000000000
               THEN pg_catalog.xid(m.h)
             ELSE '0'::pg_catalog.xid
           END
      FROM (SELECT (SELECT h.horizon FROM dedup._horizons AS h
                     WHERE h.at OPERATOR(pg_catalog.<=) cutoff
                       AND h.horizon OPERATOR(pg_catalog.<=)
                           pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())
                     ORDER BY h.at DESC LIMIT 1) AS h) AS m
$$;
REVOKE ALL ON FUNCTION dedup._horizon(pg_catalog.timestamptz) FROM PUBLIC;

-- Live claims, the oldest claim and the last prune pass, per scope. Estimated from the
-- planner's statistics (cheap; the oldest claim is the table's, from its last ANALYZE), or
-- counted exactly (a scan of the whole table) with exact => true.
CREATE FUNCTION dedup.table_health(
    exact boolean DEFAULT false,
    OUT scope           pg_catalog.text,
    OUT live_claims     pg_catalog.int8,
    OUT oldest_claim_at pg_catalog.timestamptz,
    OUT counted         pg_catalog.bool,
    OUT last_pruned_at  pg_catalog.timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF exact THEN
        RETURN QUERY
            SELECT p.scope::text, count(*)::int8, min(p.processed_at), true,
                   (SELECT max(s.last_pass_at) FROM dedup._prune_status AS s WHERE s.scope IN (p.scope, ''))
              FROM dedup.processed AS p
             GROUP BY p.scope
             ORDER BY 1;
    ELSE
        RETURN QUERY
            SELECT e.scope, e.claims,
                   -- the least of the histogram's first bound and the most common values
                   -- (the claims of one transaction share processed_at, and such a value
                   -- is left out of the histogram)
                   (SELECT least((st.histogram_bounds::text::timestamptz[])[1],
                                 (SELECT min(v) FROM unnest(st.most_common_vals::text::timestamptz[]) AS v))
                      FROM pg_stats AS st
                     WHERE st.schemaname = 'dedup' AND st.tablename = 'processed' AND st.attname = 'processed_at'),
                   false,
                   (SELECT max(s.last_pass_at) FROM dedup._prune_status AS s WHERE s.scope IN (e.scope, ''))
              FROM dedup._live_claims_estimate() AS e
             ORDER BY 1;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION dedup.table_health(pg_catalog.bool) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.table_health(pg_catalog.bool) TO pg_monitor;
COMMENT ON FUNCTION dedup.table_health(pg_catalog.bool) IS
'Per scope: live claims, the oldest claim and the last prune pass; estimated from statistics, or counted exactly with exact => true (a scan of dedup.processed).';

-- Every dedup.forget: who forgot which job, when, and whether a claim was removed.
-- Pruned after the scope's retention, like claims.
CREATE TABLE dedup.forgotten (
    scope        pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    job_id       pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    forgotten_at pg_catalog.timestamptz NOT NULL,
    forgotten_by pg_catalog.name NOT NULL,
    removed      pg_catalog.bool NOT NULL,
    claimed_at   pg_catalog.timestamptz
);
-- It has no key (a job may be forgotten twice in one transaction): its whole row identifies
-- it to logical replication, so that the worker's DELETEs and an UPDATE of a published
-- dedup.forgotten replicate instead of failing (docs/operations.md, A blue/green switch).
ALTER TABLE dedup.forgotten REPLICA IDENTITY FULL;
COMMENT ON TABLE dedup.forgotten IS
    'The audit trail of dedup.forget: one row per call (who, when, job, scope, whether a claim was removed, and when that claim had been made). Kept for the scope''s retention.';
REVOKE ALL ON TABLE dedup.forgotten FROM PUBLIC;
GRANT SELECT ON TABLE dedup.forgotten TO pg_monitor;
SELECT pg_catalog.pg_extension_config_dump('dedup.forgotten', '');

-- Remove a done claim so the job can run again. Refuses a lease that is running.
CREATE FUNCTION dedup.forget(job_id pg_catalog.text, scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held    dedup.processed;
    removed boolean := false;
    tbl     text;
BEGIN
    -- The checks of every claim function, then the tables the claim may be in: every
    -- generation, newest first, where the database uses them (each locked in share mode,
    -- so none is dropped under us); dedup.processed alone otherwise. A key is in one.
    FOREACH tbl IN ARRAY dedup._claim_tables('dedup.forget', job_id, scope) LOOP
        -- Locked until we commit: a concurrent claim of the job waits for the forget.
        EXECUTE format('SELECT * FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2 FOR UPDATE', tbl)
           INTO held USING job_id, scope;
        removed := held.job_id IS NOT NULL;
        EXIT WHEN removed;
    END LOOP;
    IF removed AND held.lease_expires_at IS NOT NULL AND held.lease_expires_at >= clock_timestamp() THEN
        PERFORM dedup._raise('55006',
            format('dedup.forget: job %L in scope %L is leased until %s: its effect may be running',
                   job_id, scope, held.lease_expires_at),
            'Forget it once the lease has ended (dedup.lease says busy until then), or after its holder '
            'released it (dedup.release_lease) or completed it (dedup.complete).');
    END IF;
    IF removed THEN
        EXECUTE format('DELETE FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2', tbl)
          USING job_id, scope;
    END IF;
    INSERT INTO dedup.forgotten (scope, job_id, forgotten_at, forgotten_by, removed, claimed_at)
    VALUES (scope, job_id, now(), dedup._caller(), removed, held.processed_at);
    RETURN removed;
END
$$;
CREATE FUNCTION dedup.forget(job_id pg_catalog.int8, scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$ SELECT dedup.forget(job_id::pg_catalog.text, scope) $$;
CREATE FUNCTION dedup.forget(job_id pg_catalog.uuid, scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$ SELECT dedup.forget(job_id::pg_catalog.text, scope) $$;
REVOKE ALL ON FUNCTION dedup.forget(pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup.forget(pg_catalog.int8, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup.forget(pg_catalog.uuid, pg_catalog.text) FROM PUBLIC;
COMMENT ON FUNCTION dedup.forget(pg_catalog.text, pg_catalog.text) IS
'Remove the claim of a done job so that it runs again (after a bug fix); refuses a running lease (55006). Returns whether a claim was removed; every call leaves a row in dedup.forgotten. Not granted to PUBLIC.';
COMMENT ON FUNCTION dedup.forget(pg_catalog.int8, pg_catalog.text) IS
'dedup.forget for a bigint job id (its decimal text).';
COMMENT ON FUNCTION dedup.forget(pg_catalog.uuid, pg_catalog.text) IS
'dedup.forget for a uuid job id (its canonical text).';
