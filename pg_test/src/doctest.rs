//! The reference's examples, run as a user runs them (doctest style): every ```sql block
//! of a file in docs/reference/ is sent through psql, and its output must equal the
//! ```text block that follows it (no such block: no output).
//!
//! A file's blocks run in order in one psql session, in a database of their own with the
//! extension installed, on a server started with `shared_preload_libraries = 'dedup'` (the
//! counters) and the worker off (`dedup.prune_interval = 0`, so nothing changes between
//! blocks). psql runs with `-X -q` (no command tags), `VERBOSITY verbose` (errors and
//! warnings show their SQLSTATE), `SHOW_CONTEXT never`, `application_name` `docs`, UTC and
//! ISO dates. What varies from run to run is dropped before comparing: the `psql:<stdin>:N:`
//! prefix of a message, its `LOCATION:` line (a source line of the build), and trailing
//! spaces.
use crate::cluster::Cluster;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// One example: its SQL, the output the file shows, and where that output is (or goes).
#[derive(Debug)]
pub struct Example {
    /// 1-based line of the ```sql fence.
    pub line: usize,
    pub sql: String,
    pub expected: String,
    /// Lines `[start, end)` of the ```text block, fences included; for an example without
    /// one, `start == end`, the line after the sql block's closing fence.
    pub output_lines: (usize, usize),
}

/// The examples of a Markdown file.
pub fn parse(text: &str) -> Result<Vec<Example>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "```sql" {
            i += 1;
            continue;
        }
        let line = i + 1;
        let close =
            fence_end(&lines, i + 1).with_context(|| format!("line {line}: ```sql not closed"))?;
        let sql = lines[i + 1..close].join("\n");
        let mut j = close + 1;
        while j < lines.len() && lines[j].trim().is_empty() {
            j += 1;
        }
        let (expected, output_lines) = if j < lines.len() && lines[j].trim_end() == "```text" {
            let end = fence_end(&lines, j + 1)
                .with_context(|| format!("line {}: ```text not closed", j + 1))?;
            (lines[j + 1..end].join("\n"), (j, end + 1))
        } else {
            (String::new(), (close + 1, close + 1))
        };
        out.push(Example {
            line,
            sql,
            expected,
            output_lines,
        });
        i = output_lines.1.max(close + 1);
    }
    Ok(out)
}

fn fence_end(lines: &[&str], from: usize) -> Option<usize> {
    (from..lines.len()).find(|&k| lines[k].trim_end() == "```")
}

/// Output as compared: without what varies from run to run, trailing spaces and blank
/// lines at either end.
pub fn normalize(output: &str) -> String {
    let lines: Vec<String> = output
        .lines()
        .filter(|l| !l.trim_start().starts_with("LOCATION:"))
        .map(|l| strip_psql_prefix(l).trim_end().to_string())
        .collect();
    lines.join("\n").trim_matches('\n').to_string()
}

/// `psql:<stdin>:12: ERROR: ...` → `ERROR: ...`
fn strip_psql_prefix(l: &str) -> &str {
    if let Some(rest) = l.strip_prefix("psql:") {
        let mut parts = rest.splitn(3, ':');
        if let (Some(_file), Some(n), Some(tail)) = (parts.next(), parts.next(), parts.next()) {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                return tail.strip_prefix(' ').unwrap_or(tail);
            }
        }
    }
    l
}

const MARK: &str = "@@doctest-block@@";

/// Run the examples in one psql session against `dbname`; the output of each, normalized.
pub fn run(cluster: &Cluster, dbname: &str, examples: &[Example]) -> Result<Vec<String>> {
    let mut script =
        String::from("\\set VERBOSITY verbose\n\\set SHOW_CONTEXT never\n\\pset pager off\n");
    for e in examples {
        script.push_str(&format!("\\echo {MARK}\n{}\n", e.sql));
    }
    script.push_str(&format!("\\echo {MARK}\n"));
    let (mut reader, writer) = std::io::pipe()?;
    let mut child = Command::new(cluster.bindir.join("psql"))
        .args(["-X", "-q", "-h", "127.0.0.1", "-U", "postgres"])
        .arg("-p")
        .arg(cluster.port.to_string())
        .arg("-d")
        .arg(dbname)
        .env("PGAPPNAME", "docs")
        .env("PGTZ", "UTC")
        .env("PGDATESTYLE", "ISO, MDY")
        .env("PGCLIENTENCODING", "UTF8")
        .env_remove("PGOPTIONS")
        .stdin(Stdio::piped())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .spawn()
        .context("psql")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Written from a thread: psql's output fills the pipe while it reads the script.
    let feeder = std::thread::spawn(move || stdin.write_all(script.as_bytes()));
    let mut output = String::new();
    reader.read_to_string(&mut output)?;
    feeder.join().expect("feeder thread")?;
    let status = child.wait()?;
    if !status.success() {
        bail!("psql exited with {status}:\n{output}");
    }
    let mut blocks: Vec<String> = output.split(&format!("{MARK}\n")).map(normalize).collect();
    // Before the first mark: the preamble's output (none); after the last: nothing.
    if blocks.len() != examples.len() + 2 {
        bail!(
            "psql ran {} of {} blocks:\n{output}",
            blocks.len().saturating_sub(2),
            examples.len()
        );
    }
    if !blocks[0].is_empty() {
        bail!("psql printed before the first example: {}", blocks[0]);
    }
    blocks.pop();
    blocks.remove(0);
    Ok(blocks)
}

