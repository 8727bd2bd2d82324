//! The docs stay true: every public function, view, table and setting in the catalog has
//! its entry in docs/reference/ and nothing else does, the reference's examples print what
//! it shows, every link resolves, CONTRIBUTING.md names every source file, the README stays
//! a landing page, the CHANGELOG dates every released version, and who may call each
//! function is what the catalog grants.
use crate::common::Ctx;
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::doctest;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> Result<String> {
    std::fs::read_to_string(root().join(rel)).with_context(|| rel.to_string())
}

fn section<'a>(readme: &'a str, marker: &str) -> Result<&'a str> {
    let start = format!("<!-- {marker} -->");
    let end = format!("<!-- /{marker} -->");
    let Some(s) = readme.find(&start) else {
        bail!("no {start} section")
    };
    let Some(e) = readme[s..].find(&end) else {
        bail!("no {end}")
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

pub async fn reference_documents_every_object(_ctx: Ctx) -> Result<()> {
    let index = read("docs/reference/README.md")?;
    let settings_page = read("docs/reference/settings.md")?;
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
    let in_readme = documented(section(&index, "functions").context("docs/reference/README.md")?);
    if functions != in_readme {
        bail!(
            "docs/reference/README.md's functions differ from the catalog\nnot documented: {:?}\ndocumented but missing: {:?}",
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
    let in_readme =
        documented(section(&settings_page, "settings").context("docs/reference/settings.md")?);
    if settings != in_readme {
        bail!(
            "docs/reference/settings.md's settings differ from pg_settings\nnot documented: {:?}\ndocumented but missing: {:?}",
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
        if !settings_page.lines().any(|l| l.starts_with(&want)) {
            bail!("docs/reference/settings.md has no settings row starting with {want}");
        }
    }

    // One `## dedup.name` entry per function name, view and table (docs/reference/*.md but
    // settings.md), and per setting (settings.md).
    let objects: BTreeSet<String> = c
        .query(
            "SELECT DISTINCT 'dedup.' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'dedup' AND p.proname NOT LIKE '\\_%' \
             UNION SELECT 'dedup.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'dedup' AND c.relkind IN ('r', 'p', 'v', 'm') AND c.relname NOT LIKE '\\_%'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut entries = BTreeSet::new();
    let mut setting_entries = BTreeSet::new();
    for file in doctest::reference_files()? {
        let text = std::fs::read_to_string(&file)?;
        let is_settings = file.file_name().is_some_and(|n| n == "settings.md");
        for name in text.lines().filter_map(|l| l.strip_prefix("## dedup.")) {
            let name = format!("dedup.{}", name.trim_end());
            let set = if is_settings {
                &mut setting_entries
            } else {
                &mut entries
            };
            if !set.insert(name.clone()) {
                bail!("{}: a second entry for {name}", file.display());
            }
        }
    }
    if entries != objects {
        bail!(
            "docs/reference/ entries differ from the catalog's functions, views and tables\nno entry: {:?}\nan entry but not in the catalog: {:?}",
            objects.difference(&entries).collect::<Vec<_>>(),
            entries.difference(&objects).collect::<Vec<_>>()
        );
    }
    if setting_entries != settings {
        bail!(
            "docs/reference/settings.md's entries differ from pg_settings\nno entry: {:?}\nan entry but no setting: {:?}",
            settings.difference(&setting_entries).collect::<Vec<_>>(),
            setting_entries.difference(&settings).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// Every example of docs/reference/ prints, run against a real server, what the page shows
/// (pg_test/src/doctest.rs says how they run; `cargo run -p dedup-pg-test --bin doctest`
/// runs them alone, `--bless` writes psql's output into the pages).
pub async fn reference_examples_run_as_shown(_ctx: Ctx) -> Result<()> {
    let files = doctest::reference_files()?;
    if files.len() < 7 {
        bail!(
            "docs/reference/ has {} pages, want the 7 of its index",
            files.len() - 1
        );
    }
    let cluster = doctest::start_cluster()?;
    let report = doctest::check_files(&cluster, &files, false)?;
    if !report.is_empty() {
        bail!("{report}");
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

/// Every file under the repository's directories `dirs`, by its path from the root, sorted.
fn files_under(dirs: &[&str]) -> Result<Vec<String>> {
    let mut dirs: Vec<String> = dirs.iter().map(|d| d.to_string()).collect();
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(root().join(&dir))? {
            let e = e?;
            let rel = format!("{dir}/{}", e.file_name().to_string_lossy());
            if e.file_type()?.is_dir() {
                dirs.push(rel);
            } else {
                files.push(rel);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The Markdown a reader follows: the README, CONTRIBUTING.md, the CHANGELOG and docs/.
fn markdown_files() -> Result<Vec<String>> {
    let mut files = vec![
        "README.md".to_string(),
        "CONTRIBUTING.md".into(),
        "CHANGELOG.md".into(),
    ];
    files.extend(
        files_under(&["docs"])?
            .into_iter()
            .filter(|f| f.ends_with(".md")),
    );
    Ok(files)
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, other punctuation dropped; a
/// repeated heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every relative link `](path)` or `](path#anchor)` or `](#anchor)` outside code blocks.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push((i + 1, target.to_string()));
            }
            rest = &rest[end..];
        }
    }
    out
}

/// Every relative link of the README, CONTRIBUTING.md, the CHANGELOG and docs/ reaches a file
/// of the repository, and every `#anchor` a heading of that file.
pub async fn links_in_the_docs_resolve(_ctx: Ctx) -> Result<()> {
    let mut broken = Vec::new();
    for file in markdown_files()? {
        let text = read(&file)?;
        let dir = Path::new(&file)
            .parent()
            .unwrap_or(Path::new(""))
            .to_path_buf();
        for (line, target) in links(&text) {
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                PathBuf::from(&file)
            } else {
                dir.join(path)
            };
            let full = root().join(&resolved);
            if !full.exists() {
                broken.push(format!("{file}:{line}: {target}: no such file"));
                continue;
            }
            if !anchor.is_empty() {
                if resolved.extension().is_none_or(|x| x != "md") {
                    continue;
                }
                let text = std::fs::read_to_string(&full)?;
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{file}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    if !broken.is_empty() {
        bail!("broken links:\n{}", broken.join("\n"));
    }
    Ok(())
}

/// CONTRIBUTING.md's layout names every file of the extension and of its tests, by its path
/// in backticks: a new file without a line there fails here.
pub async fn contributing_names_every_source_file(_ctx: Ctx) -> Result<()> {
    let contributing = read("CONTRIBUTING.md")?;
    let missing: Vec<String> =
        files_under(&["src", "sql", "pg_test/src", "pg_test/tests", "scripts"])?
            .into_iter()
            .filter(|f| !contributing.contains(&format!("`{f}`")))
            .collect();
    if !missing.is_empty() {
        bail!(
            "CONTRIBUTING.md's layout does not name: {}",
            missing.join(", ")
        );
    }
    Ok(())
}

/// docs/reference/errors.md is the catalogue of dedup's errors, checked both ways: every
/// hint and detail the native library (src/), the concern files of sql/ and the portable
/// edition (sql/portable/, its switch and scripts/portable.py's scripts) raise is there word
/// for word, every one written there is raised, the portable edition's own are under their
/// heading, and a portable raise of a native message has its SQLSTATE and hint
/// (scripts/check-errors.py).
pub async fn every_hint_is_in_the_errors_reference(_ctx: Ctx) -> Result<()> {
    crate::common::python(&root().join("scripts/check-errors.py"), &[])
}

/// The README is a landing page (about 300 lines at most); the detail lives in docs/.
pub async fn readme_stays_a_landing_page(_ctx: Ctx) -> Result<()> {
    let lines = read("README.md")?.lines().count();
    if lines > 300 {
        bail!("README.md has {lines} lines; keep it to 300 and move the detail into docs/");
    }
    Ok(())
}

/// Every version of the CHANGELOG but the newest carries its release date, the newest its
/// date or `(unreleased)`, and the newest is the version Cargo.toml builds.
pub async fn changelog_dates_every_released_version(_ctx: Ctx) -> Result<()> {
    let changelog = read("CHANGELOG.md")?;
    let cargo = read("Cargo.toml")?;
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .context("Cargo.toml: no version")?;
    let headings: Vec<&str> = changelog.lines().filter(|l| l.starts_with("## ")).collect();
    let Some(first) = headings.first() else {
        bail!("CHANGELOG.md has no version")
    };
    if !first.starts_with(&format!("## {version} (")) {
        bail!("CHANGELOG.md starts with {first:?}; Cargo.toml builds {version}");
    }
    for (i, h) in headings.iter().enumerate() {
        let date = h
            .rsplit_once('(')
            .map(|(_, d)| d.trim_end_matches(')'))
            .unwrap_or("");
        let is_date = date.len() == 10
            && date.bytes().enumerate().all(|(k, b)| {
                if k == 4 || k == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            });
        if !(is_date || (i == 0 && date == "unreleased")) {
            bail!(
                "CHANGELOG.md: {h:?} wants its release date (YYYY-MM-DD){}",
                if i == 0 { " or (unreleased)" } else { "" }
            );
        }
    }
    Ok(())
}

/// Who may call a function, as the reference says it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    /// `EXECUTE` granted to `PUBLIC`.
    AnyRole,
    /// Not to `PUBLIC`, to `pg_monitor`.
    Monitor,
    /// Neither: superusers, the owner, or roles granted `EXECUTE` by hand.
    Privileged,
}

fn who(text: &str) -> Option<Who> {
    let t = text.to_lowercase();
    if t.trim_start().starts_with("any role") {
        Some(Who::AnyRole)
    } else if t.contains("superusers and members of `pg_monitor`") || t.trim() == "`pg_monitor`" {
        Some(Who::Monitor)
    } else if t.contains("superusers, or") || t.contains("the extension's owner") {
        Some(Who::Privileged)
    } else {
        None
    }
}

/// `dedup.name(arg type DEFAULT x, OUT o type)` as `dedup.name(type)`, for to_regprocedure.
fn regprocedure(signature: &str) -> Option<String> {
    let open = signature.find('(')?;
    let args = signature[open + 1..].strip_suffix(')')?;
    let types: Vec<&str> = args
        .split(", ")
        .filter(|a| !a.is_empty() && !a.starts_with("OUT "))
        .map(|a| a.split(" DEFAULT ").next().unwrap())
        .map(|a| a.split_once(' ').map_or(a, |(_, t)| t))
        .collect();
    Some(format!("{}({})", &signature[..open], types.join(", ")))
}

/// The reference's "Who" of each function (the index's column, and each entry's "Who may
/// call it") is what the catalog grants: `EXECUTE` to `PUBLIC` for "any role", to
/// `pg_monitor` and not `PUBLIC` for `pg_monitor`, to neither for superusers and the owner.
/// Checked with has_function_privilege for `pg_monitor` and for a new role that holds
/// nothing but what `PUBLIC` has.
pub async fn who_may_call_each_function_is_what_the_catalog_grants(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    let nobody = format!("only_public_{}", ctx.db);
    c.batch_execute(&format!("CREATE ROLE {nobody} NOLOGIN"))
        .await?;
    let granted = |oid: u32| {
        let c = &c;
        let nobody = nobody.clone();
        async move {
            let r = c
                .query_one(
                    "SELECT has_function_privilege($1, $2::oid, 'EXECUTE'), \
                            has_function_privilege('pg_monitor', $2::oid, 'EXECUTE')",
                    &[&nobody, &oid],
                )
                .await?;
            Ok::<_, anyhow::Error>(match (r.get::<_, bool>(0), r.get::<_, bool>(1)) {
                (true, _) => Who::AnyRole,
                (false, true) => Who::Monitor,
                (false, false) => Who::Privileged,
            })
        }
    };
    let mut wrong = Vec::new();
    let mut checked = 0;
    // The index: one row per function, by signature.
    let readme = read("docs/reference/README.md")?;
    for line in section(&readme, "functions")?.lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let Some((signature, rest)) = rest.split_once('`') else {
            continue;
        };
        let column = rest.rsplit('|').nth(1).unwrap_or("").trim();
        let Some(said) = who(column) else {
            wrong.push(format!(
                "{signature}: the Who column {column:?} says none of the three"
            ));
            continue;
        };
        let proc = regprocedure(signature)
            .with_context(|| format!("the index's signature {signature}"))?;
        let oid: Option<u32> = c
            .query_one("SELECT to_regprocedure($1)::oid", &[&proc])
            .await?
            .get(0);
        let Some(oid) = oid else {
            wrong.push(format!("{signature}: no function {proc}"));
            continue;
        };
        let is = granted(oid).await?;
        if is != said {
            wrong.push(format!(
                "{proc}: the index says {said:?}, the catalog grants {is:?}"
            ));
        }
        checked += 1;
    }
    // Each entry: every overload of its name.
    let mut entries = 0;
    for file in ["claims", "external-effects", "monitoring", "retention"] {
        let text = read(&format!("docs/reference/{file}.md"))?;
        for part in text.split("\n## dedup.").skip(1) {
            let name = part.split_whitespace().next().unwrap_or("");
            let Some(at) = part.find("**Who may call it**") else {
                wrong.push(format!(
                    "{file}.md: dedup.{name} has no \"Who may call it\""
                ));
                continue;
            };
            let para = part[at + "**Who may call it**".len()..]
                .split("\n\n")
                .next()
                .unwrap_or("")
                .trim_start_matches(':')
                .replace('\n', " ");
            let Some(said) = who(&para) else {
                wrong.push(format!(
                    "{file}.md: dedup.{name}: {para:?} says none of the three"
                ));
                continue;
            };
            let oids: Vec<u32> = c
                .query(
                    "SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                      WHERE n.nspname = 'dedup' AND p.proname = $1",
                    &[&name],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if oids.is_empty() {
                wrong.push(format!("{file}.md: no function dedup.{name}"));
            }
            for oid in oids {
                let is = granted(oid).await?;
                if is != said {
                    wrong.push(format!(
                        "{file}.md: dedup.{name} (oid {oid}): the entry says {said:?}, the catalog grants {is:?}"
                    ));
                }
            }
            entries += 1;
        }
    }
    c.batch_execute(&format!("DROP ROLE {nobody}")).await?;
    if !wrong.is_empty() {
        bail!(
            "the reference and the catalog disagree:\n{}",
            wrong.join("\n")
        );
    }
    println!("  {checked} rows of the index and {entries} entries checked against the catalog");
    if checked < 30 || entries < 20 {
        bail!(
            "only {checked} index rows and {entries} entries read: the reference's layout changed"
        );
    }
    Ok(())
}
