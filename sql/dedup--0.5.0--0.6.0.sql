-- Made by scripts/upgrade-script.py from sql/upgrade/0.6.0.sql: edit the recipe, not this file.
-- dedup 0.5.0 -> 0.6.0: scale-out on Citus, operating retention (duplicate ages, waits,
-- table_health, forget), a claim kept its retention from when it became visible, batch
-- claims and offsets per partition. Keeps every claim.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.6.0'" to load this file. \quit

-- The library's new functions.
CREATE  FUNCTION "try_claim_many"(
	"job_ids" TEXT[],
	"scope" TEXT DEFAULT 'default'
) RETURNS SETOF TEXT
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'try_claim_many_text_wrapper';
CREATE  FUNCTION "try_claim_many"(
	"job_ids" bigint[],
	"scope" TEXT DEFAULT 'default'
) RETURNS SETOF bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'try_claim_many_bigint_wrapper';
CREATE  FUNCTION "try_claim_many"(
	"job_ids" uuid[],
	"scope" TEXT DEFAULT 'default'
) RETURNS SETOF uuid
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'try_claim_many_uuid_wrapper';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.int8[], pg_catalog.text) IS
'dedup.try_claim_many for bigint job ids (the same jobs as their decimal text).';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.text[], pg_catalog.text) IS
'Claim a batch of jobs for the current transaction: the ids claimed now (each once, in array order); the others were done or claimed before. Claims in key order, so overlapping batches never deadlock each other. At most 10000 ids.';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.uuid[], pg_catalog.text) IS
'dedup.try_claim_many for uuid job ids (the same jobs as their canonical text).';
CREATE  FUNCTION "_try_claim_many_fp"(
	"job_ids" TEXT[],
	"scope" TEXT,
	"fingerprints" TEXT[]
) RETURNS TABLE (
	"job_id" TEXT,
	"mismatch" bool
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'try_claim_many_fingerprint_wrapper';
CREATE  FUNCTION "_check_offset"(
	"func" TEXT,
	"stream" TEXT,
	"partition" INT,
	"position" bigint
) RETURNS void
VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'check_offset_wrapper';
CREATE  FUNCTION "_claim_result"(
	"job_id" TEXT,
	"scope" TEXT
) RETURNS TABLE (
	"result" jsonb,
	"claimed_at" timestamp with time zone
)
STABLE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'claim_result_row_wrapper';
CREATE  FUNCTION "_distributed"() RETURNS bool
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'distributed_wrapper';
CREATE  FUNCTION "_written_here"(
	"rel" oid,
	"row" tid
) RETURNS bool
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'written_here_wrapper';
CREATE  FUNCTION "_caller"() RETURNS TEXT
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'caller_wrapper';
REVOKE ALL ON FUNCTION dedup._caller() FROM PUBLIC;
CREATE  FUNCTION "_count"(
	"scope" TEXT,
	"event" TEXT,
	"claimed_at" timestamp with time zone
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'count_event_at_wrapper';

-- dedup.stats_counters() has new columns: the view on it is made again below.
DROP VIEW dedup.stats;
DROP FUNCTION dedup.stats_counters();
CREATE  FUNCTION "stats_counters"() RETURNS TABLE (
	"datname" TEXT,
	"scope" TEXT,
	"consumer" TEXT,
	"claims" bigint,
	"duplicates" bigint,
	"busy" bigint,
	"fingerprint_mismatches" bigint,
	"last_claim_at" timestamp with time zone,
	"last_duplicate_at" timestamp with time zone,
	"late_duplicates" bigint,
	"duplicate_age_sum" interval,
	"duplicate_age_max" interval,
	"duplicate_ages" bigint[],
	"waits" bigint,
	"wait_time" interval,
	"wait_max" interval,
	"batches" bigint,
	"advances" bigint,
	"expired_duplicates" bigint,
	"last_expired_duplicate_at" timestamp with time zone,
	"expired_duplicate_after_max" interval,
	"expired_duplicates_expected" double precision
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_counters_wrapper';
REVOKE ALL ON FUNCTION dedup.stats_counters() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.stats_counters() TO pg_monitor;
COMMENT ON FUNCTION dedup.stats_counters() IS
    'The counters behind dedup.stats, for every database.';
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
           c.expired_duplicates_expected
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
REVOKE ALL ON FUNCTION dedup._count(pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz) FROM PUBLIC;

-- Copies that ran again after their claim expired: the summaries of pruned claims, and the
-- retention each scope needs.
CREATE  FUNCTION "expired_summaries"() RETURNS TABLE (
	"slot" INT,
	"current" bool,
	"started" timestamp with time zone,
	"last_pruned_at" timestamp with time zone,
	"in_lookback" bool,
	"keys" bigint,
	"not_kept" bigint,
	"capacity" bigint,
	"expired_from" timestamp with time zone,
	"expired_until" timestamp with time zone,
	"databases" oid[],
	"false_positive_rate" double precision
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'expired_summaries_wrapper';
REVOKE ALL ON FUNCTION dedup.expired_summaries() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.expired_summaries() TO pg_monitor;
COMMENT ON FUNCTION dedup.expired_summaries() IS
    'The summaries of pruned claims that count expired duplicates (needs shared_preload_libraries = ''dedup''), newest first: their keys, the keys they could not take, their expiry range, databases and false-positive rate.';

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

-- Leases and stored results on Citus, and the claim's time for the duplicate ages.
-- A lease, in a short transaction of its own before an external effect. Its one statement
-- has a second form for a claim table Citus distributes: Citus accepts no volatile function
-- in the WHERE of an ON CONFLICT or an UPDATE of a distributed table, so there the time is
-- read into a variable just before the statement (a wait for a row lock then comes after
-- it); on one server the statement reads clock_timestamp() itself. complete and
-- extend_lease do the same. A done or busy call passes the time of the claim it found to
-- dedup._count, for the duplicate ages of dedup.stats.
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
COMMENT ON FUNCTION dedup.lease(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text) IS
'Lease a job before an external effect: status acquired (you hold it until expires_at), done (skip it; here is its result) or busy (leave the message unacknowledged).';

-- The holder's lease on a job: held (or expired but not taken over) and not yet done.
-- Raises YD002 otherwise, saying what happened to it: a lease_id that is not the holder's
-- is not reported as one that expired, and a job never leased says so.
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
REVOKE ALL ON FUNCTION dedup._lease_lost(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.uuid) FROM PUBLIC;

-- A completed lease is done from its completion: retention counts from there. A NULL
-- lease_id is named (22004) by complete, extend_lease and release_lease, instead of
-- reported as a lost lease.
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
COMMENT ON FUNCTION dedup.complete(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb, pg_catalog.text) IS
'Mark a leased job done, with its result; raises YD002 if the lease is no longer held.';

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
COMMENT ON FUNCTION dedup.extend_lease(pg_catalog.text, pg_catalog.uuid, pg_catalog.interval, pg_catalog.text) IS
'Extend a held lease (heartbeat); returns the new expiry; raises YD002 if it is no longer held.';
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
COMMENT ON FUNCTION dedup.release_lease(pg_catalog.text, pg_catalog.uuid, pg_catalog.text) IS
'Give a held lease back after a failure, so a retry need not wait for it to expire.';

-- For a job that is done: the result stored with it and when it was claimed. No row for a
-- job that is not done (never claimed, leased and not completed, or pruned).
-- It reads through dedup._claim_result: as the owner on PostgreSQL, as the caller on Citus
-- (whose connections are per role: a shard this transaction wrote as the caller cannot be
-- read as another role in the same transaction).
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
COMMENT ON FUNCTION dedup.claim_result(pg_catalog.text, pg_catalog.text) IS
'For a job that is done: the result stored with it and when it was claimed.';
REVOKE ALL ON FUNCTION dedup._claim_result(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

-- Citus.
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
    live_claims_estimate pg_catalog.int8,
    late_duplicates pg_catalog.int8, duplicate_age_max pg_catalog.interval,
    duplicate_age_avg pg_catalog.interval, duplicate_ages pg_catalog.int8[],
    waits pg_catalog.int8, wait_time pg_catalog.interval, wait_max pg_catalog.interval,
    retention pg_catalog.interval, batches pg_catalog.int8, advances pg_catalog.int8,
    expired_duplicates pg_catalog.int8, last_expired_duplicate_at pg_catalog.timestamptz,
    expired_duplicate_after_max pg_catalog.interval, expired_duplicates_expected pg_catalog.float8)
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

-- Operating retention: table_health, forget and its audit table, the horizons.
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
COMMENT ON FUNCTION dedup.forget(pg_catalog.text, pg_catalog.text) IS
'Remove the claim of a done job so that it runs again (after a bug fix); refuses a running lease (55006). Returns whether a claim was removed; every call leaves a row in dedup.forgotten. Not granted to PUBLIC.';
COMMENT ON FUNCTION dedup.forget(pg_catalog.int8, pg_catalog.text) IS
'dedup.forget for a bigint job id (its decimal text).';
COMMENT ON FUNCTION dedup.forget(pg_catalog.uuid, pg_catalog.text) IS
'dedup.forget for a uuid job id (its canonical text).';

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

-- Where the worker's last pass over all scopes stopped when its share of time ran out
-- (sql/retention.sql, dedup._prune_status).
ALTER TABLE dedup._prune_status
    ADD COLUMN resume_target pg_catalog.text,
    ADD COLUMN resume_block  pg_catalog.int8;

-- Offsets per partition, and try_claim_many with fingerprints.
CREATE TABLE dedup.offsets (
    stream      pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    partition   pg_catalog.int4 NOT NULL,
    "position"  pg_catalog.int8 NOT NULL,
    advanced_at pg_catalog.timestamptz NOT NULL,
    owner       pg_catalog.regrole NOT NULL,
    CONSTRAINT offsets_pkey PRIMARY KEY (stream, partition)
);
COMMENT ON TABLE dedup.offsets IS
    'The position of each partition of an ordered log, raised by dedup.advance in the transaction of the effects.';
COMMENT ON COLUMN dedup.offsets.owner IS
    'The role whose members (and superusers) may advance the partition: the role that first advanced its stream.';
REVOKE ALL ON TABLE dedup.offsets FROM PUBLIC;
GRANT SELECT ON TABLE dedup.offsets TO pg_monitor;
SELECT pg_catalog.pg_extension_config_dump('dedup.offsets', '');

-- Who may advance (stream, partition): a role with the privileges of the partition's owner
-- (pg_has_role USAGE: the owner, a member of it, a superuser); for a partition the stream
-- does not have yet, of the owner of every partition it has. Anyone else is refused
-- (42501), so no role moves another's marks (advance(stream, 0, 9223372036854775807) made
-- every later entry of a partition "done" for ever). Returns the owner the partition's row
-- has or gets: a new partition takes the owner of the stream's lowest partition, a new
-- stream its caller (dedup._caller(): the session's role, or the role of SET ROLE). The
-- first partitions of a new stream are made one transaction at a time (an advisory lock on
-- the stream's name, held to the end of the transaction), so that at READ COMMITTED a role
-- racing the owner's first advance waits and then sees the owner's row; at SERIALIZABLE
-- the read of the stream's rows conflicts instead (40001). At REPEATABLE READ a snapshot
-- taken before the owner's first advance committed does not see it: such a role can then
-- make another partition of the new stream, as it could have made the stream first, and
-- each is then refused the other's partitions and any new one (42501), never told that
-- an entry is done.
-- dedup.advance checks again in its ON CONFLICT DO UPDATE (the row it updates, locked):
-- an owner changed or a row made by another role since this read is refused there. Not
-- granted: dedup.advance calls it as the extension's owner; every name is qualified.
CREATE FUNCTION dedup._offset_owner(stream pg_catalog.text, partition pg_catalog.int4, caller pg_catalog.name)
RETURNS pg_catalog.regrole
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    held_by    pg_catalog.regrole;
    refused_at pg_catalog.int4;
BEGIN
    SELECT o.owner INTO held_by FROM dedup.offsets AS o
     WHERE o.stream OPERATOR(pg_catalog.=) $1 AND o.partition OPERATOR(pg_catalog.=) $2;
    IF FOUND THEN
        IF pg_catalog.pg_has_role($3, held_by::pg_catalog.oid, 'USAGE') THEN
            RETURN held_by;
        END IF;
        refused_at := $2;
    ELSE
        IF NOT EXISTS (SELECT FROM dedup.offsets AS o WHERE o.stream OPERATOR(pg_catalog.=) $1) THEN
            PERFORM pg_catalog.pg_advisory_xact_lock(
                'dedup.offsets'::pg_catalog.regclass::pg_catalog.oid::pg_catalog.int4, pg_catalog.hashtext($1));
        END IF;
        SELECT o.partition, o.owner INTO refused_at, held_by FROM dedup.offsets AS o
         WHERE o.stream OPERATOR(pg_catalog.=) $1
           AND NOT pg_catalog.pg_has_role($3, o.owner::pg_catalog.oid, 'USAGE')
         ORDER BY o.partition LIMIT 1;
        IF NOT FOUND THEN
            SELECT coalesce((SELECT o.owner FROM dedup.offsets AS o WHERE o.stream OPERATOR(pg_catalog.=) $1
                              ORDER BY o.partition LIMIT 1),
                            (SELECT r.oid::pg_catalog.regrole FROM pg_catalog.pg_roles AS r
                              WHERE r.rolname OPERATOR(pg_catalog.=) $3))
              INTO held_by;
            RETURN held_by;
        END IF;
    END IF;
    PERFORM dedup._raise('42501',
        pg_catalog.format('dedup.advance: role %s may not advance stream %L: its partition %s belongs to role %s',
                          pg_catalog.quote_ident($3), $1, refused_at, held_by),
        pg_catalog.format('Advance it as %1$s or as a member of %1$s (GRANT %1$s TO %2$s). An administrator can give '
                          'the stream to another role: UPDATE dedup.offsets SET owner = ''new_owner'' WHERE stream = %3$L.',
                          held_by, pg_catalog.quote_ident($3), $1));
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION dedup._offset_owner(pg_catalog.text, pg_catalog.int4, pg_catalog.name) FROM PUBLIC;

-- true: position is above the partition's mark, which is raised to it in the caller's
-- transaction (committed or rolled back with the effects); false: at or below it (a
-- redelivery or a rewind). A concurrent advance of the same partition waits for the other
-- transaction, then (READ COMMITTED) compares with what it committed; at REPEATABLE READ
-- or SERIALIZABLE that is a serialization failure (40001), as for any ON CONFLICT DO
-- UPDATE of a row updated since the snapshot.
CREATE FUNCTION dedup.advance(stream pg_catalog.text, partition pg_catalog.int4, "position" pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised boolean;
    me     pg_catalog.name := dedup._caller()::pg_catalog.name;
BEGIN
    PERFORM dedup._check_offset('dedup.advance', $1, $2, $3);
    -- Refused (42501) unless the caller has the privileges of the partition's owner
    -- (dedup._offset_owner); checked again on the row the update locks.
    INSERT INTO dedup.offsets AS o (stream, partition, "position", advanced_at, owner)
    VALUES ($1, $2, $3, now(), dedup._offset_owner($1, $2, me))
    ON CONFLICT ON CONSTRAINT offsets_pkey DO UPDATE
        SET "position" = excluded."position", advanced_at = excluded.advanced_at
        WHERE o."position" < excluded."position"
          AND pg_catalog.pg_has_role(me, o.owner::pg_catalog.oid, 'USAGE');
    raised := FOUND;
    IF NOT raised THEN
        -- At or below the mark, or the row changed hands since the check: refused then.
        PERFORM dedup._offset_owner($1, $2, me);
    END IF;
    PERFORM dedup._count($1, CASE WHEN raised THEN 'advance' ELSE 'stale' END);
    RETURN raised;
END
$$;
COMMENT ON FUNCTION dedup.advance(pg_catalog.text, pg_catalog.int4, pg_catalog.int8) IS
'true when position is above the stored mark of (stream, partition), which it raises in the caller''s transaction; false for a position at or below it (a redelivery or a rewind). Only a role with the privileges of the partition''s owner (dedup.offsets.owner) may advance it: 42501 for others.';

-- A batch from first_position to last_position: true when the stored mark is below
-- first_position (none of the batch is done), and then raised to last_position; false when
-- any of the batch is at or below the mark (another consumer, during a rebalance, did it
-- or part of it: read again from dedup.position). The three-argument form cannot tell a
-- batch that is partly done from one that is not.
CREATE FUNCTION dedup.advance(stream pg_catalog.text, partition pg_catalog.int4,
                              first_position pg_catalog.int8, last_position pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised boolean;
    me     pg_catalog.name := dedup._caller()::pg_catalog.name;
BEGIN
    PERFORM dedup._check_offset('dedup.advance', $1, $2, $3);
    PERFORM dedup._check_offset('dedup.advance', $1, $2, $4);
    IF $3 > $4 THEN
        PERFORM dedup._raise('22023',
            pg_catalog.format('dedup.advance: first_position %s is after last_position %s', $3, $4),
            'Pass the positions of the batch''s first and last entries.');
    END IF;
    INSERT INTO dedup.offsets AS o (stream, partition, "position", advanced_at, owner)
    VALUES ($1, $2, $4, now(), dedup._offset_owner($1, $2, me))
    ON CONFLICT ON CONSTRAINT offsets_pkey DO UPDATE
        SET "position" = excluded."position", advanced_at = excluded.advanced_at
        WHERE o."position" < $3
          AND pg_catalog.pg_has_role(me, o.owner::pg_catalog.oid, 'USAGE');
    raised := FOUND;
    IF NOT raised THEN
        PERFORM dedup._offset_owner($1, $2, me);
    END IF;
    PERFORM dedup._count($1, CASE WHEN raised THEN 'advance' ELSE 'stale' END);
    RETURN raised;
END
$$;
COMMENT ON FUNCTION dedup.advance(pg_catalog.text, pg_catalog.int4, pg_catalog.int8, pg_catalog.int8) IS
'For a batch of entries first_position..last_position: true when the stored mark is below first_position (none of it done), raising it to last_position in the caller''s transaction; false when any of it is at or below the mark. Only a role with the privileges of the partition''s owner may advance it: 42501 for others.';

-- The stored mark (NULL when none): where a consumer seeks on start.
CREATE FUNCTION dedup.position(stream pg_catalog.text, partition pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._check_offset('dedup.position', $1, $2, 0);
    RETURN (SELECT o."position" FROM dedup.offsets AS o WHERE o.stream = $1 AND o.partition = $2);
END
$$;
COMMENT ON FUNCTION dedup.position(pg_catalog.text, pg_catalog.int4) IS
'The stored mark of (stream, partition), NULL when none: where a consumer of the partition seeks on start.';

-- Every partition's stored mark of a stream, in partition order: where a consumer that is
-- given several partitions (a Kafka consumer group's rebalance) seeks each of them on
-- start, in one call instead of one dedup.position per partition.
CREATE FUNCTION dedup.positions(stream pg_catalog.text,
    OUT partition pg_catalog.int4, OUT "position" pg_catalog.int8)
RETURNS SETOF record
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._check_offset('dedup.positions', $1, 0, 0);
    RETURN QUERY SELECT o.partition, o."position" FROM dedup.offsets AS o
                  WHERE o.stream = $1 ORDER BY o.partition;
END
$$;
COMMENT ON FUNCTION dedup.positions(pg_catalog.text) IS
'Every partition''s stored mark of stream, in partition order (no row for a partition never advanced): where a consumer seeks each of its partitions on start.';
REVOKE ALL ON FUNCTION dedup._check_offset(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int8) FROM PUBLIC;

-- try_claim_many with payload fingerprints, one per job id (NULL: none): a job claimed
-- before with another fingerprint raises YD001, as try_claim(job_id, scope, fingerprint)
-- does. PL/pgSQL over the library's dedup._try_claim_many_fp, reading all of its rows
-- first: the error comes before any row, however the caller reads them.
CREATE FUNCTION dedup._claimed_or_mismatch(job_ids pg_catalog.text[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS pg_catalog.text[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    claimed    text[];
    mismatched text;
BEGIN
    SELECT array_agg(r.job_id ORDER BY r.n) FILTER (WHERE NOT r.mismatch),
           (array_agg(r.job_id ORDER BY r.n) FILTER (WHERE r.mismatch))[1]
      INTO claimed, mismatched
      FROM dedup._try_claim_many_fp(job_ids, scope, fingerprints) WITH ORDINALITY AS r(job_id, mismatch, n);
    IF mismatched IS NOT NULL THEN
        PERFORM dedup._fingerprint_mismatch('dedup.try_claim_many', mismatched, scope);
    END IF;
    RETURN coalesce(claimed, '{}');
END
$$;
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.text[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS SETOF pg_catalog.text
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT pg_catalog.unnest(dedup._claimed_or_mismatch(job_ids, scope, fingerprints))
$$;
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.int8[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS SETOF pg_catalog.int8
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT pg_catalog.unnest(dedup._claimed_or_mismatch(job_ids::pg_catalog.text[], scope, fingerprints))::pg_catalog.int8
$$;
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.uuid[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS SETOF pg_catalog.uuid
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT pg_catalog.unnest(dedup._claimed_or_mismatch(job_ids::pg_catalog.text[], scope, fingerprints))::pg_catalog.uuid
$$;
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.text[], pg_catalog.text, pg_catalog.text[]) IS
'dedup.try_claim_many with a payload fingerprint per job id (NULL: none): a job claimed before with another fingerprint raises YD001.';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.int8[], pg_catalog.text, pg_catalog.text[]) IS
'dedup.try_claim_many with fingerprints, for bigint job ids.';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.uuid[], pg_catalog.text, pg_catalog.text[]) IS
'dedup.try_claim_many with fingerprints, for uuid job ids.';
