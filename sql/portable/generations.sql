-- dedup, portable edition: generations (src/generations/). The native rotation keeps an
-- epoch in the library's shared memory and cross-checks generations with the executor's
-- speculative insertion, neither of which SQL has: the portable edition keeps every claim
-- in dedup.processed, pruned by dedup.prune() (pg_cron), and refuses to turn generations
-- on. dedup.generations (always empty here) and dedup.claims() (dedup.processed's rows) are
-- the native SQL of sql/generations.sql, as they are.

-- The error of the three functions below: generations are not in the portable edition yet (its
-- own error: docs/reference/errors.md, "The portable edition's own errors").
CREATE FUNCTION dedup._portable_no_generations(func pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '0A000',
        MESSAGE = format('%s: the portable edition of dedup has no generations yet', func),
        HINT = 'Claims stay in dedup.processed, pruned by dedup.prune() (docs/portable.md, Pruning with '
               'pg_cron); generations need the native extension, or a later version of the portable '
               'edition (issue 26).';
END
$$;

CREATE FUNCTION dedup.use_generations()
RETURNS pg_catalog.text
LANGUAGE plpgsql STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dedup._portable_no_generations('dedup.use_generations');
END
$$;

CREATE FUNCTION dedup.rotate_generations(publish pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.text
LANGUAGE plpgsql STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    RETURN dedup._portable_no_generations('dedup.rotate_generations');
END
$$;

-- The background worker's rotation steps: no worker and no generations here.
CREATE FUNCTION dedup._rotate(step pg_catalog.text)
RETURNS pg_catalog.text[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._portable_no_generations('dedup._rotate');
    RETURN NULL;
END
$$;

-- The tables a claim may be in, for dedup.forget: dedup.processed alone (no generations
-- here), after the checks of every claim function.
CREATE FUNCTION dedup._claim_tables(func pg_catalog.text, job_id pg_catalog.text, scope pg_catalog.text)
RETURNS pg_catalog.text[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM dedup._check_claim(func, job_id, scope, NULL);
    RETURN ARRAY['dedup.processed'];
END
$$;

-- The summaries of sealed generations live in the library's shared memory, and there are no
-- generations here: no rows.
CREATE FUNCTION dedup.generation_summaries()
RETURNS TABLE (
    generation          pg_catalog.int4,
    relid               pg_catalog.oid,
    summarised          pg_catalog.bool,
    keys                pg_catalog.int8,
    bytes               pg_catalog.int8,
    false_positive_rate pg_catalog.float8,
    built_at            pg_catalog.timestamptz)
LANGUAGE plpgsql STRICT VOLATILE PARALLEL RESTRICTED
AS $$
BEGIN
    RETURN;
END
$$;

-- The trigger of dedup.generations: the native one moves the epoch in shared memory, which
-- the portable edition has not (and it has no generations). Does nothing.
CREATE FUNCTION dedup._generations_changed()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN NULL;
END
$$;
