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
