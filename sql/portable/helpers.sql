-- dedup, portable edition: helpers shared by the functions of sql/portable/*.sql.
--
-- Every function here is named dedup._portable_* and exists only in the portable edition:
-- scripts/portable.py emits these statements (functions, and the COMMENT, REVOKE and GRANT
-- statements on them) before the first function it replaces, and refuses any other
-- function of sql/portable/ whose name and arguments are not those of a LANGUAGE c function
-- of the native script.
--
-- Each has SET search_path TO pg_catalog, pg_temp (a caller's search_path cannot change
-- what its body means) and names every table with its schema.

-- Raises one of the errors of src/error.rs: the same SQLSTATE, message and hint. kind names
-- the Rust function; func, arg and the values fill in its message. Returns boolean so that
-- it can stand in an expression (it never returns).
CREATE FUNCTION dedup._portable_error(
    kind   pg_catalog.text,
    func   pg_catalog.text,
    arg    pg_catalog.text DEFAULT NULL,
    value  pg_catalog.text DEFAULT NULL,
    value2 pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    code text;
    msg  text;
    hint text;
BEGIN
    CASE kind
    WHEN 'null' THEN
        code := '22004';
        msg := format('%s: %s must not be NULL', func, arg);
        hint := CASE
            WHEN arg IN ('stream', 'partition', 'position') THEN
                'Pass the stream''s name, the partition''s number and the entry''s position.'
            WHEN arg = 'scope' AND func = 'dedup.try_claim' THEN
                'Omit the argument to use the scope ''default'', or pass a scope name.'
            WHEN arg = 'scope' THEN
                'Pass a scope name; the scope of claims made without one is ''default''.'
            WHEN arg = 'fingerprints' THEN
                'Pass one fingerprint per job id, in the same order (NULL for a job without one), or '
                'leave the argument out.'
            WHEN arg IN ('func', 'event', 'processed_at') THEN
                'This internal function is called by dedup''s own functions with a constant here: '
                'call the public function (dedup.try_claim, dedup.lease, dedup.advance) instead.'
            ELSE
                'A job without an id cannot be deduplicated: pass the message''s unique id (a NULL '
                'claim read as "not claimed" would skip the job).'
            END;
    WHEN 'retention_months' THEN
        code := '22023';
        msg := format('%s: retention must be positive whatever a month''s length, not %s', func, value);
        hint := 'A month is 28 to 31 days long: write the retention without negative parts, e.g. ''30 days'' or ''1 month''.';
    WHEN 'not_positive' THEN
        code := '22023';
        msg := format('%s: %s must be positive, not %s', func, arg, value);
        hint := CASE arg
            WHEN 'max_rows' THEN 'Pass NULL (the default) to prune every expired claim.'
            ELSE 'Pass NULL to remove the scope''s own retention and use dedup.retention.'
            END;
    WHEN 'empty' THEN
        code := '22023';
        msg := format('%s: %s must not be empty', func, arg);
        hint := 'Pass a non-empty value; job ids and scopes are compared byte for byte.';
    WHEN 'too_long' THEN
        code := '22001';
        msg := format('%s: %s is %s bytes long, longer than the limit of %s bytes', func, arg, value, value2);
        hint := CASE arg
            WHEN 'scope' THEN 'Use a shorter scope name, e.g. the queue or handler name.'
            WHEN 'fingerprint' THEN
                'Pass a hash of the payload, e.g. encode(sha256(convert_to(payload, ''UTF8'')), ''hex''), '
                'not the payload itself.'
            WHEN 'stream' THEN 'Use a shorter stream name, e.g. the topic''s or the queue''s name.'
            ELSE
                'Claim a digest of a long key instead, e.g. encode(sha256(convert_to(key, ''UTF8'')), ''hex''), '
                'which is 64 bytes.'
            END;
    WHEN 'leased' THEN
        code := '55000';
        msg := format('%s: the job is held by a lease (dedup.lease), not claimed', func);
        hint := 'Use one API per scope: dedup.try_claim for effects in this database, dedup.lease for '
                'external effects.';
    WHEN 'not_claimed_here' THEN
        code := '55000';
        msg := format('%s: the job was not claimed by this transaction', func);
        hint := 'Call it in the transaction whose dedup.try_claim returned true, after the effect; a '
                'lease stores its result with dedup.complete.';
    WHEN 'on_standby' THEN
        code := '25006';
        msg := format('%s: cannot %s on a standby server', func,
                      CASE func WHEN 'dedup.prune' THEN 'prune' WHEN 'dedup.advance' THEN 'advance' ELSE 'claim' END);
        hint := CASE WHEN func = 'dedup.prune' THEN
                    'Claims are pruned on the primary (by its worker, or dedup.prune() there); the '
                    'deletions reach the standby by replication.'
                WHEN func = 'dedup.advance' THEN
                    'Raising a mark is a write: connect the consumer to the primary, '
                    'e.g. with target_session_attrs=read-write in its connection string.'
                ELSE
                    'A claim is a write: connect the consumer to the primary, '
                    'e.g. with target_session_attrs=read-write in its connection string.'
                END;
    WHEN 'read_only' THEN
        code := '25006';
        msg := format('%s: cannot %s in a read-only transaction', func,
                      CASE func WHEN 'dedup.prune' THEN 'prune' WHEN 'dedup.advance' THEN 'advance' ELSE 'claim' END);
        hint := CASE WHEN func = 'dedup.prune' THEN
                    'Pruning deletes claims: call dedup.prune() in a READ WRITE transaction '
                    '(check default_transaction_read_only and SET TRANSACTION).'
                WHEN func = 'dedup.advance' THEN
                    'Run dedup.advance and the batch''s effects in a READ WRITE transaction '
                    '(check default_transaction_read_only and SET TRANSACTION).'
                ELSE
                    'Run the claim and its effect in a READ WRITE transaction '
                    '(check default_transaction_read_only and SET TRANSACTION).'
                END;
    WHEN 'serialization_failure' THEN
        code := '40001';
        msg := format('%s: could not serialize access due to a concurrent claim of the same job', func);
        hint := 'A transaction that committed after this transaction''s snapshot claimed the job. '
                'Retry the whole transaction: the retry finds the claim (try_claim returns false, '
                'dedup.lease answers busy or done).';
    WHEN 'not_hash_distributed' THEN
        code := '55000';
        msg := format('dedup: dedup.processed is a Citus table that is not distributed by job_id (partmethod %s)', value);
        hint := 'Claims are routed only on a hash-distributed claim table: run '
                'SELECT undistribute_table(''dedup.processed'') on the coordinator, then SELECT dedup.distribute().';
    WHEN 'worker_not_distributed' THEN
        code := '55000';
        msg := format('%s: this node is a Citus worker and dedup.processed is not distributed: '
                      'a claim here would be seen by no other node', func);
        hint := 'Run SELECT dedup.distribute() on the coordinator (docs/citus.md), or claim on the coordinator.';
    WHEN 'batch_too_large' THEN
        code := '54000';
        msg := format('%s: %s job ids in one call, more than the limit of %s', func, value, value2);
        hint := 'Claim the batch in several calls of at most that many ids, each call''s ids taken in '
                'order from the whole batch sorted by their bytes (then two transactions splitting '
                'overlapping batches still claim in one order and cannot deadlock each other).';
    WHEN 'negative' THEN
        code := '22023';
        msg := format('%s: %s must not be negative, not %s', func, arg, value);
        hint := CASE arg
            WHEN 'position' THEN
                'Pass the entry''s position in the partition (a Kafka offset, or a stream entry id '
                'mapped to a bigint, see the docs); positions start at 0.'
            ELSE 'Pass the partition''s number, from 0.'
            END;
    WHEN 'offsets_on_worker' THEN
        code := '55000';
        msg := format('%s: this node is a Citus worker; the positions of partitions live on the coordinator', func);
        hint := 'Call dedup.advance and dedup.position on the coordinator (in the transaction of the effects, '
                'which may be distributed tables).';
    WHEN 'lengths_differ' THEN
        code := '22023';
        msg := format('%s: fingerprints has %s element%s, job_ids %s', func, value2,
                      CASE WHEN value2 = '1' THEN '' ELSE 's' END, value);
        hint := 'Pass one fingerprint per job id, in the same order (NULL for a job without one).';
    END CASE;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg, HINT = hint;
END
$$;

-- The checks of an argument that is a key (a job id, a scope, a stream, a fingerprint):
-- NULL (22004, unless null_ok), empty (22023), longer than max_bytes (22001).
CREATE FUNCTION dedup._portable_check_text(
    func      pg_catalog.text,
    arg       pg_catalog.text,
    value     pg_catalog.text,
    max_bytes pg_catalog.int4,
    null_ok   pg_catalog.bool DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        IF NOT null_ok THEN
            PERFORM dedup._portable_error('null', func, arg);
        END IF;
        RETURN;
    END IF;
    IF value = '' THEN
        PERFORM dedup._portable_error('empty', func, arg);
    END IF;
    IF octet_length(value) > max_bytes THEN
        -- The hint is chosen by the argument's kind (scope, fingerprint, else a job id).
        PERFORM dedup._portable_error('too_long', func, arg, octet_length(value)::text, max_bytes::text);
    END IF;
END
$$;

-- check_writable of src/claim.rs: no claim on a standby or in a read-only transaction.
-- (Parallel mode cannot be seen from SQL; every function that writes is PARALLEL UNSAFE.)
CREATE FUNCTION dedup._portable_check_writable(func pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM dedup._portable_error('on_standby', func);
    END IF;
    IF current_setting('transaction_read_only') = 'on' THEN
        PERFORM dedup._portable_error('read_only', func);
    END IF;
END
$$;

-- dedup.retention as the database or the server sets it, never a session or a role: the
-- native library refuses those (src/guc.rs), and a session's own retention would let any
-- role take a lease for decades (dedup.lease allows up to the retention) or prune by its
-- own. The database's setting (ALTER DATABASE ... SET, in pg_db_role_setting), else the
-- server's configuration files (pg_file_settings, when this function's owner may read
-- them), else NULL (the default). SECURITY DEFINER for pg_file_settings only, which is
-- why it reads this one setting and takes no name.
CREATE FUNCTION dedup._portable_settled_retention()
RETURNS pg_catalog.text
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    wanted constant text := 'dedup.retention';
    v      text;
BEGIN
    SELECT substr(c, length(wanted) + 2) INTO v
      FROM pg_db_role_setting AS s, unnest(s.setconfig) AS c
     WHERE s.setrole = 0
       AND s.setdatabase = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
       AND starts_with(c, wanted || '=');
    IF v IS NOT NULL THEN
        RETURN v;
    END IF;
    IF has_function_privilege('pg_catalog.pg_show_all_file_settings()', 'EXECUTE') THEN
        SELECT f.setting INTO v FROM pg_file_settings AS f
         WHERE f.name = wanted AND f.error IS NULL ORDER BY f.seqno DESC LIMIT 1;
    END IF;
    RETURN v;
END
$$;

-- An integer setting of the native library (src/guc.rs), read with current_setting(name,
-- true), dedup.retention with _portable_settled_retention: the native default when unset.
-- With seconds, the value may carry a unit as the
-- native setting's may ('7d', '30min', '90s', '500ms'; a bare number is seconds), rounded to
-- whole seconds. A value the native library would refuse when it is set is refused here
-- when it is read: 22023, with PostgreSQL's own message for a bad setting.
CREATE FUNCTION dedup._portable_setting(
    name     pg_catalog.text,
    fallback pg_catalog.int4,
    min      pg_catalog.int4,
    max      pg_catalog.int4,
    seconds  pg_catalog.bool)
RETURNS pg_catalog.int4
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    raw text := CASE WHEN name = 'dedup.retention' THEN dedup._portable_settled_retention()
                     ELSE current_setting(name, true) END;
    v   numeric;
BEGIN
    IF raw IS NULL OR btrim(raw) = '' THEN
        RETURN fallback;
    END IF;
    IF btrim(raw) ~ '^[+-]?[0-9]+$' THEN
        v := btrim(raw)::numeric;
    ELSIF seconds AND btrim(raw) ~ '^[+-]?[0-9]*\.?[0-9]+ *(us|ms|s|min|h|d)$' THEN
        v := round(extract(epoch FROM btrim(raw)::interval));
    ELSE
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid value for parameter "%s": "%s"', name, raw),
            HINT = CASE WHEN seconds
                        THEN 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".'
                        ELSE 'Set it to a whole number.' END;
    END IF;
    IF v < min OR v > max THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s%s is outside the valid range for parameter "%s" (%s .. %s)',
                             v, CASE WHEN seconds THEN ' s' ELSE '' END, name, min, max),
            HINT = format('Set %s at the database level (ALTER DATABASE ... SET) to a value in range, or RESET it.', name);
    END IF;
    RETURN v::int4;
END
$$;

-- The WARNING of src/error.rs's warn_short_retention: a retention shorter than a minute, or
-- than dedup.lease_duration if that is longer, lets a late duplicate run again.
CREATE FUNCTION dedup._portable_warn_short_retention(what pg_catalog.text, seconds pg_catalog.int8)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    lease int := dedup._portable_setting('dedup.lease_duration', 30, 1, 604800, true);
    than  text;
BEGIN
    IF lease > 60 THEN
        IF seconds >= lease THEN
            RETURN;
        END IF;
        than := format('dedup.lease_duration (%s s)', lease);
    ELSE
        IF seconds >= 60 THEN
            RETURN;
        END IF;
        than := 'a minute';
    END IF;
    RAISE WARNING USING ERRCODE = '01000',
        MESSAGE = format('%s of %s s is shorter than %s', what, seconds, than),
        DETAIL = 'A duplicate that arrives after its claim was pruned runs again: retention must be '
                 'longer than the latest a duplicate can arrive.',
        HINT = 'Size it from the longest redelivery or replay horizon: producer retries, the '
               'visibility or claim timeout, replays from stream history or a dead-letter queue.';
END
$$;

-- Where claims of this database go (src/citus.rs, route): 'local' without Citus (read
-- without a lookup), 'citus' when dedup.processed is distributed by job_id, 'worker_local'
-- on a Citus worker whose claim table is not distributed; a Citus table of another kind is
-- refused. Citus's catalog is read with EXECUTE: it does not exist without Citus.
CREATE FUNCTION dedup._portable_route()
RETURNS pg_catalog.text
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    kind   text;
    worker bool;
BEGIN
    IF current_setting('citus.version', true) IS NULL
       OR to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN 'local';
    END IF;
    EXECUTE 'SELECT d.partmethod::pg_catalog.text FROM pg_catalog.pg_dist_partition AS d
              WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1'
       INTO kind USING 'dedup.processed'::regclass;
    IF kind = 'h' THEN
        RETURN 'citus';
    ELSIF kind IS NOT NULL THEN
        PERFORM dedup._portable_error('not_hash_distributed', 'dedup', NULL, kind);
    END IF;
    IF to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL THEN
        EXECUTE 'SELECT g.groupid OPERATOR(pg_catalog.>) 0 FROM pg_catalog.pg_dist_local_group AS g'
           INTO worker;
    END IF;
    RETURN CASE WHEN worker THEN 'worker_local' ELSE 'local' END;
END
$$;

-- The claim behind dedup.try_claim and dedup._try_claim_fp (src/claim.rs): true when this
-- transaction claimed the job now; false when a claim exists (committed before, or made
-- earlier in this transaction); NULL when it exists with another payload fingerprint.
--
-- SECURITY DEFINER: dedup.try_claim is called by every role (it is PUBLIC) and runs as its
-- caller, while dedup.processed is written by its owner only (REVOKE ALL FROM PUBLIC). The
-- native function writes the table without a privilege check; here this function does, as
-- the owner, exactly what try_claim does and nothing else: every argument is checked first.
--
-- The claim is INSERT ... ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING, the
-- statement whose locking, waiting and isolation the native code reproduces: a concurrent
-- claim of the same key waits for the other transaction; READ COMMITTED then sees its row;
-- REPEATABLE READ and SERIALIZABLE raise 40001 for a row committed after the snapshot.
--
-- The common case (every check passes, no Citus, READ COMMITTED) is one IF, whose
-- expression is true exactly when none of the checks below would raise, and the INSERT:
-- each helper call of the checks is a function call with its own SET search_path (about
-- 2 us), so they run only when one of them is to raise, or on Citus, or at REPEATABLE
-- READ and SERIALIZABLE; then in their order, as before. (<> '' mirrors their = '';
-- <= n their > n; fingerprint may be NULL.)
CREATE FUNCTION dedup._portable_claim(
    func        pg_catalog.text,
    job_id      pg_catalog.text,
    scope       pg_catalog.text,
    fingerprint pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    held record;
BEGIN
    IF job_id <> '' AND octet_length(job_id) <= 1024
       AND (fingerprint IS NULL OR fingerprint <> '' AND octet_length(fingerprint) <= 256)
       AND scope <> '' AND octet_length(scope) <= 128
       AND NOT pg_is_in_recovery()
       AND current_setting('transaction_read_only') <> 'on'
       AND current_setting('citus.version', true) IS NULL
       AND current_setting('transaction_isolation') = 'read committed' THEN
        INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint)
        VALUES (_portable_claim.scope, _portable_claim.job_id, now(), _portable_claim.fingerprint)
        ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
    ELSE
        -- The checks, in the order of src/claim.rs (try_claim_fingerprint, check_key).
        IF job_id IS NULL THEN
            PERFORM dedup._portable_error('null', func, 'job_id');
        END IF;
        PERFORM dedup._portable_check_text(func, 'fingerprint', fingerprint, 256, true);
        IF scope IS NULL THEN
            PERFORM dedup._portable_error('null', func, 'scope');
        END IF;
        PERFORM dedup._portable_check_text(func, 'job_id', job_id, 1024);
        PERFORM dedup._portable_check_text(func, 'scope', scope, 128);
        PERFORM dedup._portable_check_writable(func);
        IF current_setting('citus.version', true) IS NOT NULL
           AND dedup._portable_route() = 'worker_local' THEN
            PERFORM dedup._portable_error('worker_not_distributed', func);
        END IF;

        IF current_setting('transaction_isolation') = 'read committed' THEN
            INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint)
            VALUES (_portable_claim.scope, _portable_claim.job_id, now(), _portable_claim.fingerprint)
            ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
        ELSE
            -- The same statement; its serialization failure gets dedup's message (a
            -- subtransaction per claim, at REPEATABLE READ and SERIALIZABLE only).
            BEGIN
                INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint)
                VALUES (_portable_claim.scope, _portable_claim.job_id, now(), _portable_claim.fingerprint)
                ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING;
            EXCEPTION WHEN serialization_failure THEN
                PERFORM dedup._portable_error('serialization_failure', func);
            END;
        END IF;
    END IF;
    IF FOUND THEN
        RETURN true;
    END IF;

    -- A claim exists: what kind (src/claim.rs, inspect_conflict).
    SELECT p.lease_expires_at, p.fingerprint INTO held
      FROM dedup.processed AS p
     WHERE p.job_id = _portable_claim.job_id AND p.scope = _portable_claim.scope;
    IF NOT FOUND THEN
        -- Deleted since it stopped the INSERT (pruned, forgotten, a lease released): it
        -- existed when this claim looked, as the native claim's conflicting row did.
        RETURN false;
    END IF;
    IF held.lease_expires_at IS NOT NULL THEN
        PERFORM dedup._portable_error('leased', func);
    END IF;
    IF fingerprint IS NOT NULL AND held.fingerprint IS NOT NULL AND held.fingerprint <> fingerprint THEN
        RETURN NULL;
    END IF;
    RETURN false;
END
$$;

-- The batch behind dedup.try_claim_many and dedup._try_claim_many_fp (src/batch.rs): the
-- job ids this call claimed (mismatch false), and those claimed before (or repeated in the
-- array) with another fingerprint (mismatch true), in array order. Each key is claimed once,
-- at its first position, with its first fingerprint that is not NULL; the keys are claimed
-- by one INSERT in canonical order (their bytes: the order of the primary key), so two
-- transactions claiming overlapping batches wait for each other in one order and never
-- deadlock each other. SECURITY DEFINER for the reason _portable_claim is.
CREATE FUNCTION dedup._portable_claim_many(
    job_ids           pg_catalog.text[],
    scope             pg_catalog.text,
    fingerprints      pg_catalog.text[],
    with_fingerprints pg_catalog.bool)
RETURNS TABLE (job_id pg_catalog.text, mismatch pg_catalog.bool)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
AS $$
DECLARE
    f          constant text := 'dedup.try_claim_many';
    n          int;
    bad_pos    bigint;
    bad        text;
    keys       text[];
    firsts     bigint[];
    fps        text[];
    claimed    jsonb;
    first_fp   jsonb;
    r          record;
    mism_pos   bigint[] := '{}';
    mism_key   text[] := '{}';
BEGIN
    IF job_ids IS NULL THEN
        PERFORM dedup._portable_error('null', f, 'job_ids');
    END IF;
    IF with_fingerprints THEN
        IF fingerprints IS NULL THEN
            PERFORM dedup._portable_error('null', f, 'fingerprints');
        END IF;
        IF cardinality(fingerprints) <> cardinality(job_ids) THEN
            PERFORM dedup._portable_error('lengths_differ', f, NULL,
                                          cardinality(job_ids)::text, cardinality(fingerprints)::text);
        END IF;
    ELSE
        fingerprints := NULL;
    END IF;
    n := cardinality(job_ids);
    IF n > 10000 THEN
        PERFORM dedup._portable_error('batch_too_large', f, NULL, n::text, '10000');
    END IF;
    -- Each element (flattened, 1-based) in order: NULL, empty, too long.
    SELECT u.i, u.k INTO bad_pos, bad
      FROM unnest(job_ids) WITH ORDINALITY AS u(k, i)
     WHERE u.k IS NULL OR u.k = '' OR octet_length(u.k) > 1024
     ORDER BY u.i LIMIT 1;
    IF bad_pos IS NOT NULL THEN
        PERFORM dedup._portable_check_text(f, format('job_ids[%s]', bad_pos), bad, 1024);
    END IF;
    IF with_fingerprints THEN
        bad_pos := NULL;
        SELECT u.i, u.k INTO bad_pos, bad
          FROM unnest(fingerprints) WITH ORDINALITY AS u(k, i)
         WHERE u.k = '' OR octet_length(u.k) > 256
         ORDER BY u.i LIMIT 1;
        IF bad_pos IS NOT NULL THEN
            PERFORM dedup._portable_check_text(f, format('fingerprints[%s]', bad_pos), bad, 256);
        END IF;
    END IF;
    IF scope IS NULL THEN
        PERFORM dedup._portable_error('null', f, 'scope');
    END IF;
    PERFORM dedup._portable_check_text(f, 'scope', scope, 128);
    IF n = 0 THEN
        RETURN;
    END IF;
    PERFORM dedup._portable_check_writable(f);
    IF current_setting('citus.version', true) IS NOT NULL
       AND dedup._portable_route() = 'worker_local' THEN
        PERFORM dedup._portable_error('worker_not_distributed', f);
    END IF;

    -- Canonical order, each key once: its first position, its first fingerprint.
    SELECT array_agg(g.k ORDER BY g.k COLLATE "C"),
           array_agg(g.first ORDER BY g.k COLLATE "C"),
           array_agg(g.fp ORDER BY g.k COLLATE "C")
      INTO keys, firsts, fps
      FROM (SELECT u.k, min(u.i) AS first,
                   (array_agg(u.fp ORDER BY u.i) FILTER (WHERE u.fp IS NOT NULL))[1] AS fp
              FROM unnest(job_ids, fingerprints) WITH ORDINALITY AS u(k, fp, i)
             GROUP BY u.k) AS g;

    IF current_setting('transaction_isolation') = 'read committed' THEN
        WITH ins AS (
            INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint)
            SELECT _portable_claim_many.scope, u.k, now(), u.fp
              FROM unnest(keys, fps) WITH ORDINALITY AS u(k, fp, o)
             ORDER BY u.o
            ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING
            RETURNING p.job_id)
        SELECT jsonb_object_agg(ins.job_id, true) INTO claimed FROM ins;
    ELSE
        BEGIN
            WITH ins AS (
                INSERT INTO dedup.processed AS p (scope, job_id, processed_at, fingerprint)
                SELECT _portable_claim_many.scope, u.k, now(), u.fp
                  FROM unnest(keys, fps) WITH ORDINALITY AS u(k, fp, o)
                 ORDER BY u.o
                ON CONFLICT ON CONSTRAINT processed_pkey DO NOTHING
                RETURNING p.job_id)
            SELECT jsonb_object_agg(ins.job_id, true) INTO claimed FROM ins;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM dedup._portable_error('serialization_failure', f);
        END;
    END IF;
    -- The keys claimed now, as the keys of a jsonb object: a lookup is a binary search, where
    -- a join of two unnested arrays could be planned as a nested loop over both.
    claimed := coalesce(claimed, '{}');

    -- The keys not claimed now, in key order: a lease is an error, another fingerprint a
    -- mismatch (at the key's first position). A key whose row is gone since was a duplicate.
    FOR r IN
        SELECT u.k, u.first, u.fp, p.lease_expires_at, p.fingerprint AS stored
          FROM unnest(keys, firsts, fps) WITH ORDINALITY AS u(k, first, fp, o)
          JOIN dedup.processed AS p ON p.scope = _portable_claim_many.scope AND p.job_id = u.k
         WHERE NOT claimed ? u.k
         ORDER BY u.o
    LOOP
        IF r.lease_expires_at IS NOT NULL THEN
            PERFORM dedup._portable_error('leased', f);
        END IF;
        IF r.fp IS NOT NULL AND r.stored IS NOT NULL AND r.stored <> r.fp THEN
            mism_pos := mism_pos || r.first;
            mism_key := mism_key || r.k;
        END IF;
    END LOOP;
    -- A repetition in the array with another fingerprint than the key's first.
    IF with_fingerprints THEN
        SELECT jsonb_object_agg(g.k, g.fp) INTO first_fp
          FROM unnest(keys, fps) AS g(k, fp) WHERE g.fp IS NOT NULL;
        SELECT mism_pos || coalesce(array_agg(u.i ORDER BY u.i), '{}'),
               mism_key || coalesce(array_agg(u.k ORDER BY u.i), '{}')
          INTO mism_pos, mism_key
          FROM unnest(job_ids, fingerprints) WITH ORDINALITY AS u(k, fp, i)
         WHERE u.fp IS NOT NULL AND u.fp <> (first_fp ->> u.k);
    END IF;

    RETURN QUERY
        SELECT x.k, x.m
          FROM (SELECT u.k, false AS m, u.first AS i
                  FROM unnest(keys, firsts) AS u(k, first)
                 WHERE claimed ? u.k
                UNION ALL
                SELECT m.k, true, m.i
                  FROM unnest(mism_key, mism_pos) AS m(k, i)) AS x
         ORDER BY x.i, x.m;
END
$$;

COMMENT ON FUNCTION dedup._portable_claim(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Portable edition: the claim of dedup.try_claim, as the owner of dedup.processed (every argument checked as try_claim checks it).';
COMMENT ON FUNCTION dedup._portable_claim_many(pg_catalog.text[], pg_catalog.text, pg_catalog.text[], pg_catalog.bool) IS
'Portable edition: the batch of dedup.try_claim_many, as the owner of dedup.processed (every argument checked as try_claim_many checks it).';

-- The WARNING of the counter functions (src/stats/sql.rs, warn_not_preloaded), for an edition
-- that has no counters at all.
CREATE FUNCTION dedup._portable_stats_warning(func pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
BEGIN
    RAISE WARNING USING ERRCODE = '01000',
        MESSAGE = format('%s: the portable edition of dedup keeps no counters', func),
        DETAIL = 'Claims work, but nothing is counted: the counters live in the shared memory of the '
                 'native library (shared_preload_libraries = ''dedup''), which the portable edition has not.',
        HINT = 'For the live claims per scope read dedup.table_health(); for pruning, dedup.prune_status.';
END
$$;

-- dedup.retention(scope) once scope is checked: the scope's own retention, or
-- dedup.retention (7 days unless set) as an interval of hours and days. VOLATILE: it reads
-- dedup.scope_retention with a new snapshot, so it sees a set_retention made earlier in the
-- same statement, as the native function's query does.
CREATE FUNCTION dedup._portable_retention(scope pg_catalog.text)
RETURNS pg_catalog.interval
LANGUAGE sql VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $$
    SELECT COALESCE(
        (SELECT r.retention FROM dedup.scope_retention AS r WHERE r.scope = $1),
        justify_hours(make_interval(
            secs => dedup._portable_setting('dedup.retention', 604800, 1, 2147483647, true)::float8)))
$$;
