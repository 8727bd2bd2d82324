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
    c.batch_execute(
        "CREATE SCHEMA evil;
         CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
         CREATE TABLE evil.processed (x int);
         SET search_path = evil, public;
         CREATE EXTENSION dedup;
         RESET search_path;",
    )
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
