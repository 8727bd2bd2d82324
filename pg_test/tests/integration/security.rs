//! Privileges and search_path: any role claims; no unprivileged role can write, delete,
//! truncate or read the claim table, or forge a timestamp; objects named like ours earlier
//! on the search_path change nothing.
use crate::common::{claim, ensure_eq, expect_sqlstate, Ctx};
use anyhow::{bail, Result};

pub async fn unprivileged_role_claims_but_cannot_touch_the_table(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let role = format!("worker_{}", ctx.db);
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await?;
    let w = ctx.connect_as(&role).await?;
    w.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&w, "SELECT dedup.try_claim('priv-1')").await?,
        true,
        "claim by an unprivileged role",
    )?;
    ensure_eq(
        claim(&w, "SELECT dedup.try_claim(7::bigint, 'q')").await?,
        true,
        "bigint claim",
    )?;
    ensure_eq(
        claim(&w, "SELECT dedup.try_claim(gen_random_uuid())").await?,
        true,
        "uuid claim",
    )?;
    w.batch_execute("COMMIT").await?;

    for sql in [
        "INSERT INTO dedup.processed VALUES ('default', 'forged', now() + interval '10 years')",
        "UPDATE dedup.processed SET processed_at = now() + interval '10 years'",
        "DELETE FROM dedup.processed",
        "TRUNCATE dedup.processed",
        "SELECT * FROM dedup.processed",
        "COPY dedup.processed FROM STDIN",
        "ALTER TABLE dedup.processed ADD COLUMN x int",
        "DROP TABLE dedup.processed",
        "CREATE TABLE dedup.mine (x int)",
        "CREATE FUNCTION dedup.try_claim(job_id int) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
        "DROP FUNCTION dedup.try_claim(text, text)",
        "ALTER FUNCTION dedup.try_claim(text, text) SECURITY DEFINER",
        "LOCK TABLE dedup.processed IN ACCESS EXCLUSIVE MODE",
        // The catalog of generations decides where claims go (0.7.0): closed too.
        "SELECT * FROM dedup.generations",
        "INSERT INTO dedup.generations VALUES (1, 'mine', 0, 'current', now())",
        "UPDATE dedup.generations SET state = 'retired'",
        "DELETE FROM dedup.generations",
        "TRUNCATE dedup.generations",
    ] {
        w.batch_execute("BEGIN").await?;
        let state = expect_sqlstate(w.batch_execute(sql).await, sql)?;
        // 42501 insufficient_privilege
        ensure_eq(state.as_str(), "42501", sql)?;
        w.batch_execute("ROLLBACK").await?;
    }
    // Nothing changed, and the role's claims carry the server's clock.
    let row = admin
        .query_one(
            "SELECT count(*), bool_and(processed_at BETWEEN now() - interval '5 minutes' AND now()) \
             FROM dedup.processed",
            &[],
        )
        .await?;
    ensure_eq(
        (row.get::<_, i64>(0), row.get::<_, bool>(1)),
        (3, true),
        "claims and their times",
    )?;
    Ok(())
}

