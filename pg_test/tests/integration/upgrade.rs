//! Upgrades keep claims: install the oldest released version from its full install script
//! (kept in pg_test/fixtures), take claims, `ALTER EXTENSION dedup UPDATE`, and check that
//! the claims and the whole API work.
use crate::common::{claim, ensure_eq, Ctx};
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

const OLDEST: &str = "0.1.0";

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/dedup--{OLDEST}.sql"))
}

/// An install script as a set of its pgrx "connected objects" blocks, without the
/// `-- src/file.rs:LINE` comments (pgrx orders blocks unstably and lines move).
fn blocks(script: &str) -> BTreeSet<String> {
    script
        .split("/* <begin connected objects> */")
        .map(|b| {
            b.lines()
                .filter(|l| !(l.starts_with("-- src/") && l.contains(".rs:")))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_string()
        })
        .filter(|b| !b.is_empty())
        .collect()
}

/// Everything about the extension's objects that an upgrade script must get right: each
/// member object with its definition, columns, indexes, constraints, replica identity,
/// privileges and comment; the tables pg_dump dumps; the schema's privileges.
const CATALOG_SIGNATURE: &str = r#"
WITH ext AS (SELECT oid, extconfig FROM pg_extension WHERE extname = 'dedup'),
members AS (
    SELECT d.classid, d.objid, d.objsubid FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e')
SELECT pg_describe_object(m.classid, m.objid, m.objsubid) || ' ' || coalesce(CASE m.classid
    WHEN 'pg_proc'::regclass THEN (
        SELECT pg_get_functiondef(p.oid) || ' acl=' || coalesce(p.proacl::text, '-')
               || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
          FROM pg_proc p WHERE p.oid = m.objid)
    WHEN 'pg_class'::regclass THEN (
        SELECT c.relkind::text || ' replica identity=' || c.relreplident::text
               || ' acl=' || coalesce(c.relacl::text, '-')
               || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '-')
               || ' columns=' || coalesce((
                    SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                      || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                      || ' collate ' || coalesce(co.collname, '-')
                                      || ' default ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-'),
                                      ', ' ORDER BY a.attnum)
                      FROM pg_attribute a
                      LEFT JOIN pg_collation co ON co.oid = a.attcollation
                      LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '-')
               || ' indexes=' || coalesce((
                    SELECT string_agg(pg_get_indexdef(i.indexrelid), '; ' ORDER BY 1)
                      FROM pg_index i WHERE i.indrelid = c.oid), '-')
               || ' constraints=' || coalesce((
                    SELECT string_agg(k.conname || ' ' || pg_get_constraintdef(k.oid), '; ' ORDER BY k.conname)
                      FROM pg_constraint k WHERE k.conrelid = c.oid), '-')
               || ' view=' || CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) ELSE '-' END
          FROM pg_class c WHERE c.oid = m.objid)
    ELSE '' END, '?')
  FROM members m
UNION ALL SELECT 'extconfig ' || (SELECT extconfig::regclass[]::text FROM ext)
UNION ALL SELECT 'schema acl ' || (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'dedup')
ORDER BY 1
"#;

async fn catalog_signature(c: &dedup_pg_test::Conn) -> Result<Vec<String>> {
    texts(c, CATALOG_SIGNATURE).await
}

/// The first column of every row of `sql`, a text.
async fn texts(c: &dedup_pg_test::Conn, sql: &str) -> Result<Vec<String>> {
    Ok(c.query(sql, &[]).await?.iter().map(|r| r.get(0)).collect())
}

/// The version `CREATE EXTENSION dedup` installs (the control file's default).
async fn default_version(c: &dedup_pg_test::Conn) -> Result<String> {
    Ok(c.query_one(
        "SELECT default_version FROM pg_available_extensions WHERE name = 'dedup'",
        &[],
    )
    .await?
    .get(0))
}

/// `name` in the extension directory of the server under test (DEDUP_PG_CONFIG's).
fn installed_script(name: &str) -> Result<PathBuf> {
    let sharedir = Command::new(dedup_pg_test::cluster::pg_config())
        .arg("--sharedir")
        .output()?;
    Ok(PathBuf::from(String::from_utf8(sharedir.stdout)?.trim())
        .join("extension")
        .join(name))
}

