-- A prototype of the portable edition's claim across generations (issue 26, slice 5;
-- docs/design/generations.md, "Everywhere dedup runs"), to measure what its parts cost
-- before it is built: bench/portable-generations.sh loads it into a database that has the
-- portable edition's plain script. Not part of the extension.
--
-- Six generation tables proto.g0 .. proto.g5 with the columns and primary key of
-- dedup.processed (a ring of fixed tables: PL/pgSQL's static statements keep their plans),
-- and a catalog proto.generations of their states. Each variant is a SECURITY DEFINER
-- function with a pinned search_path, as dedup._portable_claim is; each does the common
-- case only (a new job, READ COMMITTED, no generation being sealed):
--   ring_k(job_id, scope)   the catalog read, the INSERT ... ON CONFLICT DO NOTHING into
--                           the current slot (one static statement per slot, chosen by
--                           IF), the catalog read again and the sealed slots read, then
--                           one SELECT per sealed slot (k of them, each a probe of its
--                           primary key; after the insertion, as the design was before
--                           4857121: the same cost for a new job)
--   ring_one(job_id, scope) the same, the sealed slots probed by one statement
--   dyn_k(job_id, scope)    the same as ring_k with EXECUTE format(...) for the INSERT
--                           and the probes: a table named at run time, planned each time
--   lean_1(job_id, scope)   (below) the catalog as one row, read before and after the
--                           insertion, one sealed slot looked in by the INSERT itself
-- dedup.try_claim(text, text) (one table, today, with its argument checks, which the
-- variants leave out) is the baseline. Every variant inserts into proto.g0.
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS proto CASCADE;
CREATE SCHEMA proto;
DO $$
BEGIN
    FOR i IN 0 .. 5 LOOP
        EXECUTE format('CREATE TABLE proto.g%s (LIKE dedup.processed INCLUDING ALL)', i);
    END LOOP;
END
$$;
CREATE TABLE proto.generations (slot int PRIMARY KEY, state text NOT NULL);
-- slot 0 current, 1 to 4 sealed (200,000 claims each), 5 retired (empty)
INSERT INTO proto.generations VALUES (0, 'current'), (1, 'sealed'), (2, 'sealed'),
    (3, 'sealed'), (4, 'sealed'), (5, 'retired');
DO $$
BEGIN
    FOR i IN 1 .. 4 LOOP
        EXECUTE format($f$INSERT INTO proto.g%s (scope, job_id)
                         SELECT 'default', (-g - %s * 1000000)::text
                           FROM generate_series(1, 200000) AS g$f$, i, i);
    END LOOP;
END
$$;
VACUUM ANALYZE proto.g0, proto.g1, proto.g2, proto.g3, proto.g4, proto.g5, proto.generations;

-- The current slot and the sealed ones, as a claim reads them.
CREATE FUNCTION proto.slots(OUT cur int, OUT sealed int[])
LANGUAGE sql STABLE
AS $$
    SELECT (SELECT g.slot FROM proto.generations AS g WHERE g.state = 'current'),
           (SELECT array_agg(g.slot ORDER BY g.slot) FROM proto.generations AS g WHERE g.state = 'sealed')
$$;

CREATE FUNCTION proto.ring_k(job_id text, scope text)
RETURNS bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    cur int;
    again int;
    sealed int[];
    s int;
BEGIN
    SELECT g.slot INTO cur FROM proto.generations AS g WHERE g.state = 'current';
    IF cur = 0 THEN
        INSERT INTO proto.g0 (scope, job_id, processed_at) VALUES (ring_k.scope, ring_k.job_id, now()) ON CONFLICT DO NOTHING;
    ELSIF cur = 1 THEN
        INSERT INTO proto.g1 (scope, job_id, processed_at) VALUES (ring_k.scope, ring_k.job_id, now()) ON CONFLICT DO NOTHING;
    ELSIF cur = 2 THEN
        INSERT INTO proto.g2 (scope, job_id, processed_at) VALUES (ring_k.scope, ring_k.job_id, now()) ON CONFLICT DO NOTHING;
    ELSIF cur = 3 THEN
        INSERT INTO proto.g3 (scope, job_id, processed_at) VALUES (ring_k.scope, ring_k.job_id, now()) ON CONFLICT DO NOTHING;
    ELSIF cur = 4 THEN
        INSERT INTO proto.g4 (scope, job_id, processed_at) VALUES (ring_k.scope, ring_k.job_id, now()) ON CONFLICT DO NOTHING;
    ELSE
        INSERT INTO proto.g5 (scope, job_id, processed_at) VALUES (ring_k.scope, ring_k.job_id, now()) ON CONFLICT DO NOTHING;
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT g.slot INTO again FROM proto.generations AS g WHERE g.state = 'current';
    SELECT array_agg(g.slot) INTO sealed FROM proto.generations AS g WHERE g.state = 'sealed';
    FOREACH s IN ARRAY coalesce(sealed, '{}') LOOP
        IF s = 1 THEN
            PERFORM FROM proto.g1 AS p WHERE p.job_id = ring_k.job_id AND p.scope = ring_k.scope;
        ELSIF s = 2 THEN
            PERFORM FROM proto.g2 AS p WHERE p.job_id = ring_k.job_id AND p.scope = ring_k.scope;
        ELSIF s = 3 THEN
            PERFORM FROM proto.g3 AS p WHERE p.job_id = ring_k.job_id AND p.scope = ring_k.scope;
        ELSIF s = 4 THEN
            PERFORM FROM proto.g4 AS p WHERE p.job_id = ring_k.job_id AND p.scope = ring_k.scope;
        ELSE
            PERFORM FROM proto.g5 AS p WHERE p.job_id = ring_k.job_id AND p.scope = ring_k.scope;
        END IF;
        IF FOUND THEN
            RETURN false;   -- (the real claim deletes its own row first)
        END IF;
    END LOOP;
    RETURN true;
END
$$;

CREATE FUNCTION proto.ring_one(job_id text, scope text)
RETURNS bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    cur int;
    again int;
BEGIN
    SELECT g.slot INTO cur FROM proto.generations AS g WHERE g.state = 'current';
    IF cur = 0 THEN
        INSERT INTO proto.g0 (scope, job_id, processed_at) VALUES (ring_one.scope, ring_one.job_id, now()) ON CONFLICT DO NOTHING;
    ELSE
        RAISE EXCEPTION 'the prototype measures slot 0 current only';
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT g.slot INTO again FROM proto.generations AS g WHERE g.state = 'current';
    -- every slot but the current one, in one statement; a slot that is not sealed is
    -- skipped by its state
    PERFORM FROM proto.generations AS g
     WHERE (g.slot = 1 AND g.state = 'sealed' AND EXISTS (SELECT FROM proto.g1 AS p WHERE p.job_id = ring_one.job_id AND p.scope = ring_one.scope))
        OR (g.slot = 2 AND g.state = 'sealed' AND EXISTS (SELECT FROM proto.g2 AS p WHERE p.job_id = ring_one.job_id AND p.scope = ring_one.scope))
        OR (g.slot = 3 AND g.state = 'sealed' AND EXISTS (SELECT FROM proto.g3 AS p WHERE p.job_id = ring_one.job_id AND p.scope = ring_one.scope))
        OR (g.slot = 4 AND g.state = 'sealed' AND EXISTS (SELECT FROM proto.g4 AS p WHERE p.job_id = ring_one.job_id AND p.scope = ring_one.scope))
        OR (g.slot = 5 AND g.state = 'sealed' AND EXISTS (SELECT FROM proto.g5 AS p WHERE p.job_id = ring_one.job_id AND p.scope = ring_one.scope));
    RETURN NOT FOUND;
END
$$;

CREATE FUNCTION proto.dyn_k(job_id text, scope text)
RETURNS bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    cur int;
    again int;
    sealed int[];
    s int;
    n bigint;
BEGIN
    SELECT g.slot INTO cur FROM proto.generations AS g WHERE g.state = 'current';
    EXECUTE format('INSERT INTO proto.%I (scope, job_id, processed_at) VALUES ($1, $2, now()) ON CONFLICT DO NOTHING', 'g' || cur)
      USING scope, job_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        RETURN false;
    END IF;
    SELECT g.slot INTO again FROM proto.generations AS g WHERE g.state = 'current';
    SELECT array_agg(g.slot) INTO sealed FROM proto.generations AS g WHERE g.state = 'sealed';
    FOREACH s IN ARRAY coalesce(sealed, '{}') LOOP
        EXECUTE format('SELECT count(*) FROM proto.%I AS p WHERE p.job_id = $1 AND p.scope = $2', 'g' || s)
          INTO n USING job_id, scope;
        IF n > 0 THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- The leanest form: the catalog as one row (the current slot and the sealed ones), read by
-- its primary key before and after the insertion, and the one sealed generation of a
-- width of the whole retention looked in by the INSERT itself (NOT EXISTS in its SELECT):
-- three statements. (lean_1: slot 1 the one sealed generation.)
CREATE TABLE proto.list (id int PRIMARY KEY, cur int NOT NULL, sealed int[] NOT NULL);
INSERT INTO proto.list VALUES (1, 0, '{1}');
VACUUM ANALYZE proto.list;
CREATE FUNCTION proto.lean_1(job_id text, scope text)
RETURNS bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    l record;
    again int;
BEGIN
    SELECT c.cur, c.sealed INTO l FROM proto.list AS c WHERE c.id = 1;
    IF l.cur = 0 AND l.sealed = '{1}' THEN
        INSERT INTO proto.g0 (scope, job_id, processed_at)
        SELECT lean_1.scope, lean_1.job_id, now()
         WHERE NOT EXISTS (SELECT FROM proto.g1 AS p WHERE p.job_id = lean_1.job_id AND p.scope = lean_1.scope)
        ON CONFLICT DO NOTHING;
    ELSE
        RAISE EXCEPTION 'the prototype measures slot 0 current, slot 1 sealed only';
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT c.cur INTO again FROM proto.list AS c WHERE c.id = 1;
    RETURN true;
END
$$;