pub async fn hostile_search_path_changes_nothing(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let role = format!("mallory_{}", ctx.db);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE {} TO {role}",
            ctx.db
        ))
        .await?;
    let m = ctx.connect_as(&role).await?;
    // Objects named like the ones a careless extension would resolve through search_path.
    m.batch_execute(
        "CREATE SCHEMA evil;
         CREATE TABLE evil.processed (scope text, job_id text, processed_at timestamptz);
         CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
         CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
         CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
         CREATE FUNCTION evil.get_namespace_oid(text) RETURNS oid LANGUAGE sql AS $$ SELECT 0::oid $$;
         CREATE TEMP TABLE processed (scope text, job_id text, processed_at timestamptz);",
    )
    .await?;
    for path in [
        "evil, pg_temp, pg_catalog, dedup",
        "pg_temp, evil, dedup",
        "dedup, evil",
    ] {
        m.batch_execute(&format!("SET search_path = {path}"))
            .await?;
        m.batch_execute("BEGIN").await?;
        ensure_eq(
            claim(&m, "SELECT dedup.try_claim('hostile')").await?,
            path == "evil, pg_temp, pg_catalog, dedup",
            path,
        )?;
        ensure_eq(
            claim(&m, "SELECT dedup.try_claim('hostile')").await?,
            false,
            path,
        )?;
        m.batch_execute("COMMIT").await?;
    }
    let n: i64 = m
        .query_one("SELECT count(*) FROM evil.processed", &[])
        .await?
        .get(0);
    let t: i64 = m
        .query_one("SELECT count(*) FROM pg_temp.processed", &[])
        .await?
        .get(0);
    ensure_eq((n, t), (0, 0), "rows in the look-alike tables")?;
    let row = admin
        .query_one(
            "SELECT count(*), bool_and(processed_at > now() - interval '5 minutes') \
             FROM dedup.processed WHERE job_id = 'hostile'",
            &[],
        )
        .await?;
    ensure_eq(
        (row.get::<_, i64>(0), row.get::<_, bool>(1)),
        (1, true),
        "the real claim",
    )?;
    Ok(())
}

pub async fn create_extension_under_hostile_search_path(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let db = format!("{}_hostile_install", ctx.db);
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let c = dedup_pg_test::connect(&ctx.cluster.dsn(&db)).await?;
    // The portable edition: pg_tle's registration first, or the plain script itself.
    let install = ctx.cluster.install_statement(&db)?;
    c.batch_execute(&format!(
        "CREATE SCHEMA evil;
         CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
         CREATE TABLE evil.processed (x int);
         SET search_path = evil, public;
         {install}
         RESET search_path;"
    ))
    .await?;
    let default_expr: String = c
        .query_one(
            "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef \
             WHERE adrelid = 'dedup.processed'::regclass",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(
        default_expr.as_str(),
        "now()",
        "processed_at default (pg_catalog.now, printed unqualified)",
    )?;
    let funcs: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'evil' AND p.proname = 'try_claim'",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(funcs, 0, "functions created in the hostile schema")?;
    c.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(
            &c,
            "SELECT dedup.try_claim('x') AND dedup.try_claim(1::bigint)",
        )
        .await?,
        true,
        "claims",
    )?;
    c.batch_execute("COMMIT").await?;
    let at_epoch: bool = c
        .query_one(
            "SELECT bool_or(processed_at < '2001-01-01') FROM dedup.processed",
            &[],
        )
        .await?
        .get(0);
    if at_epoch {
        bail!("a claim took its time from evil.now()");
    }
    Ok(())
}

