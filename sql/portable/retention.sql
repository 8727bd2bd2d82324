-- dedup, portable edition: retention (src/prune/). There is no background worker: a
-- scheduler (pg_cron, or any client) calls dedup.prune() (docs/portable.md).

-- Delete claims older than their retention (all scopes, or one), at most max_rows; returns
-- how many. In the caller's transaction, like the native dedup.prune().
--
-- Two passes never overlap: each takes a SHARE UPDATE EXCLUSIVE lock on
-- dedup._prune_status, which conflicts with itself, so a second pass waits for the first
-- to commit (the native function waits for its own lock the same way). The native lock is
-- one no SQL can take; this one is a table lock no role but the table's owner can take
-- (a role can still make it wait in the lock queue, as for any table: docs/portable.md):
-- LOCK TABLE, VACUUM, ANALYZE, CREATE INDEX and ALTER TABLE check their privileges before
-- they lock, and what any role can lock without privileges (a PREPARE of a SELECT or an
-- INSERT naming the table: ACCESS SHARE, ROW SHARE, ROW EXCLUSIVE) does not conflict with
-- it. An advisory lock would not do: pg_advisory_lock takes any key for any role, so a role
-- holding the key would stop pruning, and pg_try_advisory_lock would skip it forever.
--
-- A pass sweeps the table in ranges of 1024 blocks (TID range scans): each batch deletes
-- at most dedup.prune_batch_size expired claims of its range, checking their age in the
-- DELETE itself and skipping rows other transactions hold (FOR UPDATE SKIP LOCKED), as the
-- native batches do; a full batch is followed by another over the same range.
CREATE FUNCTION dedup.prune(scope pg_catalog.text DEFAULT NULL, max_rows pg_catalog.int8 DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    f           constant text := 'dedup.prune';
    retention_s int;
    global_cut  interval;
    global_at   timestamptz;
    global_h    xid;
    batch_size  int;
    started     timestamptz;
    blocks      bigint;
    first_block bigint := 0;
    span        bigint;
    lim         bigint;
    n           bigint;
    deleted     bigint := 0;
    per_scope   jsonb := '{}';
    r           record;
BEGIN
    IF max_rows IS NOT NULL AND max_rows <= 0 THEN
        PERFORM dedup._portable_error('not_positive', f, 'max_rows', max_rows::text);
    END IF;
    PERFORM dedup._portable_check_writable(f);
    retention_s := dedup._portable_setting('dedup.retention', 604800, 1, 2147483647, true);
    PERFORM dedup._portable_warn_short_retention('dedup.retention', retention_s);
    batch_size := dedup._portable_setting('dedup.prune_batch_size', 5000, 100, 1000000, false);
    global_cut := make_interval(secs => retention_s);

    -- Waits for a pass already running in this database.
    LOCK TABLE dedup._prune_status IN SHARE UPDATE EXCLUSIVE MODE;
    started := clock_timestamp();
    -- This pass's horizon, and the one a claim's xmin must be below (sql/operations.sql,
    -- dedup._horizons: a claim is kept its retention from its commit).
    PERFORM dedup._mark_horizon(retention_s);
    global_at := now() - global_cut;
    global_h := dedup._horizon(global_at);

    blocks := pg_relation_size('dedup.processed'::regclass) / current_setting('block_size')::bigint;
    WHILE first_block < blocks LOOP
        IF max_rows IS NOT NULL AND max_rows - deleted <= 0 THEN
            EXIT;
        END IF;
        lim := CASE WHEN max_rows IS NULL THEN batch_size ELSE least(max_rows - deleted, batch_size) END;
        span := least(1024, blocks - first_block);
        n := 0;
        FOR r IN
            WITH cut AS (
                SELECT s.scope, c.at, dedup._horizon(c.at) AS horizon
                  FROM dedup.scope_retention AS s
                 CROSS JOIN LATERAL (SELECT timezone('UTC', timezone('UTC', now()) - s.retention) AS at) AS c),
            gone AS (
                DELETE FROM dedup.processed AS p
                 WHERE p.ctid = ANY (ARRAY(
                        SELECT q.ctid
                          FROM dedup.processed AS q
                          LEFT JOIN cut ON cut.scope = q.scope
                         CROSS JOIN LATERAL (
                               SELECT CASE WHEN cut.scope IS NULL THEN global_at ELSE cut.at END AS at,
                                      CASE WHEN cut.scope IS NULL THEN global_h ELSE cut.horizon END AS horizon) AS l
                         WHERE q.ctid >= format('(%s,0)', first_block)::tid
                           AND q.ctid < format('(%s,0)', first_block + span)::tid
                           AND (prune.scope IS NULL OR q.scope = prune.scope)
                           -- in UTC: a day is 24 hours whatever the session's TimeZone
                           AND q.processed_at < l.at
                           -- committed a whole retention ago (age(0) exceeds every age)
                           AND (l.horizon IS NULL OR age(q.xmin) > age(l.horizon) OR age(q.xmin) < 0)
                           -- a lease still running is never pruned
                           AND (q.lease_expires_at IS NULL OR q.lease_expires_at < now())
                         LIMIT lim
                           FOR UPDATE OF q SKIP LOCKED))
                RETURNING p.scope)
            SELECT gone.scope AS s, count(*) AS c FROM gone GROUP BY gone.scope
        LOOP
            n := n + r.c;
            per_scope := jsonb_set(per_scope, ARRAY[r.s::text],
                                   to_jsonb(coalesce((per_scope ->> r.s::text)::bigint, 0) + r.c));
        END LOOP;
        deleted := deleted + n;
        IF n < lim THEN
            first_block := first_block + span;
        END IF;
    END LOOP;

    -- The audit rows of dedup.forget, once their scope's retention is over (not in a call
    -- bounded by max_rows, which is about claims).
    IF max_rows IS NULL THEN
        DELETE FROM dedup.forgotten AS fo
         WHERE fo.forgotten_at < timezone('UTC', timezone('UTC', now()) - coalesce(
                   (SELECT s.retention FROM dedup.scope_retention AS s WHERE s.scope = fo.scope), global_cut))
           AND (prune.scope IS NULL OR fo.scope = prune.scope);
    END IF;

    -- The pass (key '' for all scopes, or its scope) and, for all scopes, each scope it
    -- deleted from.
    INSERT INTO dedup._prune_status AS st (scope, last_pass_at, rows_deleted, duration, pruned_by)
    SELECT k.scope, now(), k.n,
           make_interval(secs => extract(epoch FROM clock_timestamp() - started)::float8),
           session_user
      FROM (SELECT coalesce(prune.scope, '') AS scope, deleted AS n
            UNION ALL
            SELECT e.key, e.value::text::bigint
              FROM jsonb_each(per_scope) AS e
             WHERE prune.scope IS NULL) AS k
    ON CONFLICT ON CONSTRAINT _prune_status_pkey DO UPDATE SET last_pass_at = excluded.last_pass_at,
        rows_deleted = excluded.rows_deleted, duration = excluded.duration,
        pruned_by = excluded.pruned_by, consecutive_failures = 0;
    RETURN deleted;