/// The installed version of dedup in `c`'s database.
async fn extversion(c: &dedup_pg_test::Conn) -> Result<String> {
    Ok(c.query_one(
        "SELECT extversion FROM pg_extension WHERE extname = 'dedup'",
        &[],
    )
    .await?
    .get(0))
}

pub async fn upgrade_from_oldest_version_keeps_claims(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let current = default_version(&c).await?;
    let installed = installed_script(&format!("dedup--{OLDEST}.sql"))?;
    let installed_text = std::fs::read_to_string(&installed).with_context(|| {
        format!(
            "{} is not installed (scripts/test.sh installs the fixtures)",
            installed.display()
        )
    })?;
    let fixture_text = std::fs::read_to_string(fixture())?;
    if current == OLDEST {
        // Still at the oldest version: the fixture must be exactly what this build installs,
        // so that it stays a true copy once the version moves on.
        let (f, i) = (blocks(&fixture_text), blocks(&installed_text));
        if f != i {
            bail!(
                "pg_test/fixtures/dedup--{OLDEST}.sql differs from the installed script:\nonly in fixture: {:#?}\nonly installed: {:#?}",
                f.difference(&i).collect::<Vec<_>>(),
                i.difference(&f).collect::<Vec<_>>()
            );
        }
    } else if blocks(&installed_text) != blocks(&fixture_text) {
        bail!("the installed dedup--{OLDEST}.sql is not the fixture");
    }

    let db = format!("{}_upgrade", ctx.db);
    c.batch_execute(&format!("CREATE DATABASE {db}")).await?;
    let u = dedup_pg_test::connect(&ctx.cluster.dsn(&db)).await?;
    u.batch_execute(&format!(
        "CREATE EXTENSION dedup VERSION '{OLDEST}';
         BEGIN;
         SELECT dedup.try_claim('old-text');
         SELECT dedup.try_claim(7::bigint, 'old-scope');
         SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid);
         COMMIT;"
    ))
    .await?;
    let before = dedup_pg_test::claims(&u).await?;
    u.batch_execute("ALTER EXTENSION dedup UPDATE").await?;
    let version = extversion(&u).await?;
    ensure_eq(
        version.as_str(),
        current.as_str(),
        "version after ALTER EXTENSION dedup UPDATE",
    )?;
    if current == OLDEST {
        println!("  only version {OLDEST} exists so far: the update was a no-op; fixture checked");
    }
    let after = dedup_pg_test::claims(&u).await?;
    ensure_eq(&after, &before, "claims after the update")?;

    // The upgraded extension is exactly a new install of the current version.
    let fresh_db = format!("{}_fresh", ctx.db);
    c.batch_execute(&format!("CREATE DATABASE {fresh_db}"))
        .await?;
    let fresh = dedup_pg_test::connect(&ctx.cluster.dsn(&fresh_db)).await?;
    fresh.batch_execute("CREATE EXTENSION dedup").await?;
    let (upgraded, installed) = (
        catalog_signature(&u).await?,
        catalog_signature(&fresh).await?,
    );
    if upgraded != installed {
        let only_upgraded: Vec<_> = upgraded.iter().filter(|l| !installed.contains(l)).collect();
        let only_installed: Vec<_> = installed.iter().filter(|l| !upgraded.contains(l)).collect();
        bail!("upgraded and freshly installed catalogs differ\nonly after the upgrade: {only_upgraded:#?}\nonly in a new install: {only_installed:#?}");
    }
    u.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&u, "SELECT dedup.try_claim('old-text')").await?,
        false,
        "old text claim",
    )?;
    ensure_eq(
        claim(&u, "SELECT dedup.try_claim('7', 'old-scope')").await?,
        false,
        "old bigint claim",
    )?;
    ensure_eq(
        claim(
            &u,
            "SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid)",
        )
        .await?,
        false,
        "old uuid claim",
    )?;
    ensure_eq(
        claim(&u, "SELECT dedup.try_claim('new') AND dedup.try_claim(8::bigint, 's') AND dedup.try_claim(gen_random_uuid())")
            .await?,
        true,
        "new claims",
    )?;
    u.batch_execute("COMMIT").await?;
    // The API the later versions added works on the upgraded claims.
    if current != OLDEST {
        u.batch_execute(
            "UPDATE dedup.processed SET processed_at = now() - interval '8 days' WHERE job_id = 'old-text';
             SELECT dedup.set_retention('old-scope', '30 days');",
        )
        .await?;
        let pruned: i64 = u.query_one("SELECT dedup.prune()", &[]).await?.get(0);
        ensure_eq(pruned, 1, "claims pruned after the upgrade")?;
        let kept: String = u
            .query_one("SELECT dedup.retention('old-scope')::text", &[])
            .await?
            .get(0);
        ensure_eq(
            kept.as_str(),
            "30 days",
            "retention of a scope after the upgrade",
        )?;
        // Leases and fingerprints (0.3.0), next to the claims taken before.
        let row = u
            .query_one(
                "SELECT status, lease_id FROM dedup.lease('new-lease', fingerprint => 'f')",
                &[],
            )
            .await?;
        let (status, id): (String, uuid::Uuid) = (row.get(0), row.get(1));
        ensure_eq(status.as_str(), "acquired", "lease after the upgrade")?;
        u.execute(
            "SELECT dedup.complete('new-lease', $1, '{\"ok\": true}')",
            &[&id],
        )
        .await?;
        let done: String = u
            .query_one("SELECT status FROM dedup.lease('7', 'old-scope')", &[])
            .await?
            .get(0);
        ensure_eq(
            done.as_str(),
            "done",
            "lease of a job claimed before the upgrade",
        )?;
        u.batch_execute("BEGIN").await?;
        ensure_eq(
            claim(&u, "SELECT dedup.try_claim('fp-new', 'default', 'f')").await?,
            true,
            "claim with a fingerprint after the upgrade",
        )?;
        u.batch_execute("COMMIT").await?;
    }
    Ok(())
}