/// A role with only `LOGIN CREATEDB` owns a database, puts operators of its own on the
/// search_path of every session there (`ALTER DATABASE ... SET`, and a superuser's
/// careless `ALTER ROLE ... IN DATABASE ... SET`), and waits for the prune worker, which
/// connects to every database as a superuser. The worker must run none of that code:
/// `mallory` stays unprivileged, and no call of the operators is recorded.
pub async fn worker_runs_no_code_a_database_owner_wrote(_ctx: Ctx) -> Result<()> {
    use crate::worker::{count, eventually, preloaded, start};
    let cluster = start(preloaded("worker-hostile")).await?;
    let admin = dedup_pg_test::connect(&cluster.dsn("postgres")).await?;
    admin
        .batch_execute("CREATE ROLE mallory LOGIN CREATEDB")
        .await?;
    let as_mallory = |db: &str| format!("{} user=mallory", cluster.dsn(db));
    let m = dedup_pg_test::connect(&as_mallory("postgres")).await?;
    // m: without the extension; m_ext: with it (only a superuser can create it there);
    // m_role: the search_path comes from a setting of the worker's own role.
    for db in ["m", "m_ext", "m_role"] {
        m.batch_execute(&format!("CREATE DATABASE {db}")).await?;
    }
    for db in ["m", "m_ext", "m_role"] {
        if db != "m" {
            dedup_pg_test::connect(&cluster.dsn(db))
                .await?
                .batch_execute("CREATE EXTENSION dedup")
                .await?;
        }
        let c = dedup_pg_test::connect(&as_mallory(db)).await?;
        c.batch_execute(
            r#"
            CREATE TABLE public.calls (who name, op text);
            GRANT ALL ON public.calls TO PUBLIC;
            CREATE FUNCTION public.pwn_name(a name, b name) RETURNS bool LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.calls VALUES (current_user, 'name');
                BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
                RETURN a OPERATOR(pg_catalog.=) b;
            END $$;
            CREATE FUNCTION public.pwn_text(a text, b text) RETURNS bool LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.calls VALUES (current_user, 'text');
                BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
                RETURN a OPERATOR(pg_catalog.=) b;
            END $$;
            CREATE FUNCTION public.pwn_ts(a timestamptz, b timestamptz) RETURNS bool LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.calls VALUES (current_user, 'timestamptz');
                BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
                RETURN a OPERATOR(pg_catalog.<) b;
            END $$;
            CREATE OPERATOR public.= (LEFTARG = name, RIGHTARG = name, FUNCTION = public.pwn_name);
            CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.pwn_text);
            CREATE OPERATOR public.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.pwn_ts);
            "#,
        )
        .await?;
        if db == "m_role" {
            admin
                .batch_execute(
                    "ALTER ROLE postgres IN DATABASE m_role SET search_path = public, pg_catalog",
                )
                .await?;
        } else {
            c.batch_execute(&format!(
                "ALTER DATABASE {db} SET search_path = public, pg_catalog"
            ))
            .await?;
        }
    }
    m.batch_execute("ALTER ROLE mallory SET search_path = public, pg_catalog")
        .await?;
    // Expired claims and a scope retention, so the worker has SQL to run in both databases.
    for db in ["m_ext", "m_role"] {
        let c = dedup_pg_test::connect(&cluster.dsn(db)).await?;
        c.batch_execute(
            "SET search_path = pg_catalog;
             INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 100) g;
             SELECT dedup.set_retention('q', '1 day');
             INSERT INTO dedup.processed VALUES ('q', 'old', now() - interval '2 days');",
        )
        .await?;
        eventually(30, &format!("pruning {db}"), || async {
            Ok(count(&c, "SELECT count(*) FROM dedup.processed").await? == 0)
        })
        .await?;
    }
    // A few more passes over every database.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let superuser: bool = admin
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'",
            &[],
        )
        .await?
        .get(0);
    for db in ["m", "m_ext", "m_role"] {
        let c = dedup_pg_test::connect(&cluster.dsn(db)).await?;
        let calls: Vec<String> = c
            .query("SELECT who || ': ' || op FROM public.calls", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        ensure_eq(
            calls,
            Vec::<String>::new(),
            &format!("calls of mallory's operators in {db}"),
        )?;
    }
    ensure_eq(superuser, false, "mallory is a superuser")?;
    Ok(())
}

