//! The isolation specs in pg_test/isolation, run by PostgreSQL's own isolation tester
//! (`pg_isolation_regress`, from the server's dev package) against the test server. The
//! specs named `generation_*` need `shared_preload_libraries = 'dedup'` and turn claims in
//! rotating generations on in their database, which the other specs do not expect:
//! `generations::isolation_specs_at_the_boundary` runs them on a cluster of its own.
use crate::common::Ctx;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The name prefix of the specs that need a preloaded server and generations.
pub const GENERATION_SPECS: &str = "generation_";

pub async fn isolation_specs_pass(ctx: Ctx) -> Result<()> {
    let specs = spec_names(|name| !name.starts_with(GENERATION_SPECS))?;
    run(
        ctx.cluster.port,
        ctx.cluster.bindir.clone(),
        &ctx.db,
        specs,
        ctx.cluster.dir.join("isolation"),
    )
    .await
}

fn isolation_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("isolation")
}

/// The specs of pg_test/isolation/specs whose name `keep` keeps, sorted, without `.spec`.
pub fn spec_names(keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let dir = isolation_dir();
    let mut specs: Vec<String> = std::fs::read_dir(dir.join("specs"))?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_suffix(".spec")
                .map(str::to_string)
        })
        .filter(|name| keep(name))
        .collect();
    specs.sort();
    if specs.is_empty() {
        bail!("no such isolation specs in {}", dir.display());
    }
    Ok(specs)
}

/// `pg_isolation_regress` with `specs` against database `db` (which has the extension) of
/// the server on `port` whose binaries are in `bindir`; its results and diffs go to `out`.
pub async fn run(
    port: u16,
    bindir: PathBuf,
    db: &str,
    specs: Vec<String>,
    out: PathBuf,
) -> Result<()> {
    let dir = isolation_dir();
    let pkglibdir = Command::new(dedup_pg_test::cluster::pg_config())
        .arg("--pkglibdir")
        .output()?;
    let tester = PathBuf::from(String::from_utf8(pkglibdir.stdout)?.trim())
        .join("pgxs/src/test/isolation/pg_isolation_regress");
    std::fs::create_dir_all(&out)?;
    let db = db.to_string();
    let outdir = out.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&tester)
            .arg("--use-existing")
            .args([
                "--host=127.0.0.1",
                &format!("--port={port}"),
                "--user=postgres",
            ])
            .arg(format!("--bindir={}", bindir.display()))
            .arg(format!("--inputdir={}", dir.display()))
            .arg(format!("--outputdir={}", outdir.display()))
            // --use-existing creates no database: use the test's, which has the extension.
            .arg(format!("--dbname={db}"))
            .args(&specs)
            .output()
            .with_context(|| format!("running {}", tester.display()))
    })
    .await??;
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    print!(
        "{}",
        text.lines().map(|l| format!("  {l}\n")).collect::<String>()
    );
    if !output.status.success() {
        let diffs = std::fs::read_to_string(out.join("regression.diffs")).unwrap_or_default();
        bail!("pg_isolation_regress failed:\n{diffs}");
    }
    Ok(())
}