/// What the tests that move a database to another server (`pg_upgrade`, a blue/green
/// switch) give it to keep: claims of text, bigint and uuid ids, a fingerprint, a stored
/// result, a running lease, an offset, a scope retention and a forgotten job's audit row.
/// [`answers_as_before`] checks them on the new server.
pub(crate) const HELD: &str = "SELECT dedup.set_retention('short', interval '1 hour');
     BEGIN; SELECT dedup.try_claim('job-' || g) FROM generate_series(1, 500) g; COMMIT;
     BEGIN; SELECT dedup.try_claim(g::bigint, 'ints') FROM generate_series(1, 100) g; COMMIT;
     BEGIN; SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid); COMMIT;
     BEGIN; SELECT dedup.try_claim('fp-1', 'default', 'fingerprint-a'); COMMIT;
     BEGIN; SELECT dedup.try_claim('res-1'); SELECT dedup.set_result('res-1', '{\"total\": 42}'); COMMIT;
     SELECT dedup.lease('lease-1', 'default', interval '1 hour');
     BEGIN; SELECT dedup.advance('orders', 0, 1, 250); COMMIT;
     BEGIN; SELECT dedup.try_claim('gone'); COMMIT;
     SELECT dedup.forget('gone');";

/// What [`HELD`] gave a database answers on its new server as on the old: copies of the
/// claimed jobs are refused, another fingerprint is `YD001`, the result is returned, the
/// lease is busy and the offset where it was.
pub(crate) async fn answers_as_before(n: &dedup_pg_test::Conn) -> Result<()> {
    n.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(n, "SELECT dedup.try_claim('job-1')").await?,
        false,
        "a copy of job-1",
    )?;
    ensure_eq(
        claim(n, "SELECT dedup.try_claim(7::bigint, 'ints')").await?,
        false,
        "a copy of 7",
    )?;
    ensure_eq(
        claim(
            n,
            "SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid)",
        )
        .await?,
        false,
        "a copy of the uuid",
    )?;
    n.batch_execute("COMMIT").await?;
    let mismatch = n
        .query_one(
            "SELECT dedup.try_claim('fp-1', 'default', 'fingerprint-b')",
            &[],
        )
        .await;
    ensure_eq(
        mismatch.err().as_ref().and_then(dedup_pg_test::sqlstate),
        Some("YD001"),
        "another fingerprint for fp-1",
    )?;
    let result: String = n
        .query_one("SELECT result::text FROM dedup.claim_result('res-1')", &[])
        .await?
        .get(0);
    ensure_eq(result.as_str(), r#"{"total": 42}"#, "stored result")?;
    let status: String = n
        .query_one("SELECT status FROM dedup.lease('lease-1')", &[])
        .await?
        .get(0);
    ensure_eq(status.as_str(), "busy", "the running lease")?;
    let position: i64 = n
        .query_one("SELECT dedup.position('orders', 0)", &[])
        .await?
        .get(0);
    ensure_eq(position, 250, "the offset")?;
    Ok(())
}