/// The whole API as a role holding exactly the grants the docs give (docs/operations.md,
/// "Security model": none for claims, leases and results; `pg_monitor` for the counters),
/// with every error raised with its own SQLSTATE, not `42501`.
pub async fn api_works_for_a_role_with_the_documented_grants(ctx: Ctx) -> Result<()> {
    let (role, w) = crate::common::unprivileged(&ctx, "app", "GRANT pg_monitor TO {role};").await?;
    w.batch_execute("SET dedup.warn_outside_transaction = off")
        .await?;
    w.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(
            &w,
            "SELECT dedup.try_claim('a1') AND dedup.try_claim(2::bigint, 'q') \
             AND dedup.try_claim(gen_random_uuid()) AND dedup.try_claim('fp-1', 'default', 'sha-a')",
        )
        .await?,
        true,
        "claims",
    )?;
    w.batch_execute("SELECT dedup.set_result('a1', '{\"n\": 1}')")
        .await?;
    w.batch_execute("COMMIT").await?;
    ensure_eq(
        claim(&w, "SELECT dedup.try_claim('fp-1', 'default', 'sha-a')").await?,
        false,
        "the same fingerprint again",
    )?;
    let r: String = w
        .query_one("SELECT result::text FROM dedup.claim_result('a1')", &[])
        .await?
        .get(0);
    ensure_eq(r.as_str(), "{\"n\": 1}", "claim_result")?;
    for (sql, want) in [
        (
            "SELECT dedup.try_claim('fp-1', 'default', 'sha-b')",
            "YD001",
        ),
        (
            "SELECT * FROM dedup.lease('fp-1', fingerprint => 'sha-b')",
            "YD001",
        ),
        ("SELECT dedup.complete('nope', gen_random_uuid())", "YD002"),
        (
            "SELECT dedup.extend_lease('nope', gen_random_uuid())",
            "YD002",
        ),
        (
            "SELECT dedup.release_lease('nope', gen_random_uuid())",
            "YD002",
        ),
        ("SELECT dedup.try_claim(NULL::text)", "22004"),
        (
            "SELECT * FROM dedup.lease('x', duration => '0 seconds')",
            "22023",
        ),
        ("SELECT dedup.set_result('never', '{}')", "55000"),
    ] {
        ensure_eq(
            expect_sqlstate(w.batch_execute(sql).await, sql)?.as_str(),
            want,
            sql,
        )?;
    }
    // A lease's whole life.
    let row = w
        .query_one(
            "SELECT status, lease_id FROM dedup.lease('l1', duration => '10 seconds')",
            &[],
        )
        .await?;
    let (status, id): (String, uuid::Uuid) = (row.get(0), row.get(1));
    ensure_eq(status.as_str(), "acquired", "lease")?;
    w.execute("SELECT dedup.extend_lease('l1', $1, '20 seconds')", &[&id])
        .await?;
    w.execute("SELECT dedup.complete('l1', $1, '{\"ok\": true}')", &[&id])
        .await?;
    let done: String = w
        .query_one("SELECT status FROM dedup.lease('l1')", &[])
        .await?
        .get(0);
    ensure_eq(done.as_str(), "done", "lease of a completed job")?;
    let row = w
        .query_one("SELECT status, lease_id FROM dedup.lease('l2')", &[])
        .await?;
    let id: uuid::Uuid = row.get(1);
    w.execute("SELECT dedup.release_lease('l2', $1)", &[&id])
        .await?;
    // What a pg_monitor member reads (the counters need preloading: here they say so).
    w.batch_execute(
        "SELECT * FROM dedup.stats; SELECT * FROM dedup.stats_info(); SELECT * FROM dedup.prune_status; \
         SELECT * FROM dedup.expired_summaries(); SELECT * FROM dedup.generation_summaries()",
    )
    .await?;
    ensure_eq(
        claim(&w, "SELECT dedup.retention('q') = interval '7 days'").await?,
        true,
        "dedup.retention",
    )?;
    // And nothing more: the table and the privileged functions stay closed.
    for sql in [
        "SELECT * FROM dedup.processed",
        "SELECT dedup.prune()",
        "SELECT dedup.set_retention('q', '1 day')",
        "SELECT dedup.stats_reset()",
        "SELECT dedup._raise('YD001', 'forged', 'forged')",
        "SELECT dedup.use_generations()",
        "SELECT dedup.rotate_generations()",
        "SELECT dedup.rotate_generations(publish => true)",
        "SELECT * FROM dedup.claims()",
        "SELECT * FROM dedup.generations",
    ] {
        ensure_eq(
            expect_sqlstate(w.batch_execute(sql).await, sql)?.as_str(),
            "42501",
            sql,
        )?;
    }
    let _ = role;
    Ok(())
}

