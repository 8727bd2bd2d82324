-- dedup's claims: the schema and the managed claim table. Runs first in CREATE EXTENSION,
-- with search_path set to the extension's schema; every name is qualified anyway.

-- The schema dedup must be the one this CREATE EXTENSION made, or one as safe: CREATE EXTENSION adopts a schema of that name that exists already, whoever
-- made it, and its owner could then add overloads of the API that run their code as every
-- caller, drop every claim with DROP SCHEMA ... CASCADE, or rename it under the worker. So
-- it must be owned by a superuser or the installing role, grant CREATE to no other role
-- that is not a superuser, and be empty. A restore passes: pg_dump's CREATE SCHEMA dedup
-- (owned by the role that owned it) comes right before CREATE EXTENSION, and the schema's
-- grants after it. Every operator is named with its schema: the search_path here is the
-- very schema being checked, where a role with CREATE could have put an operator.
DO $dedup_schema$
DECLARE
    v_nsp   pg_catalog.oid;
    v_owner pg_catalog.oid;
    v_acl   pg_catalog.aclitem[];
    v_super pg_catalog.bool;
    v_who   pg_catalog.text;
    v_what  pg_catalog.text;
BEGIN
    SELECT n.oid, n.nspowner, n.nspacl, r.rolsuper INTO v_nsp, v_owner, v_acl, v_super
      FROM pg_catalog.pg_namespace AS n
      JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'dedup';
    IF NOT v_super AND v_owner OPERATOR(pg_catalog.<>)
           (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('CREATE EXTENSION dedup: the schema dedup exists already and belongs to %s, who is not a superuser',
                                        v_owner::pg_catalog.regrole),
            HINT = 'CREATE EXTENSION dedup makes its own schema dedup: see what that schema holds, move anything of value out of it, drop or rename it, then create the extension again.';
    END IF;
    SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                                   ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END, ', ')
      INTO v_who
      FROM pg_catalog.aclexplode(v_acl) AS a
      LEFT JOIN pg_catalog.pg_roles AS g ON g.oid OPERATOR(pg_catalog.=) a.grantee
     WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
       AND a.grantee OPERATOR(pg_catalog.<>) v_owner
       AND NOT COALESCE(g.rolsuper, false);
    IF v_who IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('CREATE EXTENSION dedup: the schema dedup exists already and grants CREATE to %s', v_who),
            HINT = 'Only superusers may create objects in the schema dedup: REVOKE CREATE ON SCHEMA dedup from them (after checking what they put there), then create the extension again.';
    END IF;
    SELECT pg_catalog.string_agg(o.what, ', ') INTO v_what FROM (
        SELECT 'relation ' OPERATOR(pg_catalog.||) c.relname::pg_catalog.text AS what FROM pg_catalog.pg_class AS c WHERE c.relnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'function ' OPERATOR(pg_catalog.||) p.oid::pg_catalog.regprocedure::pg_catalog.text FROM pg_catalog.pg_proc AS p WHERE p.pronamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'type ' OPERATOR(pg_catalog.||) t.typname::pg_catalog.text FROM pg_catalog.pg_type AS t WHERE t.typnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'operator ' OPERATOR(pg_catalog.||) o.oprname::pg_catalog.text FROM pg_catalog.pg_operator AS o WHERE o.oprnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'collation ' OPERATOR(pg_catalog.||) c.collname::pg_catalog.text FROM pg_catalog.pg_collation AS c WHERE c.collnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'conversion ' OPERATOR(pg_catalog.||) c.conname::pg_catalog.text FROM pg_catalog.pg_conversion AS c WHERE c.connamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'operator class ' OPERATOR(pg_catalog.||) c.opcname::pg_catalog.text FROM pg_catalog.pg_opclass AS c WHERE c.opcnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'operator family ' OPERATOR(pg_catalog.||) f.opfname::pg_catalog.text FROM pg_catalog.pg_opfamily AS f WHERE f.opfnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'text search configuration ' OPERATOR(pg_catalog.||) c.cfgname::pg_catalog.text FROM pg_catalog.pg_ts_config AS c WHERE c.cfgnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'text search dictionary ' OPERATOR(pg_catalog.||) d.dictname::pg_catalog.text FROM pg_catalog.pg_ts_dict AS d WHERE d.dictnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'text search parser ' OPERATOR(pg_catalog.||) p.prsname::pg_catalog.text FROM pg_catalog.pg_ts_parser AS p WHERE p.prsnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'text search template ' OPERATOR(pg_catalog.||) t.tmplname::pg_catalog.text FROM pg_catalog.pg_ts_template AS t WHERE t.tmplnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'statistics object ' OPERATOR(pg_catalog.||) s.stxname::pg_catalog.text FROM pg_catalog.pg_statistic_ext AS s WHERE s.stxnamespace OPERATOR(pg_catalog.=) v_nsp
        UNION ALL SELECT 'extension ' OPERATOR(pg_catalog.||) e.extname::pg_catalog.text FROM pg_catalog.pg_extension AS e
         WHERE e.extnamespace OPERATOR(pg_catalog.=) v_nsp AND e.extname OPERATOR(pg_catalog.<>) 'dedup'
        UNION ALL SELECT 'default privileges of ' OPERATOR(pg_catalog.||) d.defaclrole::pg_catalog.regrole::pg_catalog.text FROM pg_catalog.pg_default_acl AS d WHERE d.defaclnamespace OPERATOR(pg_catalog.=) v_nsp
    ) AS o;
    IF v_what IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'CREATE EXTENSION dedup: the schema dedup exists already and is not empty',
            DETAIL = pg_catalog.format('It holds: %s.', v_what),
            HINT = 'CREATE EXTENSION dedup makes its own schema dedup: move what that schema holds out of it, drop or rename it, then create the extension again.';
    END IF;
