-- dedup 0.6.0: operating retention safely (issue 15). sql/dedup--0.5.0--0.6.0.sql makes the
-- same changes for an upgrade (a test compares the two catalogs).
--
-- dedup.stats gains the ages of the claims duplicates hit (largest, histogram, and the
-- copies past half their scope's retention) and the waits for concurrent holders;
-- dedup.table_health() reports live claims, the oldest claim and the last prune pass per
-- scope; dedup.forget() removes a done claim on purpose and leaves an audit row in
-- dedup.forgotten, which pruning keeps for the scope's retention.

-- The view, with stats_counters()'s new columns after the old ones.
CREATE OR REPLACE VIEW dedup.stats AS
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
           c.batches, c.advances
      FROM dedup.stats_counters() AS c
      LEFT JOIN dedup._prune_status AS p
             ON c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
            AND p.scope OPERATOR(pg_catalog.=) c.scope
      LEFT JOIN dedup._live_claims_estimate() AS e
             ON c.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
            AND e.scope OPERATOR(pg_catalog.=) c.scope;
COMMENT ON VIEW dedup.stats IS
    'Claims won, duplicates skipped, busy and fingerprint mismatches per database, scope and consumer (needs shared_preload_libraries = ''dedup''); the ages of the claims duplicates hit and the waits for concurrent holders; prune columns and retention for this database.';
REVOKE ALL ON TABLE dedup.stats FROM PUBLIC;
GRANT SELECT ON TABLE dedup.stats TO pg_monitor;

-- cluster_stats() returns dedup.stats's columns: made again with the new ones.
DROP FUNCTION dedup.cluster_stats();
CREATE FUNCTION dedup.cluster_stats()
RETURNS TABLE (
    nodename pg_catalog.text, nodeport pg_catalog.int4,
    datname pg_catalog.text, scope pg_catalog.text, consumer pg_catalog.text,
    claims pg_catalog.int8, duplicates pg_catalog.int8, busy pg_catalog.int8,
    fingerprint_mismatches pg_catalog.int8,
    last_claim_at pg_catalog.timestamptz, last_duplicate_at pg_catalog.timestamptz,
    rows_pruned pg_catalog.int8, last_pruned_at pg_catalog.timestamptz,
    live_claims_estimate pg_catalog.int8,
    late_duplicates pg_catalog.int8, duplicate_age_max pg_catalog.interval,
    duplicate_age_avg pg_catalog.interval, duplicate_ages pg_catalog.int8[],
    waits pg_catalog.int8, wait_time pg_catalog.interval, wait_max pg_catalog.interval,
    retention pg_catalog.interval, batches pg_catalog.int8, advances pg_catalog.int8)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'dedup.cluster_stats: Citus is not installed in this database',
            HINT = 'On a single server, read dedup.stats.';
    END IF;
    FOR r IN EXECUTE $q$
        SELECT n.nodename::pg_catalog.text AS nodename, n.nodeport, x.success, x.result
          FROM pg_catalog.run_command_on_all_nodes(
                   $c$SELECT COALESCE(pg_catalog.json_agg(s), '[]') FROM dedup.stats AS s$c$) AS x
          JOIN pg_catalog.pg_dist_node AS n ON n.nodeid OPERATOR(pg_catalog.=) x.nodeid
         ORDER BY n.nodeid $q$
    LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION USING ERRCODE = '58000',
                MESSAGE = pg_catalog.format('dedup.cluster_stats: node %s:%s did not answer: %s',
                                            r.nodename, r.nodeport, r.result),
                HINT = 'Check that node, and that this role may read dedup.stats there (pg_monitor).';
        END IF;
        RETURN QUERY
            SELECT r.nodename, r.nodeport, s.*
              FROM pg_catalog.json_populate_recordset(NULL::dedup.stats, r.result::pg_catalog.json) AS s
             ORDER BY s.datname, s.scope, s.consumer;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION dedup.cluster_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.cluster_stats() TO pg_monitor;
COMMENT ON FUNCTION dedup.cluster_stats() IS
'On Citus: dedup.stats of every node of the cluster (each node counts the claims made through it).';

-- dedup.lease as in 0.5.0, plus the second form of its statement for a claim table Citus
-- distributes (the time read into a variable first, as complete and extend_lease do in
-- sql/citus.sql), and passing the time of the claim a done or busy call found, for the
-- duplicate ages.
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
    t     timestamptz;
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
    IF dedup._distributed() THEN
        t := clock_timestamp();
        INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint, lease_id, lease_expires_at)
        VALUES (scope, job_id, now(), fingerprint, gen_random_uuid(), t + d)
        ON CONFLICT ON CONSTRAINT processed_pkey DO UPDATE
            SET processed_at = excluded.processed_at,
                fingerprint = coalesce(excluded.fingerprint, p.fingerprint),
                lease_id = excluded.lease_id,
                lease_expires_at = excluded.lease_expires_at
            WHERE p.lease_expires_at < t
              AND (p.fingerprint IS NULL OR excluded.fingerprint IS NULL OR p.fingerprint = excluded.fingerprint)
        RETURNING p.lease_id, p.lease_expires_at, p.processed_at INTO lease_id, expires_at, claimed_at;
    ELSE
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
    END IF;
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
    PERFORM dedup._count(scope, status, claimed_at);