/// `CREATE EXTENSION dedup` used to adopt a schema dedup that already existed, whoever made
/// it. A role with CREATE on the database (a CREATEDB role in its own database, an
/// application role that runs migrations) makes the schema first, with a more specific
/// overload of the API in it (`try_claim(integer)`, which the documented `try_claim(42)`
/// resolves to): the install must refuse it, and refuse a schema that grants CREATE to such
/// a role or already holds objects; an empty schema a superuser owns (what a restore of
/// pg_dump's output makes) is accepted. Before the fix the install succeeded and
/// `try_claim(42)` answered `true` for every copy.
pub async fn create_extension_refuses_a_schema_it_did_not_make(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    let maker = format!("maker_{}", ctx.db);
    admin
        .batch_execute(&format!("CREATE ROLE {maker} LOGIN"))
        .await?;
    // (setup in the premade database, then the install, and its SQLSTATE or None)
    let cases: [(&str, &str, Option<&str>); 4] = [
        (
            "a schema a plain role made, with an overload",
            "SET ROLE {maker}; CREATE SCHEMA dedup; \
             CREATE FUNCTION dedup.try_claim(job_id integer, scope text DEFAULT 'default') \
             RETURNS boolean LANGUAGE sql AS 'SELECT true'; RESET ROLE;",
            Some("42501"),
        ),
        (
            "a superuser's schema that grants CREATE to PUBLIC",
            "CREATE SCHEMA dedup; GRANT CREATE ON SCHEMA dedup TO PUBLIC;",
            Some("42501"),
        ),
        (
            "a superuser's schema that holds a table",
            "CREATE SCHEMA dedup; CREATE TABLE dedup.notes (x int);",
            Some("55000"),
        ),
        (
            "an empty schema a superuser owns, as a restore makes it",
            "CREATE SCHEMA dedup;",
            None,
        ),
    ];
    for (i, (what, setup, want)) in cases.iter().enumerate() {
        let db = format!("{}_premade{i}", ctx.db);
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await?;
        admin
            .batch_execute(&format!("GRANT CREATE ON DATABASE {db} TO {maker}"))
            .await?;
        let c = dedup_pg_test::connect(&ctx.cluster.dsn(&db)).await?;
        c.batch_execute(&setup.replace("{maker}", &maker)).await?;
        let install = ctx.cluster.install_statement(&db)?;
        let result = c.batch_execute(&install).await;
        match want {
            Some(state) => {
                let got = expect_sqlstate(result, what)?;
                ensure_eq(got.as_str(), *state, what)?;
                let installed: i64 = c
                    .query_one(
                        "SELECT count(*) FROM pg_extension WHERE extname = 'dedup'",
                        &[],
                    )
                    .await?
                    .get(0);
                ensure_eq(installed, 0, &format!("{what}: extensions installed"))?;
            }
            None => {
                result.map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
                c.batch_execute("BEGIN").await?;
                ensure_eq(
                    claim(&c, "SELECT dedup.try_claim(42)").await?,
                    true,
                    &format!("{what}: a first claim"),
                )?;
                c.batch_execute("COMMIT").await?;
                ensure_eq(
                    claim(&c, "SELECT dedup.try_claim(42)").await?,
                    false,
                    &format!("{what}: the second copy"),
                )?;
            }
        }
        drop(c);
        admin
            .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
            .await?;
    }
    Ok(())
}

