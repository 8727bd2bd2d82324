//! The scripts a new machine runs first (`make demo`, `make test`, `make install`), checked
//! without a server and without installing anything: what sourcing a script runs, what each
//! setup profile installs, that nothing reads from outside the repository, and the vendored
//! sources against their pins. Run once by `make test` (`cargo test -p dedup-pg-test --test
//! scripts`).
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A new directory under /tmp, readable by everyone (the `postgres` user checks a tree in it),
/// removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(name: &str) -> TempDir {
        let out = Command::new("mktemp")
            .args(["-d", &format!("/tmp/dedup-scripts-{name}-XXXXXX")])
            .output()
            .expect("mktemp");
        let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(dir)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// An executable at `path` that appends its name and arguments to `log`, then exits with
/// `status`.
fn stub(path: &Path, log: &Path, status: i32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(
        path,
        format!(
            "#!/bin/sh\necho \"$(basename \"$0\") $*\" >> '{}'\nexit {status}\n",
            log.display()
        ),
    )
    .unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// `bash -c SCRIPT` in the repository with the given environment (on top of this one, less
/// the variables that point the scripts at a tree).
fn bash(script: &str, env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new("bash");
    c.arg("-c").arg(script).current_dir(repo());
    for v in [
        "DEDUP_PG_CONFIG",
        "DEDUP_PG_BINDIR",
        "DEDUP_PG_MAJOR",
        "SETUP_MAJORS",
        "PG",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("bash")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `bash -c 'source scripts/pg.sh; pg_tree N'` for every major: the tree paths under a root.
fn trees(root: &Path) -> Vec<PathBuf> {
    let o = bash(
        "source scripts/pg.sh; for m in \"${PG_MAJORS_ALL[@]}\"; do pg_tree $m; done",
        &[("DEDUP_PG_ROOT", root)],
    );
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Every script under scripts/ that another script sources (`source ".../NAME.sh"`).
fn sourced_scripts() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for entry in fs::read_dir(repo().join("scripts")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sh") {
            for line in fs::read_to_string(&path).unwrap().lines() {
                let line = line.trim_start();
                if let Some(rest) = line.strip_prefix("source ") {
                    let name = rest.trim_matches('"').rsplit('/').next().unwrap();
                    found.insert(name.trim_matches('"').to_string());
                }
            }
        }
    }
    found
}

/// Sourcing a script runs no PostgreSQL binary: not with no tree at all (a new machine,
/// before setup), and not with trees whose binaries only record that they ran (a machine
/// that has them, where a call would go unnoticed). Failed at c589d1d: lib.sh ran
/// pg_config when sourced, and `make demo` exited 127 on a new machine.
#[test]
fn sourcing_a_script_runs_no_postgresql_binary() {
    let sourced = sourced_scripts();
    for must in ["lib.sh", "pg.sh", "vendor.sh"] {
        assert!(
            sourced.contains(must),
            "{must} is no longer sourced: {sourced:?}"
        );
    }
    let empty = TempDir::new("empty");
    let fake = TempDir::new("fake");
    let log = fake.0.join("ran.log");
    for tree in trees(&fake.0) {
        for bin in [
            "pg_config",
            "postgres",
            "psql",
            "initdb",
            "pg_ctl",
            "pg_isready",
        ] {
            stub(&tree.join("bin").join(bin), &log, 0);
        }
    }
    for script in &sourced {
        for root in [&empty.0, &fake.0] {
            let o = bash(
                &format!("source scripts/{script}"),
                &[("DEDUP_PG_ROOT", root.as_path())],
            );
            assert!(
                o.status.success() && o.stderr.is_empty(),
                "sourcing scripts/{script} with DEDUP_PG_ROOT={} failed or complained:\n{}",
                root.display(),
                text(&o)
            );
        }
        let ran = fs::read_to_string(&log).unwrap_or_default();
        assert!(ran.is_empty(), "sourcing scripts/{script} ran: {ran}");
    }
}

/// Every script a Makefile target runs calls setup before anything that needs a tree
/// (`use_major`, which runs its pg_config).
#[test]
fn every_makefile_target_sets_up_before_it_uses_a_tree() {
    let makefile = fs::read_to_string(repo().join("Makefile")).unwrap();
    let scripts: BTreeSet<&str> = makefile
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("scripts/"))
        .filter(|w| w.ends_with(".sh"))
        .collect();
    assert!(
        scripts.contains("demo.sh") && scripts.contains("test.sh"),
        "{scripts:?}"
    );
    for script in scripts {
        let body = fs::read_to_string(repo().join("scripts").join(script)).unwrap();
        let code: Vec<&str> = body
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        let first = |what: &str| code.iter().position(|l| l.contains(what));
        if let Some(uses) = first("use_major ") {
            let setup = first("scripts/setup.sh");
            assert!(
                setup.is_some_and(|s| s < uses),
                "scripts/{script} calls use_major before scripts/setup.sh"
            );
        }
    }
}

/// What each setup profile installs, on a machine that has nothing (every Debian package
/// missing, no cargo-pgrx, no pgrx configuration): apt-get, cargo, python3, make and npm are stubs that
/// record their calls. `build` (make install) installs clang and cargo-pgrx only; `demo`
/// adds what the demo needs and registers the one major's tree: never Citus, pg_tle, Node,
/// Debian's PostgreSQL 15 or another major.
#[test]
fn each_setup_profile_installs_only_what_its_commands_need() {
    let dir = TempDir::new("setup");
    let log = dir.0.join("calls.log");
    let bin = dir.0.join("bin");
    stub(&bin.join("dpkg-query"), &log, 1); // nothing is installed
    for tool in ["apt-get", "python3", "npm", "make", "adduser"] {
        stub(&bin.join(tool), &log, 0);
    }
    // cargo: `cargo pgrx --version` fails (not installed); every other call is recorded.
    fs::write(
        bin.join("cargo"),
        format!(
            "#!/bin/sh\n[ \"$1 $2\" = \"pgrx --version\" ] && exit 1\necho \"cargo $*\" >> '{}'\n",
            log.display()
        ),
    )
    .unwrap();
    fs::set_permissions(bin.join("cargo"), fs::Permissions::from_mode(0o755)).unwrap();
    // The trees are there already (their download is the wheels' test, in .ci/run), so
    // the profile decides only what is registered and built into them.
    let root = dir.0.join("pg");
    let trees = trees(&root);
    let pin = bash(
        "source scripts/pg.sh; for m in \"${PG_MAJORS_ALL[@]}\"; do echo ${PG_WHEEL_SHA256[$m]}; done",
        &[],
    );
    let pins: Vec<String> = String::from_utf8(pin.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    for (tree, pin) in trees.iter().zip(&pins) {
        stub(&tree.join("bin").join("pg_config"), &log, 0);
        fs::write(tree.join(".dedup-sha256"), format!("{pin}\n")).unwrap();
    }
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = |profile: &str| -> Vec<String> {
        let _ = fs::remove_file(&log);
        let pgrx_home = dir.0.join(format!("pgrx-{profile}"));
        let o = bash(
            &format!("bash scripts/setup.sh {profile}"),
            &[
                ("PATH", Path::new(&path)),
                ("HOME", dir.0.as_path()),
                ("DEDUP_PG_ROOT", root.as_path()),
                ("PGRX_HOME", pgrx_home.as_path()),
            ],
        );
        assert!(o.status.success(), "setup.sh {profile}:\n{}", text(&o));
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let installs = |calls: &[String]| -> BTreeSet<String> {
        calls
            .iter()
            .filter_map(|c| c.strip_prefix("apt-get "))
            .filter(|c| c.contains("install"))
            .flat_map(|c| c.split_whitespace().map(str::to_string))
            .filter(|w| !w.starts_with('-') && w != "install")
            .collect()
    };
    let set = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<BTreeSet<_>>();
    let pgrx_install = "cargo install cargo-pgrx --version 0.18.1 --locked --quiet";

    let build = run("build");
    assert_eq!(
        installs(&build),
        set(&["libclang-dev", "clang"]),
        "{build:#?}"
    );
    assert!(build.iter().any(|c| c == pgrx_install), "{build:#?}");
    assert!(
        !build
            .iter()
            .any(|c| c.contains("pgrx init") || c.starts_with("make") || c.starts_with("npm")),
        "setup.sh build did more than clang and cargo-pgrx: {build:#?}"
    );

    let demo = run("demo");
    assert_eq!(
        installs(&demo),
        set(&[
            "libclang-dev",
            "clang",
            "libkrb5-dev",
            "unzip",
            "redis-server"
        ]),
        "{demo:#?}"
    );
    assert!(demo.iter().any(|c| c == pgrx_install), "{demo:#?}");
    let init: Vec<&String> = demo.iter().filter(|c| c.contains("pgrx init")).collect();
    assert_eq!(
        init,
        [&format!(
            "cargo pgrx init --pg15 {}",
            trees[0].join("bin/pg_config").display()
        )],
        "the demo registers PostgreSQL 15's tree only: {demo:#?}"
    );
    assert!(
        !demo.iter().any(|c| c.starts_with("make") || c.starts_with("npm") || c.starts_with("python3")),
        "setup.sh demo built Citus or pg_tle, downloaded a tree it has, or installed the examples' dependencies: {demo:#?}"
    );
}

/// No file of the Makefile, scripts/ or .ci/ reads from outside the repository: a user's
/// clone has nothing beside it. Failed at c589d1d: citus.sh and pgtle.sh read
/// ../shared/vendor.
#[test]
fn nothing_reads_from_outside_the_repository() {
    let mut files = vec![repo().join("Makefile")];
    for dir in ["scripts", ".ci"] {
        for entry in fs::read_dir(repo().join(dir)).unwrap() {
            files.push(entry.unwrap().path());
        }
    }
    for file in files {
        let body = fs::read_to_string(&file).unwrap();
        for (n, line) in body.lines().enumerate() {
            assert!(
                !line.contains("../shared") && !line.contains("shared/vendor"),
                "{}:{}: names a folder outside the repository: {line}",
                file.display(),
                n + 1
            );
        }
    }
}

/// The vendored sources match their pins, each with its licence, and stay out of what is
/// shipped: `git archive` (which .gitattributes tells to leave pg_test/vendor out).
#[test]
fn vendored_sources_are_pinned_licensed_and_not_shipped() {
    let vendor = repo().join("pg_test/vendor");
    let o = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&vendor)
        .output()
        .unwrap();
    assert!(o.status.success(), "sha256sum --check:\n{}", text(&o));
    let sums = fs::read_to_string(vendor.join("SHA256SUMS")).unwrap();
    let names: Vec<&str> = sums
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(names, ["citus-14.0.1.tar.gz", "pg_tle-1.5.2.tar.gz"]);
    for name in &names {
        let stem = name.trim_end_matches(".tar.gz");
        let licence = vendor.join("licenses").join(format!("{stem}.LICENSE"));
        assert!(
            fs::metadata(&licence).is_ok_and(|m| m.len() > 1000),
            "{} is missing",
            licence.display()
        );
    }
    let attributes = fs::read_to_string(repo().join(".gitattributes")).unwrap_or_default();
    assert!(
        attributes
            .lines()
            .any(|l| l.trim() == "/pg_test/vendor export-ignore"),
        ".gitattributes does not leave pg_test/vendor out of git archive"
    );
    if repo().join(".git").exists() {
        let o = Command::new("git")
            .args(["archive", "--format=tar", "HEAD"])
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(o.status.success(), "git archive: {}", text(&o));
        let listing = Command::new("tar")
            .arg("t")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut tar| {
                use std::io::Write;
                tar.stdin.take().unwrap().write_all(&o.stdout)?;
                tar.wait_with_output()
            })
            .unwrap();
        let listing = String::from_utf8(listing.stdout).unwrap();
        assert!(
            listing.lines().any(|l| l == "Cargo.toml"),
            "git archive lists no Cargo.toml"
        );
        assert!(
            !listing.lines().any(|l| l.starts_with("pg_test/vendor")),
            "git archive ships pg_test/vendor"
        );
    }
}