END
$$;

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
    removed boolean;
BEGIN
    PERFORM dedup._check_claim('dedup.forget', job_id, scope, NULL);
    -- Locked until we commit: a concurrent claim of the job waits for the forget.
    SELECT * INTO held FROM dedup.processed AS p
     WHERE p.job_id = forget.job_id AND p.scope = forget.scope
       FOR UPDATE;
    removed := FOUND;
    IF removed AND held.lease_expires_at IS NOT NULL AND held.lease_expires_at >= clock_timestamp() THEN
        PERFORM dedup._raise('55006',
            format('dedup.forget: job %L in scope %L is leased until %s: its effect may be running',
                   job_id, scope, held.lease_expires_at),
            'Forget it once the lease has ended (dedup.lease says busy until then), or after its holder '
            'released it (dedup.release_lease) or completed it (dedup.complete).');
    END IF;
    IF removed THEN
        DELETE FROM dedup.processed AS p WHERE p.job_id = forget.job_id AND p.scope = forget.scope;
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
REVOKE ALL ON FUNCTION dedup._caller() FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._count(pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION dedup.forget(pg_catalog.text, pg_catalog.text) IS
'Remove the claim of a done job so that it runs again (after a bug fix); refuses a running lease (55006). Returns whether a claim was removed; every call leaves a row in dedup.forgotten. Not granted to PUBLIC.';
COMMENT ON FUNCTION dedup.forget(pg_catalog.int8, pg_catalog.text) IS
'dedup.forget for a bigint job id (its decimal text).';
COMMENT ON FUNCTION dedup.forget(pg_catalog.uuid, pg_catalog.text) IS
'dedup.forget for a uuid job id (its canonical text).';

-- A NULL lease_id is named (22004) by release_lease too, as by complete and extend_lease,
-- instead of reported as a lost lease; and a lease_id that is not the holder's is not
-- reported as one that expired, and a job never leased says so (found writing
-- docs/reference/, issue 16).
CREATE OR REPLACE FUNCTION dedup._lease_lost(func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text, lease_id pg_catalog.uuid)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held dedup.processed;
BEGIN
    SELECT * INTO held FROM dedup.processed AS p WHERE p.job_id = _lease_lost.job_id AND p.scope = _lease_lost.scope;
    RETURN dedup._raise('YD002',
        format('%s: lease %s on job %L in scope %L is not held: %s', func, lease_id, job_id, scope,
            CASE
                WHEN NOT FOUND THEN 'there is no lease on the job (never leased, released, or pruned)'
                WHEN held.lease_id IS DISTINCT FROM lease_id AND held.lease_expires_at IS NULL
                    THEN 'the job is done, by another claim'
                WHEN held.lease_id IS DISTINCT FROM lease_id
                    THEN 'the job is leased under another lease_id (this one expired and another '
                         'caller took the job over, or it is not the lease_id dedup.lease returned)'
                ELSE 'the lease was completed already'
            END),
        'Do not complete, extend or release a lease you no longer hold; if the effect happened, '
        'the job''s idempotency key at the external system is what stops a repeat.');
END
$$;

CREATE OR REPLACE FUNCTION dedup.release_lease(
    job_id   pg_catalog.text,
    lease_id pg_catalog.uuid,
    scope    pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._check_claim('dedup.release_lease', job_id, scope, NULL);
    IF lease_id IS NULL THEN
        PERFORM dedup._raise('22004', 'dedup.release_lease: lease_id must not be NULL',
                             'Pass the lease_id that dedup.lease returned with status ''acquired''.');
    END IF;
    DELETE FROM dedup.processed AS p
     WHERE p.job_id = release_lease.job_id AND p.scope = release_lease.scope
       AND p.lease_id = release_lease.lease_id AND p.lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        PERFORM dedup._lease_lost('dedup.release_lease', job_id, scope, lease_id);
    END IF;
END
$$;

-- dedup 0.6.0: a claim is kept its retention from when it became visible (issue 24,
-- finding 5). sql/dedup--0.5.0--0.6.0.sql makes the same changes for an upgrade.
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

-- Where the worker's last pass over all scopes stopped when its share of time ran out
-- (issue 24, finding 6: a database is visited at most a minute, or one prune interval if
-- shorter, at a time, and the next visit goes on from there); NULL after a whole pass.
ALTER TABLE dedup._prune_status
    ADD COLUMN resume_target pg_catalog.text,
    ADD COLUMN resume_block  pg_catalog.int8;