/// The claim path looks the table up by name, so a table dedup.processed that is not the
/// extension's (the extension's schema renamed by a role that owned it, and a look-alike
/// made in its place) must be refused, never written to. Before the fix the claim went
/// into the look-alike.
pub async fn a_look_alike_claim_table_is_refused(ctx: Ctx) -> Result<()> {
    let admin = ctx.connect().await?;
    admin
        .batch_execute(
            "ALTER SCHEMA dedup RENAME TO dedup_real; \
             CREATE SCHEMA dedup; \
             CREATE TABLE dedup.processed (LIKE dedup_real.processed INCLUDING ALL)",
        )
        .await?;
    let c = ctx.connect().await?;
    c.batch_execute("BEGIN").await?;
    let result = c.query_one("SELECT dedup_real.try_claim('x')", &[]).await;
    let state = expect_sqlstate(result, "a claim with a look-alike dedup.processed");
    c.batch_execute("ROLLBACK").await?;
    let written: i64 = admin
        .query_one("SELECT count(*) FROM dedup.processed", &[])
        .await?
        .get(0);
    admin
        .batch_execute("DROP SCHEMA dedup CASCADE; ALTER SCHEMA dedup_real RENAME TO dedup")
        .await?;
    ensure_eq(state?.as_str(), "55000", "SQLSTATE")?;
    ensure_eq(written, 0, "rows written into the look-alike")?;
    Ok(())
}

/// The worker runs as a superuser in every database; where the extension's schema is one a
/// plain role controls (it owns it, as an install before 0.6.0 that adopted a pre-made
/// schema left it, or holds CREATE on it), that role could rename it and put look-alikes
/// in its place. The worker must skip such a database with a warning, and go on pruning
/// the others. Before the fix it pruned there as everywhere.
pub async fn worker_skips_a_schema_a_plain_role_controls(_ctx: Ctx) -> Result<()> {
    use crate::worker::{count, database_with_claims, eventually, preloaded, start, EXPIRED};
    let cluster = start(preloaded("worker-schema")).await?;
    let admin = dedup_pg_test::connect(&cluster.dsn("postgres")).await?;
    admin.batch_execute("CREATE ROLE mallory LOGIN").await?;
    // The expired claims go in after the schema is changed: a pass in between would prune
    // them (the worker runs every second).
    let owned = database_with_claims(&cluster, "owned", 0, 10).await?;
    let granted = database_with_claims(&cluster, "granted", 0, 10).await?;
    let fine = database_with_claims(&cluster, "fine", 500, 10).await?;
    owned
        .batch_execute("ALTER SCHEMA dedup OWNER TO mallory")
        .await?;
    granted
        .batch_execute("GRANT CREATE ON SCHEMA dedup TO mallory")
        .await?;
    for c in [&owned, &granted] {
        c.batch_execute(
            "INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' \
               FROM generate_series(1, 500) g",
        )
        .await?;
    }
    eventually(30, "the database whose schema is safe pruned", || async {
        Ok(count(&fine, EXPIRED).await? == 0)
    })
    .await?;
    // Two more passes' time for the others.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    ensure_eq(
        count(&owned, EXPIRED).await?,
        500,
        "expired claims left where mallory owns the schema",
    )?;
    ensure_eq(
        count(&granted, EXPIRED).await?,
        500,
        "expired claims left where mallory may create in it",
    )?;
    let log = cluster.log_text();
    for db in ["owned", "granted"] {
        let want =
            format!("dedup: not pruning database \"{db}\": the schema of its extension dedup");
        if !log.contains(&want) {
            bail!("the server log lacks {want:?}:\n{}", cluster.log_tail(30));
        }
    }
    Ok(())
}

