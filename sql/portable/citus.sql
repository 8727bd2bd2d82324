-- dedup, portable edition: Citus (src/citus.rs). The portable edition does not route claims
-- through Citus itself (docs/portable.md); it reads Citus's catalog as the native library
-- does, so that the lease functions pick the statement form a distributed claim table needs.

-- Whether dedup.processed is distributed by job_id (false without Citus, read without a
-- lookup); a Citus table of another kind is refused, as in the native function.
CREATE FUNCTION dedup._distributed()
RETURNS pg_catalog.bool
LANGUAGE plpgsql STRICT VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF pg_catalog.current_setting('citus.version', true) IS NULL THEN
        RETURN false;
    END IF;
    RETURN dedup._portable_route() OPERATOR(pg_catalog.=) 'citus';
END
$$;

-- Whether the row at "row" of rel (a table of dedup's schema) was written by this
-- transaction: the row-level security policy claims_update that dedup.distribute() sets
-- asks it. The row is read by the owner (the caller may not read xmin); nothing routes
-- claims here on Citus (docs/portable.md), so only a role updating dedup.processed by hand
-- meets the policy.
CREATE FUNCTION dedup._portable_written_here(rel pg_catalog.oid, "row" pg_catalog.tid)
RETURNS pg_catalog.bool
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    held record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class AS c JOIN pg_extension AS e ON e.extnamespace = c.relnamespace
                    WHERE c.oid = rel AND c.relkind = 'r' AND e.extname = 'dedup') THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT t.xmin::text::bigint AS xmin32, t.processed_at >= now() AS recent '
                   'FROM %s AS t WHERE t.ctid OPERATOR(pg_catalog.=) $1', rel::regclass)
       INTO held USING "row";
    RETURN held.recent IS TRUE AND dedup._portable_xmin_is_ours(held.xmin32);
END
$$;

CREATE FUNCTION dedup._written_here("rel" pg_catalog.oid, "row" pg_catalog.tid)
RETURNS pg_catalog.bool
LANGUAGE sql STRICT STABLE PARALLEL SAFE
AS $$ SELECT dedup._portable_written_here("rel", "row") $$;
