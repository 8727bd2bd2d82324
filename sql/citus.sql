-- dedup on Citus.
--
-- dedup.distribute() makes dedup.processed a Citus distributed table (by job_id) and
-- dedup.scope_retention a reference table. From then on every node's claims are
-- statements Citus routes to the job's shard (src/citus.rs), and each node's worker prunes
-- the shard placements it holds.

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
    -- Claims routed by Citus go to the distributed dedup.processed and never look in a
    -- generation: a copy of a job claimed in one would be claimed again. SHARE mode, to the
    -- end of this transaction: a dedup.use_generations() under way (it inserts into the
    -- catalog) is waited for and seen by the next statement's snapshot, which READ
    -- COMMITTED takes after the wait (REPEATABLE READ's was taken before: refused); one that
    -- comes after waits, then sees the citus extension and refuses.
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        PERFORM dedup._raise('55000',
            pg_catalog.format('dedup.distribute: run it in a READ COMMITTED transaction, not %s',
                              pg_catalog.current_setting('transaction_isolation')),
            'Its check that the database uses no generations must see what committed while it '
            'waited: call it in BEGIN ISOLATION LEVEL READ COMMITTED, or with '
            'default_transaction_isolation = ''read committed''.');
    END IF;
    LOCK TABLE dedup.generations IN SHARE MODE;
    IF EXISTS (SELECT FROM dedup.generations) THEN
        PERFORM dedup._raise('55000', 'dedup.distribute: this database uses generations (dedup.use_generations())',
            'Generations are not available on Citus yet, and a database that uses them keeps them: '
            'distribute the claims of a database that does not use generations.');
    END IF;
    -- Nor may a worker's database use generations (turned on before the citus extension
    -- was created there): its claims would be routed past them.
    SELECT pg_catalog.string_agg(pg_catalog.format('%s:%s', n.nodename, n.nodeport), ', ')
      INTO held
      FROM pg_catalog.run_command_on_workers(
               'SELECT pg_catalog.count(*) FROM dedup.generations') AS r
      JOIN pg_catalog.pg_dist_node AS n ON n.nodename = r.nodename AND n.nodeport = r.nodeport
     WHERE r.success AND r.result <> '0';
    IF held IS NOT NULL THEN
        PERFORM dedup._raise('55000',
            pg_catalog.format('dedup.distribute: workers use generations: %s', held),
            'Generations are not available on Citus yet, and a database that uses them keeps them: '
            'distribute the claims of a database that does not use generations.');
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
    live_claims_estimate pg_catalog.int8,
    late_duplicates pg_catalog.int8, duplicate_age_max pg_catalog.interval,
    duplicate_age_avg pg_catalog.interval, duplicate_ages pg_catalog.int8[],
    waits pg_catalog.int8, wait_time pg_catalog.interval, wait_max pg_catalog.interval,
    retention pg_catalog.interval, batches pg_catalog.int8, advances pg_catalog.int8,
    expired_duplicates pg_catalog.int8, last_expired_duplicate_at pg_catalog.timestamptz,
    expired_duplicate_after_max pg_catalog.interval, expired_duplicates_expected pg_catalog.float8,
    unsummarised_probes pg_catalog.int8, summary_false_positives pg_catalog.int8)
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

