//! One version everywhere: `Cargo.toml`, the control file, the newest upgrade script, the
//! PGXN `META.json`, the top of `CHANGELOG.md`, and what the server installs.
use crate::common::{ensure_eq, Ctx};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(repo(path)).with_context(|| format!("reading {path}"))
}

/// "0.10.2" -> (0, 10, 2), to order versions.
fn parse(v: &str) -> Result<(u32, u32, u32)> {
    let parts: Vec<u32> = v
        .split('.')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("version {v:?}"))?;
    match parts[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => bail!("version {v:?} is not MAJOR.MINOR.PATCH"),
    }
}

pub async fn one_version_everywhere(ctx: Ctx) -> Result<()> {
    let cargo = read("Cargo.toml")?;
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .context("no version in Cargo.toml")?
        .to_string();
    parse(&version)?;
    // The control file takes Cargo's version (pgrx writes it in at install).
    let control = read("dedup.control")?;
    if !control.contains("default_version = '@CARGO_VERSION@'") {
        bail!("dedup.control must take its default_version from Cargo.toml (@CARGO_VERSION@)");
    }
    // The newest upgrade script leads to this version.
    let mut newest = None;
    for entry in std::fs::read_dir(repo("sql"))? {
        let name = entry?.file_name().into_string().unwrap_or_default();
        if let Some(pair) = name
            .strip_prefix("dedup--")
            .and_then(|n| n.strip_suffix(".sql"))
        {
            if let Some((_, to)) = pair.split_once("--") {
                let v = parse(to)?;
                if newest.as_ref().is_none_or(|(n, _)| v > *n) {
                    newest = Some((v, to.to_string()));
                }
            }
        }
    }
    ensure_eq(
        newest.map(|(_, v)| v),
        Some(version.clone()),
        "the version the newest sql/dedup--OLD--NEW.sql leads to",
    )?;
    let meta: serde_json::Value = serde_json::from_str(&read("META.json")?)?;
    ensure_eq(
        meta["version"].as_str(),
        Some(version.as_str()),
        "META.json version",
    )?;
    ensure_eq(
        meta["provides"]["dedup"]["version"].as_str(),
        Some(version.as_str()),
        "META.json provides.dedup.version",
    )?;
    // The client packages move with the extension (clients/*/: npm, PyPI, crates.io).
    let node: serde_json::Value = serde_json::from_str(&read("clients/node/package.json")?)?;
    ensure_eq(
        node["version"].as_str(),
        Some(version.as_str()),
        "clients/node/package.json version",
    )?;
    for file in ["clients/python/pyproject.toml", "clients/rust/Cargo.toml"] {
        let text = read(file)?;
        let v = text
            .lines()
            .find_map(|l| l.strip_prefix("version = \""))
            .and_then(|v| v.strip_suffix('"'));
        ensure_eq(v, Some(version.as_str()), &format!("{file} version"))?;
    }
    let changelog = read("CHANGELOG.md")?;
    let top = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## "))
        .context("no version heading in CHANGELOG.md")?;
    ensure_eq(
        top.split_whitespace().next(),
        Some(version.as_str()),
        "the newest CHANGELOG.md entry",
    )?;
    let c = ctx.connect().await?;
    // The plain script of the portable edition records its version in the schema's comment
    // ("dedup VERSION ...").
    let installed_sql = match dedup_pg_test::cluster::edition() {
        dedup_pg_test::cluster::Edition::Plain => {
            "SELECT split_part(obj_description('dedup'::regnamespace, 'pg_namespace'), ' ', 2)"
        }
        _ => "SELECT extversion FROM pg_extension WHERE extname = 'dedup'",
    };
    let installed: String = c.query_one(installed_sql, &[]).await?.get(0);
    ensure_eq(installed, version, "the version the server installs")?;
    Ok(())
}