/// What a database's dedup holds, as text, for comparing before and after an upgrade of the
/// server: every claim (of the scopes that do not expire here) with its time, fingerprint,
/// result and lease, the scope retentions, the offsets, the forgotten-job audit rows.
const HOLDINGS: &[&str] = &[
    "SELECT scope || ' ' || job_id || ' ' || processed_at::text || ' ' || coalesce(fingerprint, '-') \
            || ' ' || coalesce(result::text, '-') || ' ' || coalesce(lease_id::text, '-') \
            || ' ' || coalesce(lease_expires_at::text, '-') \
       FROM dedup.processed WHERE scope <> 'short' ORDER BY scope, job_id",
    "SELECT scope || '=' || retention::text FROM dedup.scope_retention ORDER BY 1",
    "SELECT o::text FROM dedup.offsets AS o ORDER BY 1",
    "SELECT f::text FROM dedup.forgotten AS f ORDER BY 1",
];

pub(crate) async fn holdings(c: &dedup_pg_test::Conn) -> Result<Vec<String>> {
    let mut all = Vec::new();
    for q in HOLDINGS {
        for r in c.query(*q, &[]).await.with_context(|| q.to_string())? {
            all.push(r.get::<_, String>(0));
        }
    }
    Ok(all)
}

async fn counted(c: &dedup_pg_test::Conn) -> Result<(i64, i64)> {
    let r = c
        .query_one(
            "SELECT coalesce(sum(claims), 0)::bigint, coalesce(sum(duplicates), 0)::bigint \
               FROM dedup.stats WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok((r.get(0), r.get(1)))
}

/// What a database that uses generations holds, as text: its catalog (with each relid's
/// OID, which pg_upgrade keeps) and every claim across its generations.
const GENERATIONS: &[&str] = &[
    "SELECT n::text || ' ' || relname::text || ' ' || state || ' ' || relid::oid::text \
       FROM dedup.generations ORDER BY n",
    "SELECT scope || ' ' || job_id || ' ' || processed_at::text FROM dedup.claims() \
      ORDER BY scope, job_id",
];

/// A claim of `job` in a transaction of its own.
async fn claim_one(c: &dedup_pg_test::Conn, job: &str) -> Result<bool> {
    crate::generations::claim_tx(c, &format!("SELECT dedup.try_claim('{job}')")).await
}

/// Turns generations on in the database of `dsn` on the old server (which preloads dedup),
/// with a claim in generation 0, one in 1 and one in 2; what it then holds (GENERATIONS).
async fn generations_before(dsn: &str) -> Result<Vec<String>> {
    let g = dedup_pg_test::connect(dsn).await?;
    ensure_eq(
        claim_one(&g, "gen-0").await?,
        true,
        "a claim in generation 0",
    )?;
    g.batch_execute("SELECT dedup.use_generations()").await?;
    ensure_eq(
        claim_one(&g, "gen-1").await?,
        true,
        "a claim in generation 1",
    )?;
    g.batch_execute("SELECT dedup.rotate_generations(publish => true)")
        .await?;
    ensure_eq(
        claim_one(&g, "gen-2").await?,
        true,
        "a claim in generation 2",
    )?;
    // Seal generation 1 here (no transaction is open), so the new server's worker has no
    // seal to do that would change the catalog compared.
    for _ in 0..20 {
        let sealing: i64 = g
            .query_one(
                "SELECT count(*) FROM dedup.generations WHERE state = 'sealing'",
                &[],
            )
            .await?
            .get(0);
        if sealing == 0 {
            return texts_of(&g, GENERATIONS).await;
        }
        g.batch_execute("SELECT dedup.rotate_generations()").await?;
    }
    bail!("generation 1 is still sealing after 20 rotation steps with no transaction open")
}

/// After pg_upgrade: the database that uses generations holds what it held (the same
/// catalog, each relid still its table, the same claims); each claim of generations 0 to 2
/// is a duplicate; a new claim lands in generation 2; a publication works, and a claim
/// after it lands in the new generation.
async fn generations_after(dsn: &str, before: &[String]) -> Result<()> {
    let g = dedup_pg_test::connect_when_up(dsn).await?;
    g.batch_execute("SET statement_timeout = '20s'").await?;
    ensure_eq(
        texts_of(&g, GENERATIONS).await?,
        before.to_vec(),
        "the catalog and the claims of every generation",
    )?;
    let misnamed: i64 = g
        .query_one(
            "SELECT count(*) FROM dedup.generations \
              WHERE relid::oid IS DISTINCT FROM to_regclass('dedup.' || quote_ident(relname::text))::oid",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(misnamed, 0, "catalog rows whose relid is not their table")?;
    for job in ["gen-0", "gen-1", "gen-2"] {
        ensure_eq(
            claim_one(&g, job).await?,
            false,
            &format!("{job} claimed again"),
        )?;
    }
    let held = |rel: &str, job: &str| {
        format!("SELECT EXISTS (SELECT FROM dedup.{rel} WHERE job_id = '{job}')")
    };
    ensure_eq(claim_one(&g, "gen-new").await?, true, "a new claim")?;
    ensure_eq(
        g.query_one(held("processed_2", "gen-new").as_str(), &[])
            .await?
            .get::<_, bool>(0),
        true,
        "the new claim in generation 2",
    )?;
    g.batch_execute("SELECT dedup.rotate_generations(publish => true)")
        .await?;
    ensure_eq(
        claim_one(&g, "gen-published").await?,
        true,
        "a claim after a publication",
    )?;
    ensure_eq(
        g.query_one(held("processed_3", "gen-published").as_str(), &[])
            .await?
            .get::<_, bool>(0),
        true,
        "that claim in generation 3",
    )?;
    ensure_eq(
        claim_one(&g, "gen-new").await?,
        false,
        "gen-new claimed again",
    )
}

async fn texts_of(c: &dedup_pg_test::Conn, queries: &[&str]) -> Result<Vec<String>> {
    let mut all = Vec::new();
    for q in queries {
        all.extend(texts(c, q).await?);
    }
    Ok(all)
}

pub(crate) fn bindir_of(pg_config: &str) -> Result<PathBuf> {
    let out = Command::new(pg_config).arg("--bindir").output()?;
    ensure_eq(out.status.success(), true, "pg_config --bindir")?;
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// `pg_upgrade` from an older major to this one: from the oldest and from the
/// latest of the majors this run tested before (`DEDUP_UPGRADE_FROM`, which scripts/test.sh
/// sets; dedup of this build is installed in each). Claims, fingerprints, a stored result,
/// a lease, an offset, a scope retention and a forgotten job's audit row are all there
/// afterwards and answer as before; a second database, which uses generations, keeps its
/// catalog and claims, and claims and publishes across them; the worker prunes on the new
/// major. The counters are
/// not in what pg_upgrade copies: the first upgrade copies pg_stat/dedup.stat across, as
/// docs/operations.md tells (they carry over); the second does not (they start from zero,
/// and the new server's log says so).
pub async fn pg_upgrade_from_an_older_major_keeps_everything(_ctx: Ctx) -> Result<()> {
    let from: Vec<String> = std::env::var("DEDUP_UPGRADE_FROM")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut olds = Vec::new();
    for p in [from.first(), from.last()].into_iter().flatten() {
        if !olds.contains(p) {
            olds.push(p.clone());
        }
    }
    if olds.is_empty() {
        return Err(dedup_pg_test::NotApplicable(
            "no older major to upgrade from: DEDUP_UPGRADE_FROM (set by scripts/test.sh to the \
             majors it tested before this one) is empty"
                .into(),
        )
        .into());
    }
    let new_bindir = dedup_pg_test::cluster::bindir()?;
    for (i, old_config) in olds.iter().enumerate() {
        let copy_counters = i == 0;
        let old_bindir = bindir_of(old_config)?;
        let conf = |name: &str, interval: &str| {
            Options::named(name)
                .set("shared_preload_libraries", "dedup")
                .set("dedup.prune_interval", interval)
        };
        let mut old = Cluster::start_with(old_bindir.clone(), conf("upgrade-old", "0"))?;
        old.psql("postgres", "CREATE DATABASE up")?;
        old.psql("up", "CREATE EXTENSION dedup")?;
        let o = dedup_pg_test::connect(&old.dsn("up")).await?;
        o.batch_execute(HELD).await?;
        o.batch_execute(
            "BEGIN; SELECT dedup.try_claim('old-' || g, 'short') FROM generate_series(1, 50) g; COMMIT;
             UPDATE dedup.processed SET processed_at = now() - interval '2 hours' WHERE scope = 'short';
             BEGIN; SELECT dedup.try_claim('job-1'); COMMIT;",
        )
        .await?;
        old.psql("postgres", "CREATE DATABASE upgen")?;
        old.psql("upgen", "CREATE EXTENSION dedup")?;
        let generations_before = generations_before(&old.dsn("upgen")).await?;
        let before = holdings(&o).await?;
        let counted_before = counted(&o).await?;
        let version = extversion(&o).await?;
        let old_version: String = o.query_one("SHOW server_version", &[]).await?.get(0);
        drop(o);

        let mut new = old
            .pg_upgrade_to(new_bindir.clone(), conf("upgrade-new", "1"))
            .with_context(|| format!("pg_upgrade from {}", old_bindir.display()))?;
        if copy_counters {
            let file = old.data.join("pg_stat/dedup.stat");
            let to = new.data.join("pg_stat/dedup.stat");
            std::fs::copy(&file, &to).with_context(|| {
                format!(
                    "copying {} (written at the old server's stop)",
                    file.display()
                )
            })?;
            if dedup_pg_test::cluster::is_root() {
                dedup_pg_test::cluster::run(Command::new("chown").arg("postgres:").arg(&to))?;
            }
        }
        new.start_again()?;
        let n = dedup_pg_test::connect_when_up(&new.dsn("up")).await?;
        let new_version: String = n.query_one("SHOW server_version", &[]).await?.get(0);
        println!("  pg_upgrade {old_version} -> {new_version}, counters copied: {copy_counters}");
        let counted_after = counted(&n).await?;
        if copy_counters {
            ensure_eq(
                counted_after,
                counted_before,
                "counters after copying dedup.stat",
            )?;
        } else {
            ensure_eq(counted_after, (0, 0), "counters without the file")?;
            if !new.log_text().contains("the counters start from zero") {
                bail!(
                    "the new server's log does not say the counters start from zero:\n{}",
                    new.log_tail(20)
                );
            }
        }
        n.batch_execute("ALTER EXTENSION dedup UPDATE").await?;
        let after_version = extversion(&n).await?;
        ensure_eq(
            after_version.as_str(),
            version.as_str(),
            "extension version",
        )?;
        let after = holdings(&n).await?;
        if after != before {
            bail!("{old_version} -> {new_version}: what dedup holds changed:\nbefore {before:#?}\nafter {after:#?}");
        }
        ensure_eq(before.len() >= 604, true, "claims compared")?;
        // Everything answers as before, and a new job is claimed.
        answers_as_before(&n).await?;
        n.batch_execute("BEGIN").await?;
        ensure_eq(
            claim(&n, "SELECT dedup.try_claim('new-job')").await?,
            true,
            "a new job",
        )?;
        n.batch_execute("COMMIT").await?;
        generations_after(&new.dsn("upgen"), &generations_before)
            .await
            .with_context(|| {
                format!("{old_version} -> {new_version}: the database that uses generations")
            })?;
        // The worker prunes on the new major.
        let pruned = crate::worker::eventually(60, "the expired claims pruned", || async {
            Ok(crate::worker::count(
                &n,
                "SELECT count(*) FROM dedup.processed WHERE scope = 'short'",
            )
            .await?
                == 0)
        })
        .await;
        if let Err(e) = pruned {
            bail!("{e:#} on {new_version}:\n{}", new.log_tail(20));
        }
        drop(n);
        drop(new);
        drop(old);
    }
    Ok(())
}

/// A fresh `CREATE EXTENSION` makes each object of dedup with exactly one statement: no
/// function, view or table is created and then replaced, no object is dropped, and no table
/// gains a column after it was made. What it counts is what PostgreSQL reports to an event
/// trigger for each command of the install script pgrx generates from `sql/` and `src/`, so
/// a definition replayed from an older release (the way 0.6.0's fresh install once made
/// `dedup.lease` three times) fails here. The one ALTER allowed is a property no CREATE can
/// state: `dedup.forgotten`'s replica identity.
pub async fn a_fresh_install_creates_each_object_once(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let db = format!("{}_fresh", ctx.db);
    c.batch_execute(&format!("CREATE DATABASE {db}")).await?;
    let f = dedup_pg_test::connect(&ctx.cluster.dsn(&db)).await?;
    f.batch_execute(
        "CREATE TABLE public.ddl_log (n serial, tag text, kind text, identity text);
         CREATE FUNCTION public.log_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO public.ddl_log (tag, kind, identity)
             SELECT d.command_tag, d.object_type, d.object_identity
               FROM pg_event_trigger_ddl_commands() AS d WHERE d.in_extension;
         END $$;
         CREATE FUNCTION public.log_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO public.ddl_log (tag, kind, identity)
             SELECT 'DROP', d.object_type, d.object_identity FROM pg_event_trigger_dropped_objects() AS d;
         END $$;
         CREATE EVENT TRIGGER log_ddl ON ddl_command_end EXECUTE FUNCTION public.log_ddl();
         CREATE EVENT TRIGGER log_drop ON sql_drop EXECUTE FUNCTION public.log_drop();
         CREATE EXTENSION dedup;
         DROP EVENT TRIGGER log_ddl;
         DROP EVENT TRIGGER log_drop;",
    )
    .await?;
    let made: i64 = f
        .query_one(
            "SELECT count(DISTINCT identity) FROM public.ddl_log WHERE tag LIKE 'CREATE %'",
            &[],
        )
        .await?
        .get(0);
    // The event trigger saw the install: every function of the API at least.
    let functions: i64 = f
        .query_one(
            "SELECT count(*) FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
              WHERE e.extname = 'dedup' AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(
        made >= functions && functions > 30,
        true,
        &format!("objects the install created ({made}), at least its {functions} functions"),
    )?;
    let twice = texts(
        &f,
        "SELECT kind || ' ' || identity || ': ' || string_agg(tag, ', ' ORDER BY n)
           FROM public.ddl_log WHERE tag LIKE 'CREATE %' AND identity IS NOT NULL
          GROUP BY kind, identity HAVING count(*) > 1 ORDER BY 1",
    )
    .await?;
    ensure_eq(
        twice,
        Vec::<String>::new(),
        "objects created more than once",
    )?;
    let changed = texts(
        &f,
        "SELECT tag || ' ' || kind || ' ' || coalesce(identity, '?') FROM public.ddl_log
          WHERE tag = 'DROP' OR (tag LIKE 'ALTER %' AND identity IS DISTINCT FROM 'dedup.forgotten')
          ORDER BY n",
    )
    .await?;
    ensure_eq(
        changed,
        Vec::<String>::new(),
        "objects dropped or altered after they were made",
    )?;
    drop(f);
    c.batch_execute(&format!("DROP DATABASE {db}")).await?;
    Ok(())
}

/// The upgrade script to the version this build makes, while that version is unreleased, is
/// exactly what its recipe (`sql/upgrade/NEW.sql`) makes from the concern files of `sql/`
/// and the install script pgrx generated for this build: nobody wrote it by pasting, and a
/// definition changed in its concern file reaches the upgrade. A released script never
/// changes, so its recipe is not run again.
pub async fn the_newest_upgrade_script_is_what_its_recipe_makes(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let current = default_version(&c).await?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let changelog = std::fs::read_to_string(repo.join("CHANGELOG.md"))?;
    if !changelog.contains(&format!("\n## {current} (unreleased)")) {
        return Err(dedup_pg_test::NotApplicable(format!(
            "{current} is released: its upgrade script never changes, and its recipe is not run again"
        ))
        .into());
    }
    let recipe = repo.join(format!("sql/upgrade/{current}.sql"));
    if !recipe.exists() {
        bail!(
            "{current} is unreleased and has no recipe {}: write it (CONTRIBUTING.md, Upgrade scripts) and make its script with scripts/upgrade-script.py",
            recipe.display()
        );
    }
    let library = installed_script(&format!("dedup--{current}.sql"))?;
    crate::common::python(
        &repo.join("scripts/upgrade-script.py"),
        &[
            recipe.as_os_str(),
            "--check".as_ref(),
            "--library".as_ref(),
            library.as_os_str(),
        ],
    )
}