END
$dedup_schema$;

-- One table for claims and leases. A row's state follows from its lease columns:
--   lease_expires_at IS NULL      done: a try_claim claim, or a completed lease (lease_id kept)
--   lease_expires_at IS NOT NULL  a lease, live until lease_expires_at, then free to take over
-- Pruning deletes done rows and expired leases older than their retention, never a live lease.
CREATE TABLE dedup.processed (
    scope            pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    job_id           pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    processed_at     pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    fingerprint      pg_catalog.text COLLATE pg_catalog."C",
    result           pg_catalog.jsonb,
    lease_id         pg_catalog.uuid,
    lease_expires_at pg_catalog.timestamptz,
    CONSTRAINT processed_pkey PRIMARY KEY (job_id, scope)
);

COMMENT ON TABLE dedup.processed IS
    'Claims taken by dedup.try_claim: one row per (scope, job_id), written in the claiming transaction.';
COMMENT ON COLUMN dedup.processed.fingerprint IS
    'The payload fingerprint the job was first claimed with, if any.';
COMMENT ON COLUMN dedup.processed.result IS
    'The result stored with the job (dedup.set_result, dedup.complete), for dedup.claim_result.';
COMMENT ON COLUMN dedup.processed.lease_id IS
    'The lease that holds or completed the job (dedup.lease); NULL for a try_claim claim.';
COMMENT ON COLUMN dedup.processed.lease_expires_at IS
    'Until when the lease holds the job; NULL once done.';

-- Nobody but the owner writes this table directly: try_claim is the only way in, so
-- no role can forge processed_at, delete a claim or truncate the table.
REVOKE ALL ON TABLE dedup.processed FROM PUBLIC;
GRANT USAGE ON SCHEMA dedup TO PUBLIC;

-- pg_dump dumps the claims with the extension, so dump and restore keep them.
SELECT pg_catalog.pg_extension_config_dump('dedup.processed', '');
