//! The README stays true: every public function and setting in the catalog is documented
//! in the README's reference, and everything the reference names exists.
use crate::common::Ctx;
use anyhow::{bail, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn section<'a>(readme: &'a str, marker: &str) -> Result<&'a str> {
    let start = format!("<!-- {marker} -->");
    let end = format!("<!-- /{marker} -->");
    let Some(s) = readme.find(&start) else {
        bail!("README has no {start} section")
    };
    let Some(e) = readme[s..].find(&end) else {
        bail!("README has no {end}")
    };
    Ok(&readme[s + start.len()..s + e])
}

/// Every `dedup.name(...)` or `dedup.name` in backticks at the start of a table row.
fn documented(section: &str) -> BTreeSet<String> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

pub async fn readme_documents_every_function_and_setting(_ctx: Ctx) -> Result<()> {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md"))?;
    // Preloaded: the settings only a preloaded library defines (dedup.stats_max) show too.
    let cluster = Cluster::start(Options::named("docs").set("shared_preload_libraries", "dedup"))?;
    cluster.create_db_with_extension("docs")?;
    let c = dedup_pg_test::connect(&cluster.dsn("docs")).await?;

    let functions: BTreeSet<String> = c
        .query(
            "SELECT 'dedup.' || p.proname || '(' || regexp_replace(pg_get_function_arguments(p.oid), '::[a-z_]+', '', 'g') || ')' \
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'dedup' AND p.proname NOT LIKE '\\_%'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let in_readme = documented(section(&readme, "functions")?);
    if functions != in_readme {
        bail!(
            "README functions differ from the catalog\nnot documented: {:?}\ndocumented but missing: {:?}",
            functions.difference(&in_readme).collect::<Vec<_>>(),
            in_readme.difference(&functions).collect::<Vec<_>>()
        );
    }

    // pg_settings lists a library's settings once the library is loaded in the session.
    c.batch_execute("LOAD 'dedup'").await?;
    let settings: BTreeSet<String> = c
        .query(
            "SELECT name FROM pg_settings WHERE name LIKE 'dedup.%'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if settings.is_empty() {
        bail!("no dedup.* settings visible");
    }
    let in_readme = documented(section(&readme, "settings")?);
    if settings != in_readme {
        bail!(
            "README settings differ from pg_settings\nnot documented: {:?}\ndocumented but missing: {:?}",
            settings.difference(&in_readme).collect::<Vec<_>>(),
            in_readme.difference(&settings).collect::<Vec<_>>()
        );
    }
    // Each documented setting's row: | `name` | `default as SHOW prints it` | unit | context | ...
    for row in c
        .query(
            "SELECT name, current_setting(name), coalesce(unit, '-'), context \
             FROM pg_settings WHERE name LIKE 'dedup.%'",
            &[],
        )
        .await?
    {
        let (name, default, unit, context): (String, String, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let default = if default.is_empty() {
            "''".to_string()
        } else {
            default
        };
        let want = format!("| `{name}` | `{default}` | {unit} | {context} |");
        if !readme.lines().any(|l| l.starts_with(&want)) {
            bail!("README has no settings row starting with {want}");
        }
    }
    Ok(())
}

/// docs/portable.md names every test that cannot apply to the portable edition (and so
/// does not run against it), with its reason: the list in the harness (NATIVE_ONLY,
/// EXTENSION_ONLY) is the one the docs show.
pub async fn portable_differences_list_every_test_left_out(_ctx: Ctx) -> Result<()> {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/portable.md");
    let doc = std::fs::read_to_string(&file)?;
    let section = section(&doc, "tests-not-run")?;
    let listed = documented(section);
    let mut missing = Vec::new();
    let mut unknown: BTreeSet<String> = listed.clone();
    for (name, _) in crate::NATIVE_ONLY.iter().chain(crate::EXTENSION_ONLY) {
        if !listed.contains(*name) {
            missing.push(*name);
        }
        unknown.remove(*name);
    }
    if !missing.is_empty() || !unknown.is_empty() {
        bail!(
            "docs/portable.md's tests-not-run table: missing {missing:?}, not in the harness's lists {unknown:?}"
        );
    }
    Ok(())
}
