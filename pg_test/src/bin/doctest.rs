//! `doctest [--bless] [FILE]...`: run the examples of docs/reference/ (or of FILEs) in a
//! throwaway server, as `docs::reference_examples_run_as_shown` does, and print where a
//! file's output differs from psql's. `--bless` writes psql's output into the files
//! instead: read the diff before committing it.
use anyhow::Result;
use dedup_pg_test::cluster::stop_all_on_signal;
use dedup_pg_test::doctest;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> Result<ExitCode> {
    let mut bless = false;
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        if a == "--bless" {
            bless = true;
        } else {
            files.push(PathBuf::from(a));
        }
    }
    if files.is_empty() {
        files = doctest::reference_files()?;
    }
    stop_all_on_signal();
    let cluster = doctest::start_cluster()?;
    let report = doctest::check_files(&cluster, &files, bless)?;
    if report.is_empty() {
        println!(
            "{} file(s): every example prints what the file shows{}",
            files.len(),
            if bless { " (blessed)" } else { "" }
        );
        Ok(ExitCode::SUCCESS)
    } else {
        print!("{report}");
        Ok(ExitCode::FAILURE)
    }
}
