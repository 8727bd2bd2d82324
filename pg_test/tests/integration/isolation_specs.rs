//! The isolation specs in pg_test/isolation, run by PostgreSQL's own isolation tester
//! (`pg_isolation_regress`, from the server's dev package) against the test server.
use crate::common::Ctx;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

pub async fn isolation_specs_pass(ctx: Ctx) -> Result<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("isolation");
    let mut specs: Vec<String> = std::fs::read_dir(dir.join("specs"))?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_suffix(".spec")
                .map(str::to_string)
        })
        .collect();
    specs.sort();
    if specs.is_empty() {
        bail!("no isolation specs in {}", dir.display());
    }
    let pkglibdir = Command::new(dedup_pg_test::cluster::pg_config())
        .arg("--pkglibdir")
        .output()?;
    let tester = PathBuf::from(String::from_utf8(pkglibdir.stdout)?.trim())
        .join("pgxs/src/test/isolation/pg_isolation_regress");
    let out = ctx.cluster.dir.join("isolation");
    std::fs::create_dir_all(&out)?;
    let cluster = ctx.cluster.clone();
    let db = ctx.db.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&tester)
            .arg("--use-existing")
            .args([
                "--host=127.0.0.1",
                &format!("--port={}", cluster.port),
                "--user=postgres",
            ])
            .arg(format!("--bindir={}", cluster.bindir.display()))
            .arg(format!("--inputdir={}", dir.display()))
            .arg(format!("--outputdir={}", out.display()))
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
        let diffs = std::fs::read_to_string(ctx.cluster.dir.join("isolation/regression.diffs"))
            .unwrap_or_default();
        bail!("pg_isolation_regress failed:\n{diffs}");
    }
    Ok(())
}
