-- dedup 0.6.0: scale-out on Citus (issue 13). sql/dedup--0.5.0--0.6.0.sql makes the same
-- changes for an upgrade (a test compares the two catalogs).
--
-- dedup.distribute() makes dedup.processed a Citus distributed table (by job_id) and
-- dedup.scope_retention a reference table. From then on every node's claims are
-- statements Citus routes to the job's shard (src/citus.rs), and each node's worker prunes
-- the shard placements it holds.

-- claim_result reads through dedup._claim_result: as the owner on PostgreSQL, as the caller
-- on Citus (whose connections are per role: a shard this transaction wrote as the caller
-- cannot be read as another role in the same transaction).
CREATE OR REPLACE FUNCTION dedup.claim_result(
    job_id pg_catalog.text,
    scope  pg_catalog.text DEFAULT 'default',
    OUT result     pg_catalog.jsonb,
    OUT claimed_at pg_catalog.timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.result, r.claimed_at FROM dedup._claim_result(job_id, scope) AS r
$$;
REVOKE ALL ON FUNCTION dedup._claim_result(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

-- complete and extend_lease as in 0.5.0, plus a second form of their one statement for a
-- claim table Citus distributes: Citus accepts no volatile function in the WHERE of an ON
-- CONFLICT or an UPDATE of a distributed table, so there the time is read into a variable
-- just before the statement (a wait for a row lock then comes after it). On one server the
-- statements are exactly 0.5.0's. dedup.lease gets the same second form in
-- sql/operations.sql, which also makes it pass the claim's time to dedup._count.
CREATE OR REPLACE FUNCTION dedup.complete(
    job_id   pg_catalog.text,
    lease_id pg_catalog.uuid,
    result   pg_catalog.jsonb DEFAULT NULL,
    scope    pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t timestamptz;
BEGIN
    PERFORM dedup._check_claim('dedup.complete', job_id, scope, NULL);
    IF lease_id IS NULL THEN
        PERFORM dedup._raise('22004', 'dedup.complete: lease_id must not be NULL',
                             'Pass the lease_id that dedup.lease returned with status ''acquired''.');
    END IF;
    -- Done from now on: processed_at becomes the moment the job was done, which retention
    -- counts from, so it stays done for its scope's whole retention after this.
    IF dedup._distributed() THEN
        t := clock_timestamp();
        UPDATE dedup.processed AS p
           SET lease_expires_at = NULL, result = complete.result, processed_at = t
         WHERE p.job_id = complete.job_id AND p.scope = complete.scope
           AND p.lease_id = complete.lease_id AND p.lease_expires_at IS NOT NULL;
    ELSE
        UPDATE dedup.processed AS p
           SET lease_expires_at = NULL, result = complete.result, processed_at = clock_timestamp()
         WHERE p.job_id = complete.job_id AND p.scope = complete.scope
           AND p.lease_id = complete.lease_id AND p.lease_expires_at IS NOT NULL;
    END IF;
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
    t     timestamptz;
BEGIN
    PERFORM dedup._check_claim('dedup.extend_lease', job_id, scope, NULL);
    IF lease_id IS NULL THEN
        PERFORM dedup._raise('22004', 'dedup.extend_lease: lease_id must not be NULL',
                             'Pass the lease_id that dedup.lease returned with status ''acquired''.');
    END IF;
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
    IF dedup._distributed() THEN
        t := clock_timestamp();
        UPDATE dedup.processed AS p SET lease_expires_at = t + d
         WHERE p.job_id = extend_lease.job_id AND p.scope = extend_lease.scope
           AND p.lease_id = extend_lease.lease_id AND p.lease_expires_at IS NOT NULL
        RETURNING p.lease_expires_at INTO until;
    ELSE
        UPDATE dedup.processed AS p SET lease_expires_at = clock_timestamp() + d
         WHERE p.job_id = extend_lease.job_id AND p.scope = extend_lease.scope
           AND p.lease_id = extend_lease.lease_id AND p.lease_expires_at IS NOT NULL
        RETURNING p.lease_expires_at INTO until;
    END IF;
    IF NOT FOUND THEN
        PERFORM dedup._lease_lost('dedup.extend_lease', job_id, scope, lease_id);
    END IF;
    RETURN until;
END
$$;

CREATE FUNCTION dedup.distribute(
    colocate_with pg_catalog.text DEFAULT 'default',
    shard_count   pg_catalog.int4 DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held pg_catalog.text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus') THEN
        PERFORM dedup._raise('55000', 'dedup.distribute: Citus is not installed in this database',
            'Put citus first in shared_preload_libraries (shared_preload_libraries = ''citus,dedup''), '
            'CREATE EXTENSION citus, add the worker nodes, then call dedup.distribute() on the coordinator.');
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user,
            (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'dedup.processed'::pg_catalog.regclass),
            'USAGE') THEN
        PERFORM dedup._raise('42501', 'dedup.distribute: only the owner of the extension can distribute its tables',
            'Call it as the role that created the extension (or a superuser).');
    END IF;
    EXECUTE 'SELECT g.groupid OPERATOR(pg_catalog.<>) 0 FROM pg_catalog.pg_dist_local_group AS g' INTO held;
    IF held::bool THEN
        PERFORM dedup._raise('55000', 'dedup.distribute: this node is a Citus worker',
            'Call dedup.distribute() on the coordinator.');
    END IF;
    SELECT d.partmethod::pg_catalog.text INTO held FROM pg_catalog.pg_dist_partition AS d
     WHERE d.logicalrelid = 'dedup.processed'::pg_catalog.regclass;
    IF held = 'h' THEN
        RAISE NOTICE 'dedup.distribute: dedup.processed is already distributed; nothing to do';
        RETURN;
    ELSIF held IS NOT NULL THEN
        PERFORM dedup._raise('55000',
            pg_catalog.format('dedup.distribute: dedup.processed is already a Citus table of another kind (partmethod %s)', held),
            'dedup routes claims only on a table distributed by job_id: undo it with '
            'SELECT undistribute_table(''dedup.processed''), then call dedup.distribute().');
    END IF;
    -- A claim taken on a worker before now sits in that worker's local table, which
    -- becomes an unread shell: Citus cannot move it. Refuse rather than lose it.
    SELECT pg_catalog.string_agg(pg_catalog.format('%s:%s (%s)', n.nodename, n.nodeport, r.result), ', ')
      INTO held
      FROM pg_catalog.run_command_on_workers(
               'SELECT pg_catalog.count(*) FROM ONLY dedup.processed') AS r
      JOIN pg_catalog.pg_dist_node AS n ON n.nodename = r.nodename AND n.nodeport = r.nodeport
     WHERE NOT r.success OR r.result <> '0';
    IF held IS NOT NULL THEN
        PERFORM dedup._raise('55000',
            pg_catalog.format('dedup.distribute: workers hold claims of their own that Citus cannot move: %s', held),
            'Those claims were taken on a worker before distribution (or the worker did not answer). '
            'Let them expire (dedup.prune() on that worker) or copy them to the coordinator''s '
            'dedup.processed, then call dedup.distribute() again.');
    END IF;
    PERFORM pg_catalog.create_reference_table('dedup.scope_retention');
    PERFORM pg_catalog.truncate_local_data_after_distributing_table('dedup.scope_retention');
    -- On Citus a consumer's claim, set_result and claim_result run as the consumer, which
    -- holds column grants on dedup.processed (docs/citus.md). Row-level security narrows
    -- them to its own claims: it stores a result only on a claim its own transaction made,
    -- and stamps a claim no later than 24 hours ahead (never pruned otherwise; hours, not a
    -- day: no time zone arithmetic, which cost a fifth of an INSERT's speed). A role that may
    -- DELETE claims (the extension's owner, dedup.prune_role) may lock any of them, as a
    -- prune pass does. The owner and superusers are not subject to it (no FORCE). Citus
    -- copies the policies to every shard, where each is checked again as the caller.
    DROP POLICY IF EXISTS claims_select ON dedup.processed;
    DROP POLICY IF EXISTS claims_insert ON dedup.processed;
    DROP POLICY IF EXISTS claims_update ON dedup.processed;
    DROP POLICY IF EXISTS claims_delete ON dedup.processed;
    CREATE POLICY claims_select ON dedup.processed FOR SELECT USING (true);
    CREATE POLICY claims_insert ON dedup.processed FOR INSERT
        WITH CHECK (processed_at OPERATOR(pg_catalog.<=)
                    (pg_catalog.now() OPERATOR(pg_catalog.+) '24:00:00'::pg_catalog.interval));
    CREATE POLICY claims_update ON dedup.processed FOR UPDATE
        USING (pg_catalog.has_table_privilege(tableoid, 'DELETE')
               OR dedup._written_here(tableoid, ctid))
        WITH CHECK (true);
    CREATE POLICY claims_delete ON dedup.processed FOR DELETE USING (true);
    ALTER TABLE dedup.processed ENABLE ROW LEVEL SECURITY;
    IF shard_count IS NULL THEN
        PERFORM pg_catalog.create_distributed_table('dedup.processed', 'job_id',
                                                    colocate_with => colocate_with);
    ELSE
        PERFORM pg_catalog.create_distributed_table('dedup.processed', 'job_id',
                                                    colocate_with => colocate_with, shard_count => shard_count);
    END IF;
    PERFORM pg_catalog.truncate_local_data_after_distributing_table('dedup.processed');
END
$$;
REVOKE ALL ON FUNCTION dedup.distribute(pg_catalog.text, pg_catalog.int4) FROM PUBLIC;
COMMENT ON FUNCTION dedup.distribute(pg_catalog.text, pg_catalog.int4) IS
'On a Citus coordinator: distribute dedup.processed by job_id (colocated with colocate_with) and make dedup.scope_retention a reference table. Claims are then routed to the job''s shard from every node.';

-- Every node's dedup.stats, through Citus. Runs as the caller on each node (pg_monitor
-- there reads dedup.stats).
CREATE FUNCTION dedup.cluster_stats()
RETURNS TABLE (
    nodename pg_catalog.text, nodeport pg_catalog.int4,
    datname pg_catalog.text, scope pg_catalog.text, consumer pg_catalog.text,
    claims pg_catalog.int8, duplicates pg_catalog.int8, busy pg_catalog.int8,
    fingerprint_mismatches pg_catalog.int8,
    last_claim_at pg_catalog.timestamptz, last_duplicate_at pg_catalog.timestamptz,
    rows_pruned pg_catalog.int8, last_pruned_at pg_catalog.timestamptz,
    live_claims_estimate pg_catalog.int8)
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
