//! Upgrades keep claims: install the oldest released version from its full install script
//! (kept in pg_test/fixtures), take claims, `ALTER EXTENSION dedup UPDATE`, and check that
//! the claims and the whole API work.
use crate::common::{claim, ensure_eq, Ctx};
use anyhow::{bail, Context, Result};
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

pub async fn upgrade_from_oldest_version_keeps_claims(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let current: String = c
        .query_one(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'dedup'",
            &[],
        )
        .await?
        .get(0);
    let sharedir = Command::new(dedup_pg_test::cluster::pg_config())
        .arg("--sharedir")
        .output()?;
    let installed = PathBuf::from(String::from_utf8(sharedir.stdout)?.trim())
        .join(format!("extension/dedup--{OLDEST}.sql"));
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
    let version: String = u
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'dedup'",
            &[],
        )
        .await?
        .get(0);
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
    Ok(())
}
