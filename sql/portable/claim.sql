-- dedup, portable edition: the claim path (src/claim.rs) and what leases share with it
-- (src/lease.rs). Each function has the header of the native one it replaces;
-- scripts/portable.py checks that.
--
-- Functions without SECURITY DEFINER run with the caller's search_path: their bodies name
-- every function with its schema and write operators as OPERATOR(pg_catalog.x), or hand
-- the work to a dedup._portable_* helper (sql/portable/helpers.sql), whose search_path is
-- pinned.

-- try_claim(job_id, scope): one job, in the caller's transaction. The claim is made by
-- dedup._portable_claim as the owner of dedup.processed (see there).
CREATE FUNCTION dedup.try_claim(job_id pg_catalog.text, scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT dedup._portable_claim('dedup.try_claim', job_id, scope, NULL)
$$;

-- The same job as its decimal text: try_claim(42) = try_claim('42').
CREATE FUNCTION dedup.try_claim(job_id pg_catalog.int8, scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT dedup._portable_claim('dedup.try_claim', job_id::pg_catalog.text, scope, NULL)
$$;

-- The same job as the uuid's canonical text (lowercase, hyphenated), which is uuid_out's.
CREATE FUNCTION dedup.try_claim(job_id pg_catalog.uuid, scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT dedup._portable_claim('dedup.try_claim', job_id::pg_catalog.text, scope, NULL)
$$;

-- The claim behind try_claim(job_id, scope, fingerprint): NULL for another fingerprint
-- (the SQL wrapper of sql/leases.sql raises YD001).
CREATE FUNCTION dedup._try_claim_fp(job_id pg_catalog.text, scope pg_catalog.text, fingerprint pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT dedup._portable_claim('dedup.try_claim', job_id, scope, fingerprint)
$$;

-- The checks every lease function makes, with errors naming func. As loading the native
-- library does, the first call gives dedup.lease_duration its default (30 s) for the
-- session when nothing set it: the lease functions of sql/leases.sql read it with
-- current_setting('dedup.lease_duration'), which fails for a setting nobody defined.
CREATE FUNCTION dedup._check_claim(
    func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text, fingerprint pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM dedup._portable_check_text(func, 'job_id', job_id, 1024);
    PERFORM dedup._portable_check_text(func, 'scope', scope, 128);
    PERFORM dedup._portable_check_text(func, 'fingerprint', fingerprint, 256, true);
    PERFORM dedup._portable_check_writable(func);
    IF pg_catalog.current_setting('citus.version', true) IS NOT NULL THEN
        IF dedup._portable_route() OPERATOR(pg_catalog.=) 'worker_local' THEN
            PERFORM dedup._portable_error('worker_not_distributed', func);
        END IF;
    END IF;
    -- NULL before anything set it; '' after a transaction that set it first rolled back.
    IF COALESCE(pg_catalog.current_setting('dedup.lease_duration', true), '')
        OPERATOR(pg_catalog.=) '' THEN
        PERFORM pg_catalog.set_config('dedup.lease_duration', '30s', false);
    END IF;
END
$$;

-- The tables a lease function looks for its job in: NULL, which makes it use
-- dedup.processed (no generations here), after the checks of dedup._check_claim.
CREATE FUNCTION dedup._lease_tables(
    func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text, fingerprint pg_catalog.text)
RETURNS pg_catalog.text[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM dedup._check_claim(func, job_id, scope, fingerprint);
    RETURN NULL;
END
$$;

-- A lease function's row where generations are used: never called here (dedup._lease_tables
-- is NULL), and written as the one table would take it: inserted unless the job has a row.
CREATE FUNCTION dedup._write_lease(
    func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text, fingerprint pg_catalog.text,
    result pg_catalog.jsonb, lease_id pg_catalog.uuid, lease_expires_at pg_catalog.timestamptz,
    processed_at pg_catalog.timestamptz)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM dedup._check_claim(func, job_id, scope, fingerprint);
    IF processed_at IS NULL THEN
        PERFORM dedup._portable_error('null', func, 'processed_at');
    END IF;
    INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint, result, lease_id, lease_expires_at)
    VALUES (scope, job_id, processed_at, fingerprint, result, lease_id, lease_expires_at)
    ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
    RETURN FOUND;
END
$$;

-- Whether a visible row whose 32-bit xmin is xmin32 was written by this transaction (a
-- savepoint of it included): the row is visible, and pg_xact_status says 'in progress' only
-- for this transaction's own ids. Its ids are its top-level id and the later ids of its
-- savepoints: the row's xmin is at most 2^31 ahead of the top-level id, whose epoch gives
-- the full id. (Without a top-level id, this transaction has written nothing.) The caller
-- also checks the row is stamped with this transaction's start or later: an older claim
-- whose 32-bit xmin matches one of our ids (kept for 2^32 transactions) is not ours.
CREATE FUNCTION dedup._portable_xmin_is_ours(xmin32 pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    top    xid8;
    top32  bigint;
    ahead  bigint;
    status text;
BEGIN
    top := pg_current_xact_id_if_assigned();
    IF top IS NULL OR xmin32 IS NULL THEN
        RETURN false;
    END IF;
    top32 := (top::text::numeric % 4294967296)::bigint;
    ahead := ((xmin32 - top32) % 4294967296 + 4294967296) % 4294967296;
    IF ahead >= 2147483648 THEN
        RETURN false;
    END IF;
    BEGIN
        -- An id of an old row that is not ours may lie outside what pg_xact_status answers
        -- for ("in the future" of the wrapped counter): not ours either.
        status := pg_xact_status((top::text::numeric + ahead)::text::xid8);
    EXCEPTION WHEN OTHERS THEN
        status := NULL;
    END;
    RETURN status IS NOT DISTINCT FROM 'in progress';
END
$$;

-- Store the result of a job this transaction claimed with try_claim ("this transaction":
-- dedup._portable_xmin_is_ours).
CREATE FUNCTION dedup.set_result(
    job_id pg_catalog.text, result pg_catalog.jsonb, scope pg_catalog.text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    f      constant text := 'dedup.set_result';
    held   record;
BEGIN
    PERFORM dedup._check_claim(f, job_id, scope, NULL);
    SELECT p.xmin::text::bigint AS xmin32, p.lease_expires_at IS NOT NULL AS leased,
           p.processed_at >= now() AS recent INTO held
      FROM dedup.processed AS p
     WHERE p.job_id = set_result.job_id AND p.scope = set_result.scope;
    IF NOT FOUND THEN
        PERFORM dedup._portable_error('not_claimed_here', f);
    END IF;
    IF held.leased THEN
        PERFORM dedup._portable_error('leased', f);
    END IF;
    IF NOT held.recent OR NOT dedup._portable_xmin_is_ours(held.xmin32) THEN
        PERFORM dedup._portable_error('not_claimed_here', f);
    END IF;
    UPDATE dedup.processed AS p SET result = set_result.result
     WHERE p.job_id = set_result.job_id AND p.scope = set_result.scope;
END
$$;

-- The row behind dedup.claim_result, which calls it as the owner (SECURITY DEFINER).
CREATE FUNCTION dedup._claim_result(job_id pg_catalog.text, scope pg_catalog.text)
RETURNS TABLE (result pg_catalog.jsonb, claimed_at pg_catalog.timestamptz)
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $$
BEGIN
    IF job_id IS NULL THEN
        PERFORM dedup._portable_error('null', 'dedup.claim_result', 'job_id');
    END IF;
    IF scope IS NULL THEN
        PERFORM dedup._portable_error('null', 'dedup.claim_result', 'scope');
    END IF;
    RETURN QUERY
        SELECT p.result, p.processed_at FROM dedup.processed AS p
         WHERE p.job_id OPERATOR(pg_catalog.=) _claim_result.job_id
           AND p.scope OPERATOR(pg_catalog.=) _claim_result.scope
           AND p.lease_expires_at IS NULL;
END
$$;