/// `text` with each example's output replaced by `actual` (DEDUP_DOCS_BLESS=1).
pub fn bless(text: &str, examples: &[Example], actual: &[String]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = Vec::new();
    let mut at = 0;
    for (e, a) in examples.iter().zip(actual) {
        let (start, end) = e.output_lines;
        out.extend(lines[at..start].iter().map(|l| l.to_string()));
        if !a.is_empty() {
            if start == end {
                out.push(String::new());
            }
            out.push("```text".into());
            out.extend(a.lines().map(str::to_string));
            out.push("```".into());
            if start == end {
                out.push(String::new());
            }
        }
        at = end;
    }
    out.extend(lines[at..].iter().map(|l| l.to_string()));
    let mut s = out.join("\n");
    s.push('\n');
    // An example whose output went away leaves a blank line too many.
    while s.contains("```\n\n\n") {
        s = s.replace("```\n\n\n", "```\n\n");
    }
    s
}

/// Run every example of `file` in a new database `dbname`: the mismatches, as a report
/// (empty: all equal). With `bless`, write the actual outputs into the file instead.
pub fn check_file(cluster: &Cluster, file: &Path, dbname: &str, bless_it: bool) -> Result<String> {
    let text = std::fs::read_to_string(file)?;
    let examples = parse(&text).with_context(|| file.display().to_string())?;
    cluster.create_db_with_extension(dbname)?;
    let actual = run(cluster, dbname, &examples).with_context(|| file.display().to_string())?;
    if bless_it {
        let new = bless(&text, &examples, &actual);
        if new != text {
            std::fs::write(file, new)?;
        }
        return Ok(String::new());
    }
    let mut report = String::new();
    for (e, a) in examples.iter().zip(&actual) {
        if normalize(&e.expected) != *a {
            report.push_str(&format!(
                "{}:{}: the example's output differs\n--- the file shows\n{}\n--- psql printed\n{}\n",
                file.display(),
                e.line,
                e.expected,
                a
            ));
        }
    }
    Ok(report)
}

/// The files of docs/reference/, sorted.
pub fn reference_files() -> Result<Vec<std::path::PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| dir.display().to_string())?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|x| x == "md"));
    files.sort();
    Ok(files)
}

/// The server the examples run on: preloaded (the counters), the worker off.
pub fn start_cluster() -> Result<Cluster> {
    Cluster::start(
        crate::cluster::Options::named("doctest")
            .set("shared_preload_libraries", "dedup")
            .set("dedup.prune_interval", "0"),
    )
}

/// Every example of `files`, each file in a database of its own: the mismatches (empty:
/// all equal), or with `bless_it` the files rewritten with what psql printed.
pub fn check_files(
    cluster: &Cluster,
    files: &[std::path::PathBuf],
    bless_it: bool,
) -> Result<String> {
    let mut report = String::new();
    for (i, file) in files.iter().enumerate() {
        let stem: String = file
            .file_stem()
            .map(|s| s.to_string_lossy().to_lowercase())
            .unwrap_or_default()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        report.push_str(&check_file(
            cluster,
            file,
            &format!("doc_{i}_{stem}"),
            bless_it,
        )?);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_examples_with_and_without_output() {
        let text = "# t\n```sql\nSELECT 1;\n```\n\n```text\n x\n---\n 1\n```\n```sql\nBEGIN;\n```\nprose\n";
        let ex = parse(text).unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].sql, "SELECT 1;");
        assert_eq!(ex[0].expected, " x\n---\n 1");
        assert_eq!(ex[1].expected, "");
        let blessed = bless(text, &ex, &[" y".into(), "NOTICE:  n".into()]);
        assert_eq!(
            blessed,
            "# t\n```sql\nSELECT 1;\n```\n\n```text\n y\n```\n```sql\nBEGIN;\n```\n\n```text\nNOTICE:  n\n```\n\nprose\n"
        );
    }

    #[test]
    fn normalizes_what_varies() {
        assert_eq!(
            normalize("psql:<stdin>:12: ERROR:  22004: x\nHINT:  h  \nLOCATION:  f, claim.rs:3\n"),
            "ERROR:  22004: x\nHINT:  h"
        );
    }
}
