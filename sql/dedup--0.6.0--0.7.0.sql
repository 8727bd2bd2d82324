-- Made by scripts/upgrade-script.py from sql/upgrade/0.7.0.sql: edit the recipe, not this file.
-- dedup 0.6.0 -> 0.7.0: claims in rotating generations, opt-in (issue 26, slice 1). Changes
-- no claim and no table of 0.6.0: dedup.generations starts empty, and a database uses
-- generations only once a superuser calls dedup.use_generations(). Keeps every claim.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.7.0'" to load this file. \quit

-- The library's new functions.
CREATE  FUNCTION "use_generations"() RETURNS TEXT
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'use_generations_wrapper';
CREATE  FUNCTION "rotate_generations"(
	"publish" bool DEFAULT false
) RETURNS TEXT
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'rotate_generations_wrapper';
CREATE  FUNCTION "_claim_tables"(
	"func" TEXT,
	"job_id" TEXT,
	"scope" TEXT
) RETURNS TEXT[]
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'claim_tables_sql_wrapper';
CREATE  FUNCTION "generation_summaries"() RETURNS TABLE (
	"generation" INT,
	"relid" oid,
	"summarised" bool,
	"keys" bigint,
	"bytes" bigint,
	"false_positive_rate" double precision,
	"built_at" timestamp with time zone
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'generation_summaries_wrapper';
CREATE FUNCTION "_generations_changed"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', '_generations_changed_wrapper';
CREATE  FUNCTION "_lease_tables"(
	"func" TEXT,
	"job_id" TEXT,
	"scope" TEXT,
	"fingerprint" TEXT
) RETURNS TEXT[]
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_tables_wrapper';
CREATE  FUNCTION "_write_lease"(
	"func" TEXT,
	"job_id" TEXT,
	"scope" TEXT,
	"fingerprint" TEXT,
	"result" jsonb,
	"lease_id" uuid,
	"lease_expires_at" timestamp with time zone,
	"processed_at" timestamp with time zone
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'write_lease_wrapper';
CREATE  FUNCTION "_rotate"(
	"step" TEXT
) RETURNS TEXT[]
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'rotate_step_wrapper';

-- The catalog of generations, every claim across them (dedup.claims()), and the privileges
-- and comments of the library's new functions.
-- One row per generation that exists (and generation 0 for ever once it is retired): the
-- rotation writes it, the claim path reads it through its primary key with a snapshot of
-- its own. state: current (claims go there; one per series, that is per retention in
-- force), sealing (published away from, its seal wait not done: claims in flight may still
-- insert there), sealed (no insert ever again), retired (no claim reads it; waiting for its
-- drop). waits: the transactions a seal or drop waits for, as the rotation stored them
-- ('truncated' for generation 0 once dedup.processed is truncated). retention: the series.
-- scopes: the scopes of a sealed generation's claims, once its retirement needed them.
-- routes: the scopes whose claims a current generation takes (a NULL element: every scope
-- no other current generation names), written at publication only, so that a claim looks
-- in no other series' current generation (see its comment).
CREATE TABLE dedup.generations (
    n          pg_catalog.int4 NOT NULL CHECK (n OPERATOR(pg_catalog.>=) 0),
    relname    pg_catalog.name NOT NULL,
    relid      pg_catalog.regclass NOT NULL,
    state      pg_catalog.text NOT NULL
               CHECK (state OPERATOR(pg_catalog.=) ANY
                      (ARRAY['current', 'sealing', 'sealed', 'retired']::pg_catalog.text[])),
    opened_at  pg_catalog.timestamptz NOT NULL,
    sealed_at  pg_catalog.timestamptz,
    retired_at pg_catalog.timestamptz,
    waits      pg_catalog.text,
    retention  pg_catalog.interval,
    scopes     pg_catalog.text[],
    routes     pg_catalog.text[],
    CONSTRAINT generations_pkey PRIMARY KEY (n),
    CONSTRAINT generations_relname_key UNIQUE (relname)
);
COMMENT ON TABLE dedup.generations IS
    'The generations of claims of a database that uses them (dedup.use_generations): generation 0 is dedup.processed, generation n the table dedup.processed_<n>. Written by the rotation only.';
COMMENT ON COLUMN dedup.generations.relid IS
    'The generation''s table. A regclass, not an oid: pg_dump writes it as the table''s name, so a restore into another database names the table it made there.';
COMMENT ON COLUMN dedup.generations.state IS
    'current: claims go there; sealing: published away from, its seal wait not done; sealed: no insert ever again; retired: no claim reads it, waiting for its drop (generation 0 stays retired once truncated).';
COMMENT ON COLUMN dedup.generations.retention IS
    'The series of the generation: the retention in force (dedup.retention, or a scope''s own in dedup.scope_retention) whose claims it takes, a quarter of which is its width; each retention in force has one current generation. NULL for generation 0 (dedup.processed), kept for the longest retention in force.';
COMMENT ON COLUMN dedup.generations.scopes IS
    'The scopes of the claims in a sealed generation, looked for once its series'' retention has passed while a longer one is in force: it is retired once each of these scopes'' retentions has passed. NULL: not looked for yet; a NULL element: more than 1000 scopes, kept for the longest retention in force.';
COMMENT ON COLUMN dedup.generations.routes IS
    'The scopes whose claims a current generation takes, as the rotation published them: the scopes with a retention of their own routed to its series, and a NULL element in the generation of dedup.retention''s series, which takes every scope no other current generation names. A scope leaves a series only with a publication away from that series'' current generation, so a claim looks in no other series'' current generation. Kept as it was once the generation is no longer current.';
COMMENT ON COLUMN dedup.generations.waits IS
    'The transactions the rotation''s seal or drop waits for, as it stored them (truncated: generation 0 once dedup.processed is truncated); NULL when none.';

-- Nobody but the owner reads or writes it: a row here decides where claims go.
REVOKE ALL ON TABLE dedup.generations FROM PUBLIC;
-- pg_dump dumps its rows with the extension; the generation tables are dumped as tables of
-- the schema dedup.
SELECT pg_catalog.pg_extension_config_dump('dedup.generations', '');
-- A transaction that changes a row of it (or truncates it) moves the database's epoch at
-- its commit (src/generations/epoch.rs): also pg_restore's COPY of its rows, which does not
-- come through the rotation, so that a session opened before the restore's data does not
-- keep the list "no generations". Per row, so that a restore (or the switch from the
-- portable edition) of a database that never used generations, whose COPY has no row,
-- moves nothing and takes no epoch slot. A trigger function cannot be called as a function.
CREATE TRIGGER generations_changed
    AFTER INSERT OR UPDATE OR DELETE ON dedup.generations
    FOR EACH ROW EXECUTE FUNCTION dedup._generations_changed();
CREATE TRIGGER generations_truncated
    AFTER TRUNCATE ON dedup.generations
    FOR EACH STATEMENT EXECUTE FUNCTION dedup._generations_changed();
REVOKE ALL ON FUNCTION dedup._generations_changed() FROM PUBLIC;
COMMENT ON FUNCTION dedup._generations_changed() IS
'Internal: the trigger of dedup.generations, which makes a transaction that changes it move the database''s epoch at its commit (also pg_restore''s). Not granted to PUBLIC.';

-- Every claim of this database: the rows of each generation not retired, in the order of
-- the generations (the rows within one in no particular order); dedup.processed alone in a
-- database that does not use generations. Not SECURITY DEFINER: the caller needs SELECT on
-- each generation (superusers have it). A generation dropped between the read of the catalog
-- and its own read was retired: its claims had expired, and it is left out (the
-- subtransaction that catches it is why it is PARALLEL UNSAFE).
CREATE FUNCTION dedup.claims()
RETURNS SETOF dedup.processed
LANGUAGE plpgsql STABLE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gen record;
BEGIN
    IF NOT EXISTS (SELECT FROM dedup.generations AS g) THEN
        RETURN QUERY SELECT * FROM dedup.processed;
        RETURN;
    END IF;
    FOR gen IN SELECT g.relname FROM dedup.generations AS g
                WHERE g.state <> 'retired' ORDER BY g.n LOOP
        BEGIN
            RETURN QUERY EXECUTE format('SELECT * FROM dedup.%I', gen.relname);
        EXCEPTION WHEN undefined_table THEN
            NULL;
        END;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION dedup.claims() FROM PUBLIC;
COMMENT ON FUNCTION dedup.claims() IS
'Every claim of this database, in every generation not retired (dedup.generations), in the order of the generations; dedup.processed alone where generations are not used. Not granted to PUBLIC.';

-- The tables a claim may be in, for dedup.forget (src/lease.rs): an internal function.
REVOKE ALL ON FUNCTION dedup._claim_tables(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
COMMENT ON FUNCTION dedup._claim_tables(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Internal: the checks of a claim function, then the tables a claim of the job may be in (its scope''s current generation and every sealing and sealed one, newest first, each locked in share mode; dedup.processed where generations are not used). Not granted to PUBLIC.';

-- The library's functions of the generations (src/generations/rotate.rs): a superuser's
-- only (each checks it too, 42501).
REVOKE ALL ON FUNCTION dedup.use_generations() FROM PUBLIC;
COMMENT ON FUNCTION dedup.use_generations() IS
'Turn generations on in this database: dedup.processed becomes generation 0, generation 1 takes the claims from this transaction''s commit on, and the background worker rotates them from then on. Needs shared_preload_libraries = ''dedup''; refused on Citus and in the portable edition. Superusers only; returns what it did.';
REVOKE ALL ON FUNCTION dedup.rotate_generations(pg_catalog.bool) FROM PUBLIC;
COMMENT ON FUNCTION dedup.rotate_generations(pg_catalog.bool) IS
'One step of the rotation that is due in this database (the worker''s step, by hand), or with publish => true a new generation published now; returns what it did. Superusers only.';

-- The background worker's rotation steps (src/generations/rotate.rs), run as the
-- extension's owner: not granted to PUBLIC; a dedup.prune_role that is not a superuser is
-- granted EXECUTE on it by hand (docs/retention.md, "The background worker").
REVOKE ALL ON FUNCTION dedup._rotate(pg_catalog.text) FROM PUBLIC;
COMMENT ON FUNCTION dedup._rotate(pg_catalog.text) IS
'Internal: one step of the background worker''s rotation of this database (seal, drop, retire or publish, each only if due; or summarise), as the extension''s owner; what it did. Called only by the background worker (42501 for any session). Not granted to PUBLIC: grant EXECUTE to a dedup.prune_role that is not a superuser.';

-- The summaries of the sealed generations (src/generations/summary.rs): monitoring, read by
-- pg_monitor like dedup.expired_summaries().
REVOKE ALL ON FUNCTION dedup.generation_summaries() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dedup.generation_summaries() TO pg_monitor;
COMMENT ON FUNCTION dedup.generation_summaries() IS
'The sealed generations of this database and the Bloom filter that spares a new claim each one''s index probe (summarised false: none yet, or no room in dedup.generation_memory; a claim then probes it). Granted to pg_monitor.';

-- dedup.forget finds the claim in every generation (dedup._claim_tables).
-- Remove a done claim so the job can run again. Refuses a lease that is running.
CREATE OR REPLACE FUNCTION dedup.forget(job_id pg_catalog.text, scope pg_catalog.text DEFAULT 'default')
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
REVOKE ALL ON FUNCTION dedup.forget(pg_catalog.text, pg_catalog.text) FROM PUBLIC;
COMMENT ON FUNCTION dedup.forget(pg_catalog.text, pg_catalog.text) IS
'Remove the claim of a done job so that it runs again (after a bug fix); refuses a running lease (55006). Returns whether a claim was removed; every call leaves a row in dedup.forgotten. Not granted to PUBLIC.';

-- The lease functions work in every generation (dedup._lease_tables, dedup._write_lease,
-- dedup._lease_row): a lease found in an older generation moves to the one claims go to
-- when it is taken over, extended or completed; dedup._lease_lost explains a lost lease
-- from every generation.
REVOKE ALL ON FUNCTION dedup._lease_tables(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._write_lease(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.uuid, pg_catalog.timestamptz, pg_catalog.timestamptz) FROM PUBLIC;

-- Where the database uses generations: the row of a job that complete, extend_lease or
-- release_lease change, locked until the caller commits, from every generation it may be
-- in, newest first (dedup._lease_tables), and whether it is in the generation claims go to (then it is
-- changed in place). A row moved while this looked (by a concurrent call of the holder,
-- a heartbeat's extend_lease: deleted from one generation after this looked in the newer
-- one) is looked for again with the list as it is then: up to three passes, each one
-- missing it only if the row moved again meanwhile. NULL: no row.
CREATE FUNCTION dedup._lease_row(
    func        pg_catalog.text,
    job_id      pg_catalog.text,
    scope       pg_catalog.text,
    OUT tbl      pg_catalog.text,
    OUT in_place pg_catalog.bool,
    OUT held     dedup.processed)
RETURNS record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tables text[];
BEGIN
    FOR pass IN 1..3 LOOP
        tables := dedup._lease_tables(func, job_id, scope, NULL);
        FOREACH tbl IN ARRAY tables LOOP
            EXECUTE format('SELECT * FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2 FOR UPDATE', tbl)
               INTO held USING job_id, scope;
            IF held.job_id IS NOT NULL THEN
                in_place := tbl = tables[1];
                RETURN;
            END IF;
        END LOOP;
    END LOOP;
    tbl := NULL;
END
$$;
REVOKE ALL ON FUNCTION dedup._lease_row(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;

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
    tbl  text;
BEGIN
    -- dedup.processed, or where the database uses generations every one a claim of the job
    -- may be in (its scope's current one, every sealing and sealed one).
    FOREACH tbl IN ARRAY dedup._claim_tables(func, job_id, scope) LOOP
        EXECUTE format('SELECT * FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2', tbl)
           INTO held USING job_id, scope;
        EXIT WHEN held.job_id IS NOT NULL;
    END LOOP;
    RETURN dedup._raise('YD002',
        format('%s: lease %s on job %L in scope %L is not held: %s', func, lease_id, job_id, scope,
            CASE
                WHEN held.job_id IS NULL THEN 'there is no lease on the job (never leased, released, or pruned)'
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
    d      interval;
    held   dedup.processed;
    lr     record;
    t      timestamptz;
    tables text[];
    tbl    text;
BEGIN
    -- The checks (and it loads the library, with it the setting dedup.lease_duration), and
    -- the generations' tables where the database uses them.
    tables := dedup._lease_tables('dedup.lease', job_id, scope, fingerprint);
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

    IF tables IS NOT NULL THEN
        -- Generations: a new claim goes into the generation claims go to by the claim
        -- protocol, unique across all of them (dedup._write_lease). If the job has a row,
        -- it is found and locked until we commit (dedup._lease_row, as complete and
        -- extend_lease find theirs); an expired lease there is taken over, in place in the
        -- generation claims go to, else moved to it: deleted, then written again, so a copy
        -- that finds it waits for us. A row gone between the two looks (released,
        -- forgotten, or moved more than _lease_row looks again for) sends us round again.
        LOOP
            lease_id := gen_random_uuid();
            expires_at := clock_timestamp() + d;
            IF dedup._write_lease('dedup.lease', job_id, scope, fingerprint, NULL, lease_id, expires_at, now()) THEN
                status := 'acquired';
                claimed_at := now();
                PERFORM dedup._count(scope, status);
                RETURN;
            END IF;
            SELECT * INTO lr FROM dedup._lease_row('dedup.lease', job_id, scope);
            held := lr.held;
            tbl := lr.tbl;
            CONTINUE WHEN tbl IS NULL;
            -- Done, running, or another payload: answered below.
            EXIT WHEN held.lease_expires_at IS NULL OR held.lease_expires_at >= clock_timestamp()
                   OR (held.fingerprint IS NOT NULL AND fingerprint IS NOT NULL AND held.fingerprint <> fingerprint);
            expires_at := clock_timestamp() + d;
            IF lr.in_place THEN
                EXECUTE format('UPDATE %s AS p SET processed_at = now(), fingerprint = coalesce($3, p.fingerprint), '
                               'lease_id = $4, lease_expires_at = $5 WHERE p.job_id = $1 AND p.scope = $2', tbl)
                  USING job_id, scope, fingerprint, lease_id, expires_at;
            ELSE
                EXECUTE format('DELETE FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2', tbl)
                  USING job_id, scope;
                IF NOT dedup._write_lease('dedup.lease', job_id, scope, coalesce(fingerprint, held.fingerprint),
                                          NULL, lease_id, expires_at, now()) THEN
                    RAISE EXCEPTION USING ERRCODE = 'XX000',
                        MESSAGE = format('dedup.lease: moving the expired lease on job %L in scope %L out of %s failed', job_id, scope, tbl);
                END IF;
            END IF;
            status := 'acquired';
            claimed_at := now();
            PERFORM dedup._count(scope, status);
            RETURN;
        END LOOP;
        lease_id := NULL;
        expires_at := NULL;
    ELSIF dedup._distributed() THEN
        -- A new claim, or the takeover of an expired lease with a compatible fingerprint:
        -- one statement, so one caller wins. Otherwise the row stays locked until we
        -- commit. (The same on one server, below.)
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
    IF tables IS NULL THEN
        IF FOUND THEN
            status := 'acquired';
            PERFORM dedup._count(scope, status);
            RETURN;
        END IF;
        SELECT * INTO STRICT held FROM dedup.processed AS p
         WHERE p.job_id = lease.job_id AND p.scope = lease.scope;
    END IF;
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
    t        timestamptz;
    tables   text[];
    tbl      text;
    lr       record;
    held     dedup.processed;
BEGIN
    tables := dedup._lease_tables('dedup.complete', job_id, scope, NULL);
    IF lease_id IS NULL THEN
        PERFORM dedup._raise('22004', 'dedup.complete: lease_id must not be NULL',
                             'Pass the lease_id that dedup.lease returned with status ''acquired''.');
    END IF;
    IF tables IS NOT NULL THEN
        -- Generations: the lease is found (locked until we commit) and completed in place in
        -- the generation claims go to (tables[1]), or moved there from an older one, so it
        -- counts from its completion in a generation that is kept that long.
        SELECT * INTO lr FROM dedup._lease_row('dedup.complete', job_id, scope);
        tbl := lr.tbl;
        held := lr.held;
        IF held.lease_id IS DISTINCT FROM complete.lease_id THEN
            PERFORM dedup._lease_lost('dedup.complete', job_id, scope, lease_id);
        ELSIF held.lease_expires_at IS NULL THEN
            -- Completing twice with the same lease is a no-op: the first result stays.
            RETURN;
        ELSIF lr.in_place THEN
            EXECUTE format('UPDATE %s AS p SET lease_expires_at = NULL, result = $3, processed_at = clock_timestamp() '
                           'WHERE p.job_id = $1 AND p.scope = $2', tbl)
              USING job_id, scope, result;
        ELSE
            EXECUTE format('DELETE FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2', tbl)
              USING job_id, scope;
            IF NOT dedup._write_lease('dedup.complete', job_id, scope, held.fingerprint, result, lease_id,
                                      NULL, clock_timestamp()) THEN
                RAISE EXCEPTION USING ERRCODE = 'XX000',
                    MESSAGE = format('dedup.complete: moving the lease on job %L in scope %L out of %s failed', job_id, scope, tbl);
            END IF;
        END IF;
        RETURN;
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
    d        interval;
    until    timestamptz;
    t        timestamptz;
    tables   text[];
    tbl      text;
    lr       record;
    held     dedup.processed;
BEGIN
    tables := dedup._lease_tables('dedup.extend_lease', job_id, scope, NULL);
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
    IF tables IS NOT NULL THEN
        -- Generations: extended in place in the generation claims go to (tables[1]), or
        -- moved there from an older one, which a running lease leaves before it retires.
        SELECT * INTO lr FROM dedup._lease_row('dedup.extend_lease', job_id, scope);
        tbl := lr.tbl;
        held := lr.held;
        IF held.lease_id IS DISTINCT FROM extend_lease.lease_id OR held.lease_expires_at IS NULL THEN
            PERFORM dedup._lease_lost('dedup.extend_lease', job_id, scope, lease_id);
        END IF;
        until := clock_timestamp() + d;
        IF lr.in_place THEN
            EXECUTE format('UPDATE %s AS p SET lease_expires_at = $3 WHERE p.job_id = $1 AND p.scope = $2', tbl)
              USING job_id, scope, until;
        ELSE
            EXECUTE format('DELETE FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2', tbl)
              USING job_id, scope;
            IF NOT dedup._write_lease('dedup.extend_lease', job_id, scope, held.fingerprint, held.result,
                                      lease_id, until, held.processed_at) THEN
                RAISE EXCEPTION USING ERRCODE = 'XX000',
                    MESSAGE = format('dedup.extend_lease: moving the lease on job %L in scope %L out of %s failed', job_id, scope, tbl);
            END IF;
        END IF;
        RETURN until;
    ELSIF dedup._distributed() THEN
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
DECLARE
    tables   text[];
    tbl      text;
    lr       record;
    held     dedup.processed;
BEGIN
    tables := dedup._lease_tables('dedup.release_lease', job_id, scope, NULL);
    IF lease_id IS NULL THEN
        PERFORM dedup._raise('22004', 'dedup.release_lease: lease_id must not be NULL',
                             'Pass the lease_id that dedup.lease returned with status ''acquired''.');
    END IF;
    IF tables IS NOT NULL THEN
        -- Generations: deleted from the generation that holds it.
        SELECT * INTO lr FROM dedup._lease_row('dedup.release_lease', job_id, scope);
        tbl := lr.tbl;
        held := lr.held;
        IF held.lease_id IS DISTINCT FROM release_lease.lease_id OR held.lease_expires_at IS NULL THEN
            PERFORM dedup._lease_lost('dedup.release_lease', job_id, scope, lease_id);
        END IF;
        EXECUTE format('DELETE FROM %s AS p WHERE p.job_id = $1 AND p.scope = $2', tbl)
          USING job_id, scope;
        RETURN;
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

-- dedup.stats_counters() has two new columns, the index probes of sealed generations (for
-- want of a summary, and a summary's false positives): the view on it and
-- dedup.cluster_stats() are made again.
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
	"expired_duplicates_expected" double precision,
	"unsummarised_probes" bigint,
	"summary_false_positives" bigint
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
DROP FUNCTION dedup.cluster_stats();

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

-- dedup.distribute() refuses a database that uses generations (claims routed by Citus never
-- look in a generation).
CREATE OR REPLACE FUNCTION dedup.distribute(
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
