-- dedup's leases, stored results and payload fingerprints: the functions for an effect no
-- transaction spans (a lease with a done marker) and for the answer a later copy gets.

-- Raises dedup's own errors, whose SQLSTATEs only PL/pgSQL can set:
--   YD001 the job was claimed with another payload fingerprint
--   YD002 the caller does not hold the lease it names
CREATE FUNCTION dedup._raise(sqlstate pg_catalog.text, message pg_catalog.text, hint pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = sqlstate, MESSAGE = message, HINT = hint;
END
$$;

-- YD001 for every caller: this function runs as its owner, who may call dedup._raise (not
-- granted to PUBLIC). It raises the error and does nothing else.
CREATE FUNCTION dedup._fingerprint_mismatch(func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dedup._raise('YD001',
        pg_catalog.format('%s: job %L in scope %L was claimed with a different payload fingerprint',
                          func, job_id, scope),
        'The same job id came with another payload: a bug in the producer, or two jobs sharing an id. '
        'Check the message; do not treat it as a duplicate.')
$$;

-- try_claim with a payload fingerprint. Plain SQL without SET or SECURITY DEFINER, so the
-- planner inlines it: the call costs what the C function costs. Every name is qualified,
-- and COALESCE needs no operator, so the caller's search_path cannot change its meaning.
CREATE FUNCTION dedup.try_claim(job_id pg_catalog.text, scope pg_catalog.text, fingerprint pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT COALESCE(dedup._try_claim_fp(job_id, scope, fingerprint),
                    dedup._fingerprint_mismatch('dedup.try_claim', job_id, scope))
$$;

CREATE FUNCTION dedup.try_claim(job_id pg_catalog.int8, scope pg_catalog.text, fingerprint pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT COALESCE(dedup._try_claim_fp(job_id::pg_catalog.text, scope, fingerprint),
                    dedup._fingerprint_mismatch('dedup.try_claim', job_id::pg_catalog.text, scope))
$$;

CREATE FUNCTION dedup.try_claim(job_id pg_catalog.uuid, scope pg_catalog.text, fingerprint pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT COALESCE(dedup._try_claim_fp(job_id::pg_catalog.text, scope, fingerprint),
                    dedup._fingerprint_mismatch('dedup.try_claim', job_id::pg_catalog.text, scope))
$$;

-- A lease, in a short transaction of its own before an external effect. Its one statement
-- has a second form for a claim table Citus distributes: Citus accepts no volatile function
-- in the WHERE of an ON CONFLICT or an UPDATE of a distributed table, so there the time is
-- read into a variable just before the statement (a wait for a row lock then comes after
-- it); on one server the statement reads clock_timestamp() itself. complete and
-- extend_lease do the same. A done or busy call passes the time of the claim it found to
-- dedup._count, for the duplicate ages of dedup.stats.
CREATE FUNCTION dedup.lease(
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

-- The holder's lease on a job: held (or expired but not taken over) and not yet done.
-- Raises YD002 otherwise, saying what happened to it: a lease_id that is not the holder's
-- is not reported as one that expired, and a job never leased says so.
CREATE FUNCTION dedup._lease_lost(func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text, lease_id pg_catalog.uuid)
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

-- A completed lease is done from its completion: retention counts from there. A NULL
-- lease_id is named (22004) by complete, extend_lease and release_lease, instead of
-- reported as a lost lease.
CREATE FUNCTION dedup.complete(
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

-- An extension longer than the scope's retention is refused, as a lease that long is.
CREATE FUNCTION dedup.extend_lease(
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

CREATE FUNCTION dedup.release_lease(
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

-- For a job that is done: the result stored with it and when it was claimed. No row for a
-- job that is not done (never claimed, leased and not completed, or pruned).
-- It reads through dedup._claim_result: as the owner on PostgreSQL, as the caller on Citus
-- (whose connections are per role: a shard this transaction wrote as the caller cannot be
-- read as another role in the same transaction).
CREATE FUNCTION dedup.claim_result(
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

REVOKE ALL ON FUNCTION dedup._raise(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._lease_lost(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._lease_row(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._check_claim(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._lease_tables(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._write_lease(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.uuid, pg_catalog.timestamptz, pg_catalog.timestamptz) FROM PUBLIC;

COMMENT ON FUNCTION dedup.try_claim(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'dedup.try_claim with a payload fingerprint: a later claim of the same job with another fingerprint raises YD001 instead of returning false.';
COMMENT ON FUNCTION dedup.try_claim(pg_catalog.int8, pg_catalog.text, pg_catalog.text) IS
'dedup.try_claim with a payload fingerprint, for a bigint job id.';
COMMENT ON FUNCTION dedup.try_claim(pg_catalog.uuid, pg_catalog.text, pg_catalog.text) IS
'dedup.try_claim with a payload fingerprint, for a uuid job id.';
COMMENT ON FUNCTION dedup.lease(pg_catalog.text, pg_catalog.text, pg_catalog.interval, pg_catalog.text) IS
'Lease a job before an external effect: status acquired (you hold it until expires_at), done (skip it; here is its result) or busy (leave the message unacknowledged).';
COMMENT ON FUNCTION dedup.complete(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb, pg_catalog.text) IS
'Mark a leased job done, with its result; raises YD002 if the lease is no longer held.';
COMMENT ON FUNCTION dedup.extend_lease(pg_catalog.text, pg_catalog.uuid, pg_catalog.interval, pg_catalog.text) IS
'Extend a held lease (heartbeat); returns the new expiry; raises YD002 if it is no longer held.';
COMMENT ON FUNCTION dedup.release_lease(pg_catalog.text, pg_catalog.uuid, pg_catalog.text) IS
'Give a held lease back after a failure, so a retry need not wait for it to expire.';
COMMENT ON FUNCTION dedup.set_result(pg_catalog.text, pg_catalog.jsonb, pg_catalog.text) IS
'Store the result of a job claimed with try_claim in this transaction, for dedup.claim_result to return to later copies.';
COMMENT ON FUNCTION dedup.claim_result(pg_catalog.text, pg_catalog.text) IS
'For a job that is done: the result stored with it and when it was claimed.';