/// Every privilege a fresh install grants on dedup's functions, tables and views is the
/// one the security model (docs/operations.md, the table under "Security model") lists:
/// EXECUTE and SELECT for PUBLIC and for pg_monitor exactly as its rows name them, USAGE on
/// the schema for PUBLIC, and nothing to any other role: no column grant, no grant option.
/// A grant added without the docs, or documented without the grant, fails here. (Functions
/// are matched by name: the docs name a function once for all its forms.)
pub async fn grants_are_the_documented_ones(ctx: Ctx) -> Result<()> {
    let doc = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )?;
    // The names in backticks of the row that starts with `start`, without `dedup.` and `()`.
    let row = |start: &str| -> Result<std::collections::BTreeSet<String>> {
        let line = doc
            .lines()
            .find(|l| l.starts_with(start))
            .ok_or_else(|| anyhow::anyhow!("docs/operations.md has no row {start:?}"))?;
        Ok(line
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|t| {
                t.trim_start_matches("dedup.")
                    .trim_end_matches("()")
                    .to_string()
            })
            .collect())
    };
    let public_doc = row("| any role (`PUBLIC`) |")?;
    let monitor_doc = row("| `pg_monitor` members |")?;
    let c = ctx.connect().await?;
    // (kind, name, grantee, privilege) of every privilege not the owner's own.
    let granted: Vec<(String, String, String, String)> = c
        .query(
            "SELECT 'function', p.proname::text, coalesce(r.rolname::text, 'PUBLIC'), a.privilege_type
               FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'dedup'
              CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
               LEFT JOIN pg_roles r ON r.oid = a.grantee
              WHERE a.grantee <> p.proowner
             UNION ALL
             SELECT 'relation', c.relname::text, coalesce(r.rolname::text, 'PUBLIC'), a.privilege_type
               FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'dedup'
              CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
               LEFT JOIN pg_roles r ON r.oid = a.grantee
              WHERE a.grantee <> c.relowner AND c.relkind IN ('r', 'v', 'p')
             UNION ALL
             SELECT 'column', c.relname::text || '.' || t.attname::text, coalesce(r.rolname::text, 'PUBLIC'),
                    a.privilege_type
               FROM pg_attribute t
               JOIN pg_class c ON c.oid = t.attrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'dedup'
              CROSS JOIN LATERAL aclexplode(t.attacl) a
               LEFT JOIN pg_roles r ON r.oid = a.grantee
              WHERE a.grantee <> c.relowner
             UNION ALL
             SELECT 'grant option', p.proname::text, coalesce(r.rolname::text, 'PUBLIC'), a.privilege_type
               FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'dedup'
              CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
               LEFT JOIN pg_roles r ON r.oid = a.grantee
              WHERE a.grantee <> p.proowner AND a.is_grantable
             UNION ALL
             SELECT 'schema', n.nspname::text, coalesce(r.rolname::text, 'PUBLIC'), a.privilege_type
               FROM pg_namespace n
              CROSS JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
               LEFT JOIN pg_roles r ON r.oid = a.grantee
              WHERE n.nspname = 'dedup' AND a.grantee <> n.nspowner",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let mut wrong = Vec::new();
    for (kind, name, grantee, privilege) in &granted {
        let documented = match (kind.as_str(), grantee.as_str(), privilege.as_str()) {
            ("function", "PUBLIC", "EXECUTE") => public_doc.contains(name),
            ("function", "pg_monitor", "EXECUTE") => monitor_doc.contains(name),
            ("relation", "PUBLIC", "SELECT") => public_doc.contains(name),
            ("relation", "pg_monitor", "SELECT") => monitor_doc.contains(name),
            ("schema", "PUBLIC", "USAGE") => true,
            _ => false,
        };
        if !documented {
            wrong.push(format!(
                "{privilege} on {kind} {name} to {grantee}: not in the security model"
            ));
        }
    }
    // And every name the two rows give that is a function or relation of dedup is granted.
    let has =
        |name: &str, grantee: &str| granted.iter().any(|(_, n, g, _)| n == name && g == grantee);
    let objects: std::collections::BTreeSet<String> = c
        .query(
            "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'dedup'
             UNION SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'dedup' AND c.relkind IN ('r', 'v', 'p')",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (names, grantee) in [(&public_doc, "PUBLIC"), (&monitor_doc, "pg_monitor")] {
        for name in names.iter().filter(|n| objects.contains(*n)) {
            if !has(name, grantee) {
                wrong.push(format!(
                    "{name}: the security model grants it to {grantee}, the catalog does not"
                ));
            }
        }
    }
    if !wrong.is_empty() {
        bail!(
            "grants and docs/operations.md differ:\n{}",
            wrong.join("\n")
        );
    }
    println!(
        "  {} privileges granted, each in the security model",
        granted.len()
    );
    Ok(())
}