END
$$;

-- The retention in force for a scope: its own, or dedup.retention. (Read by a VOLATILE
-- helper, which sees what the calling statement changed, as the native function does.)
CREATE FUNCTION dedup.retention(scope pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF scope IS NULL THEN
        PERFORM dedup._portable_error('null', 'dedup.retention', 'scope');
    END IF;
    RETURN dedup._portable_retention(scope);
END
$$;

-- Give a scope its own retention; NULL removes it.
CREATE FUNCTION dedup.set_retention(scope pg_catalog.text, retention pg_catalog.interval)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    f        constant text := 'dedup.set_retention';
    seconds  float8;
    months   float8;
    shortest float8;
BEGIN
    IF scope IS NULL THEN
        PERFORM dedup._portable_error('null', f, 'scope');
    END IF;
    PERFORM dedup._portable_check_text(f, 'scope', scope, 128);
    IF retention IS NULL THEN
        DELETE FROM dedup.scope_retention AS r WHERE r.scope = set_retention.scope;
        RETURN;
    END IF;
    seconds := date_part('epoch', retention);
    IF seconds <= 0 THEN
        PERFORM dedup._portable_error('not_positive', f, 'retention', seconds::text || ' s');
    END IF;
    -- Positive whatever a month's length (months of 28 days, or 31 when fewer than none):
    -- '1 month -29 days' is -1 day after a February of 28 days, when every claim of the
    -- scope would be expired (src/prune/settings.rs, LENGTHS and SHORTEST).
    months := date_part('year', retention) * 12 + date_part('month', retention);
    shortest := months * CASE WHEN months >= 0 THEN 2419200 ELSE 2678400 END
                + date_part('day', retention) * 86400
                + date_part('epoch', retention - make_interval(months => months::int4,
                                                              days => date_part('day', retention)::int4));
    IF shortest <= 0 THEN
        PERFORM dedup._portable_error('retention_months', f, 'retention',
                                      format('%s (%s s in the shortest month)', retention, shortest));
    END IF;
    PERFORM dedup._portable_warn_short_retention(format('retention of scope ''%s''', scope), trunc(seconds)::int8);
    INSERT INTO dedup.scope_retention AS r (scope, retention, set_by)
    VALUES (set_retention.scope, set_retention.retention, dedup._caller())
    ON CONFLICT ON CONSTRAINT scope_retention_pkey DO UPDATE SET retention = excluded.retention,
        set_at = excluded.set_at, set_by = excluded.set_by;
END
$$;

-- The role that called the SECURITY DEFINER function we are in: the role of SET ROLE, or
-- the session's user (GetOuterUserId of the native function). SECURITY DEFINER changes
-- neither.
CREATE FUNCTION dedup._caller()
RETURNS pg_catalog.text
LANGUAGE sql STRICT STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none'
                THEN SESSION_USER::pg_catalog.text
                ELSE pg_catalog.current_setting('role') END
$$;
