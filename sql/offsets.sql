-- dedup's offsets per partition, and try_claim_many with payload fingerprints.
--
-- For an ordered, partitioned log (Kafka, Redis Streams, Kinesis) the cheapest exact record
-- of what was done is one position per partition, raised in the transaction of the effects:
-- one row per (stream, partition), nothing to prune.

CREATE TABLE dedup.offsets (
    stream      pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    partition   pg_catalog.int4 NOT NULL,
    "position"  pg_catalog.int8 NOT NULL,
    advanced_at pg_catalog.timestamptz NOT NULL,
    owner       pg_catalog.regrole NOT NULL,
    CONSTRAINT offsets_pkey PRIMARY KEY (stream, partition)
);
COMMENT ON TABLE dedup.offsets IS
    'The position of each partition of an ordered log, raised by dedup.advance in the transaction of the effects.';
COMMENT ON COLUMN dedup.offsets.owner IS
    'The role whose members (and superusers) may advance the partition: the role that first advanced its stream.';
REVOKE ALL ON TABLE dedup.offsets FROM PUBLIC;
GRANT SELECT ON TABLE dedup.offsets TO pg_monitor;
SELECT pg_catalog.pg_extension_config_dump('dedup.offsets', '');

-- Who may advance (stream, partition): a role with the privileges of the partition's owner
-- (pg_has_role USAGE: the owner, a member of it, a superuser); for a partition the stream
-- does not have yet, of the owner of every partition it has. Anyone else is refused
-- (42501), so no role moves another's marks (advance(stream, 0, 9223372036854775807) made
-- every later entry of a partition "done" for ever). Returns the owner the partition's row
-- has or gets: a new partition takes the owner of the stream's lowest partition, a new
-- stream its caller (dedup._caller(): the session's role, or the role of SET ROLE). The
-- first partitions of a new stream are made one transaction at a time (an advisory lock on
-- the stream's name, held to the end of the transaction), so that at READ COMMITTED a role
-- racing the owner's first advance waits and then sees the owner's row; at SERIALIZABLE
-- the read of the stream's rows conflicts instead (40001). At REPEATABLE READ a snapshot
-- taken before the owner's first advance committed does not see it: such a role can then
-- make another partition of the new stream, as it could have made the stream first, and
-- each is then refused the other's partitions and any new one (42501), never told that
-- an entry is done.
-- dedup.advance checks again in its ON CONFLICT DO UPDATE (the row it updates, locked):
-- an owner changed or a row made by another role since this read is refused there. Not
-- granted: dedup.advance calls it as the extension's owner; every name is qualified.
CREATE FUNCTION dedup._offset_owner(stream pg_catalog.text, partition pg_catalog.int4, caller pg_catalog.name)
RETURNS pg_catalog.regrole
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    held_by    pg_catalog.regrole;
    refused_at pg_catalog.int4;
BEGIN
    SELECT o.owner INTO held_by FROM dedup.offsets AS o
     WHERE o.stream OPERATOR(pg_catalog.=) $1 AND o.partition OPERATOR(pg_catalog.=) $2;
    IF FOUND THEN
        IF pg_catalog.pg_has_role($3, held_by::pg_catalog.oid, 'USAGE') THEN
            RETURN held_by;
        END IF;
        refused_at := $2;
    ELSE
        IF NOT EXISTS (SELECT FROM dedup.offsets AS o WHERE o.stream OPERATOR(pg_catalog.=) $1) THEN
            PERFORM pg_catalog.pg_advisory_xact_lock(
                'dedup.offsets'::pg_catalog.regclass::pg_catalog.oid::pg_catalog.int4, pg_catalog.hashtext($1));
        END IF;
        SELECT o.partition, o.owner INTO refused_at, held_by FROM dedup.offsets AS o
         WHERE o.stream OPERATOR(pg_catalog.=) $1
           AND NOT pg_catalog.pg_has_role($3, o.owner::pg_catalog.oid, 'USAGE')
         ORDER BY o.partition LIMIT 1;
        IF NOT FOUND THEN
            SELECT coalesce((SELECT o.owner FROM dedup.offsets AS o WHERE o.stream OPERATOR(pg_catalog.=) $1
                              ORDER BY o.partition LIMIT 1),
                            (SELECT r.oid::pg_catalog.regrole FROM pg_catalog.pg_roles AS r
                              WHERE r.rolname OPERATOR(pg_catalog.=) $3))
              INTO held_by;
            RETURN held_by;
        END IF;
    END IF;
    PERFORM dedup._raise('42501',
        pg_catalog.format('dedup.advance: role %s may not advance stream %L: its partition %s belongs to role %s',
                          pg_catalog.quote_ident($3), $1, refused_at, held_by),
        pg_catalog.format('Advance it as %1$s or as a member of %1$s (GRANT %1$s TO %2$s). An administrator can give '
                          'the stream to another role: UPDATE dedup.offsets SET owner = ''new_owner'' WHERE stream = %3$L.',
                          held_by, pg_catalog.quote_ident($3), $1));
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION dedup._offset_owner(pg_catalog.text, pg_catalog.int4, pg_catalog.name) FROM PUBLIC;

-- true: position is above the partition's mark, which is raised to it in the caller's
-- transaction (committed or rolled back with the effects); false: at or below it (a
-- redelivery or a rewind). A concurrent advance of the same partition waits for the other
-- transaction, then (READ COMMITTED) compares with what it committed; at REPEATABLE READ
-- or SERIALIZABLE that is a serialization failure (40001), as for any ON CONFLICT DO
-- UPDATE of a row updated since the snapshot.
CREATE FUNCTION dedup.advance(stream pg_catalog.text, partition pg_catalog.int4, "position" pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised boolean;
    me     pg_catalog.name := dedup._caller()::pg_catalog.name;
BEGIN
    PERFORM dedup._check_offset('dedup.advance', $1, $2, $3);
    -- Refused (42501) unless the caller has the privileges of the partition's owner
    -- (dedup._offset_owner); checked again on the row the update locks.
    INSERT INTO dedup.offsets AS o (stream, partition, "position", advanced_at, owner)
    VALUES ($1, $2, $3, now(), dedup._offset_owner($1, $2, me))
    ON CONFLICT ON CONSTRAINT offsets_pkey DO UPDATE
        SET "position" = excluded."position", advanced_at = excluded.advanced_at
        WHERE o."position" < excluded."position"
          AND pg_catalog.pg_has_role(me, o.owner::pg_catalog.oid, 'USAGE');
    raised := FOUND;
    IF NOT raised THEN
        -- At or below the mark, or the row changed hands since the check: refused then.
        PERFORM dedup._offset_owner($1, $2, me);
    END IF;
    PERFORM dedup._count($1, CASE WHEN raised THEN 'advance' ELSE 'stale' END);
    RETURN raised;
END
$$;
COMMENT ON FUNCTION dedup.advance(pg_catalog.text, pg_catalog.int4, pg_catalog.int8) IS
'true when position is above the stored mark of (stream, partition), which it raises in the caller''s transaction; false for a position at or below it (a redelivery or a rewind). Only a role with the privileges of the partition''s owner (dedup.offsets.owner) may advance it: 42501 for others.';

-- A batch from first_position to last_position: true when the stored mark is below
-- first_position (none of the batch is done), and then raised to last_position; false when
-- any of the batch is at or below the mark (another consumer, during a rebalance, did it
-- or part of it: read again from dedup.position). The three-argument form cannot tell a
-- batch that is partly done from one that is not.
CREATE FUNCTION dedup.advance(stream pg_catalog.text, partition pg_catalog.int4,
                              first_position pg_catalog.int8, last_position pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raised boolean;
    me     pg_catalog.name := dedup._caller()::pg_catalog.name;
BEGIN
    PERFORM dedup._check_offset('dedup.advance', $1, $2, $3);
    PERFORM dedup._check_offset('dedup.advance', $1, $2, $4);
    IF $3 > $4 THEN
        PERFORM dedup._raise('22023',
            pg_catalog.format('dedup.advance: first_position %s is after last_position %s', $3, $4),
            'Pass the positions of the batch''s first and last entries.');
    END IF;
    INSERT INTO dedup.offsets AS o (stream, partition, "position", advanced_at, owner)
    VALUES ($1, $2, $4, now(), dedup._offset_owner($1, $2, me))
    ON CONFLICT ON CONSTRAINT offsets_pkey DO UPDATE
        SET "position" = excluded."position", advanced_at = excluded.advanced_at
        WHERE o."position" < $3
          AND pg_catalog.pg_has_role(me, o.owner::pg_catalog.oid, 'USAGE');
    raised := FOUND;
    IF NOT raised THEN
        PERFORM dedup._offset_owner($1, $2, me);
    END IF;
    PERFORM dedup._count($1, CASE WHEN raised THEN 'advance' ELSE 'stale' END);
    RETURN raised;
END
$$;
COMMENT ON FUNCTION dedup.advance(pg_catalog.text, pg_catalog.int4, pg_catalog.int8, pg_catalog.int8) IS
'For a batch of entries first_position..last_position: true when the stored mark is below first_position (none of it done), raising it to last_position in the caller''s transaction; false when any of it is at or below the mark. Only a role with the privileges of the partition''s owner may advance it: 42501 for others.';

-- The stored mark (NULL when none): where a consumer seeks on start.
CREATE FUNCTION dedup.position(stream pg_catalog.text, partition pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._check_offset('dedup.position', $1, $2, 0);
    RETURN (SELECT o."position" FROM dedup.offsets AS o WHERE o.stream = $1 AND o.partition = $2);
END
$$;
COMMENT ON FUNCTION dedup.position(pg_catalog.text, pg_catalog.int4) IS
'The stored mark of (stream, partition), NULL when none: where a consumer of the partition seeks on start.';

-- Every partition's stored mark of a stream, in partition order: where a consumer that is
-- given several partitions (a Kafka consumer group's rebalance) seeks each of them on
-- start, in one call instead of one dedup.position per partition.
CREATE FUNCTION dedup.positions(stream pg_catalog.text,
    OUT partition pg_catalog.int4, OUT "position" pg_catalog.int8)
RETURNS SETOF record
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dedup._check_offset('dedup.positions', $1, 0, 0);
    RETURN QUERY SELECT o.partition, o."position" FROM dedup.offsets AS o
                  WHERE o.stream = $1 ORDER BY o.partition;
END
$$;
COMMENT ON FUNCTION dedup.positions(pg_catalog.text) IS
'Every partition''s stored mark of stream, in partition order (no row for a partition never advanced): where a consumer seeks each of its partitions on start.';

REVOKE ALL ON FUNCTION dedup._check_offset(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int8) FROM PUBLIC;

-- try_claim_many with payload fingerprints, one per job id (NULL: none): a job claimed
-- before with another fingerprint raises YD001, as try_claim(job_id, scope, fingerprint)
-- does. PL/pgSQL over the library's dedup._try_claim_many_fp, reading all of its rows
-- first: the error comes before any row, however the caller reads them.
CREATE FUNCTION dedup._claimed_or_mismatch(job_ids pg_catalog.text[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS pg_catalog.text[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    claimed    text[];
    mismatched text;
BEGIN
    SELECT array_agg(r.job_id ORDER BY r.n) FILTER (WHERE NOT r.mismatch),
           (array_agg(r.job_id ORDER BY r.n) FILTER (WHERE r.mismatch))[1]
      INTO claimed, mismatched
      FROM dedup._try_claim_many_fp(job_ids, scope, fingerprints) WITH ORDINALITY AS r(job_id, mismatch, n);
    IF mismatched IS NOT NULL THEN
        PERFORM dedup._fingerprint_mismatch('dedup.try_claim_many', mismatched, scope);
    END IF;
    RETURN coalesce(claimed, '{}');
END
$$;
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.text[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS SETOF pg_catalog.text
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT pg_catalog.unnest(dedup._claimed_or_mismatch(job_ids, scope, fingerprints))
$$;
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.int8[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS SETOF pg_catalog.int8
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT pg_catalog.unnest(dedup._claimed_or_mismatch(job_ids::pg_catalog.text[], scope, fingerprints))::pg_catalog.int8
$$;
CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.uuid[], scope pg_catalog.text, fingerprints pg_catalog.text[])
RETURNS SETOF pg_catalog.uuid
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
    SELECT pg_catalog.unnest(dedup._claimed_or_mismatch(job_ids::pg_catalog.text[], scope, fingerprints))::pg_catalog.uuid
$$;
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.text[], pg_catalog.text, pg_catalog.text[]) IS
'dedup.try_claim_many with a payload fingerprint per job id (NULL: none): a job claimed before with another fingerprint raises YD001.';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.int8[], pg_catalog.text, pg_catalog.text[]) IS
'dedup.try_claim_many with fingerprints, for bigint job ids.';
COMMENT ON FUNCTION dedup.try_claim_many(pg_catalog.uuid[], pg_catalog.text, pg_catalog.text[]) IS
'dedup.try_claim_many with fingerprints, for uuid job ids.';
