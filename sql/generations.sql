-- dedup's generations (issue 26, slice 1; docs/design/generations.md): claims in rotating
-- tables, so that retention drops a whole table instead of deleting rows. Opt-in: a
-- database uses generations once a superuser calls dedup.use_generations(), and until then
-- dedup.generations is empty and every claim is in dedup.processed, pruned as before.
--
-- Generation 0 is dedup.processed itself; generation n >= 1 is the table dedup.processed_<n>,
-- made by the rotation (src/generations/rotate.rs) with the columns and primary key of
-- dedup.processed and no privilege for any other role. The generation tables are not
-- members of the extension: pg_dump dumps them as tables of the schema dedup, and this
-- catalog with its rows. Runs after sql/offsets.sql and after the library's functions
-- dedup.use_generations() and dedup.rotate_generations(publish), whose privileges and
-- comments are set here.

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
