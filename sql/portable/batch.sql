-- dedup, portable edition: batches and partitioned logs (src/batch.rs). The batch is
-- claimed by dedup._portable_claim_many (sql/portable/helpers.sql): each key once, in
-- canonical order, by one INSERT ... ON CONFLICT DO NOTHING.

-- The job ids this call claimed, each once, in the order of the array.
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.text[], scope pg_catalog.text DEFAULT 'default')
RETURNS SETOF pg_catalog.text
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT r.job_id FROM dedup._portable_claim_many(job_ids, scope, NULL, false) AS r
$$;

-- bigint job ids: the jobs of their decimal text, returned as the bigints they are.
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.int8[], scope pg_catalog.text DEFAULT 'default')
RETURNS SETOF pg_catalog.int8
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT r.job_id::pg_catalog.int8
      FROM dedup._portable_claim_many(job_ids::pg_catalog.text[], scope, NULL, false) AS r
$$;

-- uuid job ids: the jobs of their canonical text.
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.uuid[], scope pg_catalog.text DEFAULT 'default')
RETURNS SETOF pg_catalog.uuid
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT r.job_id::pg_catalog.uuid
      FROM dedup._portable_claim_many(job_ids::pg_catalog.text[], scope, NULL, false) AS r
$$;

-- The batch behind try_claim_many(job_ids, scope, fingerprints): the ids claimed and the
-- ids claimed before (or repeated) with another fingerprint, in array order; the PL/pgSQL
-- wrapper of sql/offsets.sql raises YD001 for the first mismatch.
CREATE FUNCTION dedup._try_claim_many_fp(
    job_ids pg_catalog.text[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS TABLE (job_id pg_catalog.text, mismatch pg_catalog.bool)
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT r.job_id, r.mismatch FROM dedup._portable_claim_many(job_ids, scope, fingerprints, true) AS r
$$;

-- The checks of dedup.advance and dedup.position, with errors naming func.
CREATE FUNCTION dedup._check_offset(
    func pg_catalog.text, stream pg_catalog.text, partition pg_catalog.int4, "position" pg_catalog.int8)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    worker pg_catalog.bool;
BEGIN
    IF stream IS NULL THEN
        PERFORM dedup._portable_error('null', func, 'stream');
    END IF;
    IF partition IS NULL THEN
        PERFORM dedup._portable_error('null', func, 'partition');
    END IF;
    IF "position" IS NULL THEN
        PERFORM dedup._portable_error('null', func, 'position');
    END IF;
    PERFORM dedup._portable_check_text(func, 'stream', stream, 128);
    IF partition OPERATOR(pg_catalog.<) 0 THEN
        PERFORM dedup._portable_error('negative', func, 'partition', partition::pg_catalog.text);
    END IF;
    IF "position" OPERATOR(pg_catalog.<) 0 THEN
        PERFORM dedup._portable_error('negative', func, 'position', "position"::pg_catalog.text);
    END IF;
    IF func OPERATOR(pg_catalog.=) 'dedup.advance' THEN
        PERFORM dedup._portable_check_writable(func);
    END IF;
    -- On Citus the positions live on the coordinator (src/citus.rs, on_worker).
    IF pg_catalog.current_setting('citus.version', true) IS NOT NULL
       AND pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL THEN
        EXECUTE 'SELECT g.groupid OPERATOR(pg_catalog.>) 0 FROM pg_catalog.pg_dist_local_group AS g'
           INTO worker;
        IF worker THEN
            PERFORM dedup._portable_error('offsets_on_worker', func);
        END IF;
    END IF;
END
$$;
