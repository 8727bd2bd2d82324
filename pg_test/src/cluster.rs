//! Throwaway PostgreSQL clusters: `initdb` into a temporary directory, start on a free
//! loopback port with a socket directory of their own, stop and delete on drop.
//!
//! PostgreSQL refuses to run as root, so when we are root every server command runs as
//! the `postgres` system user (`runuser -u postgres`), which owns the directory.
use anyhow::{bail, Context, Result};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

/// Data directories of running clusters, so Ctrl-C or SIGTERM can stop them all.
static LIVE: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());
static SEQ: AtomicU32 = AtomicU32::new(0);
static SIGNALS: Once = Once::new();

/// The pg_config of the server we test against: `DEDUP_PG_CONFIG` (the scripts set it to
/// the tree of the major they test), else the project's PostgreSQL 15 tree
/// (scripts/pg.sh), never the system's server.
pub fn pg_config() -> PathBuf {
    std::env::var_os("DEDUP_PG_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let root =
                std::env::var_os("DEDUP_PG_ROOT").unwrap_or_else(|| "/var/cache/dedup".into());
            PathBuf::from(root).join("postgresql-15.19.0-x86_64-unknown-linux-gnu/bin/pg_config")
        })
}

/// Which dedup the tests run against (`DEDUP_EDITION`): the native extension (the default),
/// or the portable edition (docs/portable.md) registered through pg_tle (`pgtle`) or
/// created by its plain script (`plain`), from `DEDUP_PORTABLE_DIR` (default
/// target/portable, what `make portable` writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edition {
    Native,
    PgTle,
    Plain,
}

pub fn edition() -> Edition {
    match std::env::var("DEDUP_EDITION").as_deref() {
        Ok("pgtle") => Edition::PgTle,
        Ok("plain") => Edition::Plain,
        Ok("native") | Ok("") | Err(_) => Edition::Native,
        Ok(other) => panic!("DEDUP_EDITION={other}: native, pgtle or plain"),
    }
}

/// A file of the portable edition (`dedup.pgtle.sql`, `dedup.plain.sql`, `dedup.to-native.sql`).
pub fn portable_file(name: &str) -> PathBuf {
    std::env::var_os("DEDUP_PORTABLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/portable"))
        .join(name)
}

/// The server's binary directory, from pg_config.
pub fn bindir() -> Result<PathBuf> {
    let out = Command::new(pg_config())
        .arg("--bindir")
        .output()
        .with_context(|| format!("running {}", pg_config().display()))?;
    if !out.status.success() {
        bail!("pg_config --bindir failed");
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A command that runs as the `postgres` system user when we are root. Without
/// `RUST_BACKTRACE`: with it in a server's environment, pgrx appends a Rust backtrace to the
/// DETAIL of a PostgreSQL error raised inside dedup's functions (a unique violation of an
/// index of one's own), which clients then see; the tests run servers as users should.
pub fn as_server_user(program: impl AsRef<Path>) -> Command {
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program.as_ref());
        c
    } else {
        Command::new(program.as_ref())
    };
    c.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    c
}

/// Run a command; its output, or an error with its output if it failed.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// A port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Stop every cluster still running on Ctrl-C or SIGTERM, then exit; first kill the
/// registered child processes ([`crate::children`]).
pub fn stop_all_on_signal() {
    SIGNALS.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            crate::children::kill_all();
            eprintln!("interrupted: stopping throwaway PostgreSQL servers");
            let live = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
            for (bindir, data) in live {
                let _ = as_server_user(bindir.join("pg_ctl"))
                    .args(["-D"])
                    .arg(&data)
                    .args(["-m", "immediate", "-w", "stop"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                if let Some(dir) = data.parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
            std::process::exit(130);
        });
    });
}

/// Settings for a new cluster.
#[derive(Clone, Default)]
pub struct Options {
    /// Extra `postgresql.conf` lines, e.g. `("shared_buffers", "1GB")`.
    pub conf: Vec<(String, String)>,
    /// Label in the directory name, for whoever looks at /tmp.
    pub name: String,
}

impl Options {
    pub fn named(name: &str) -> Self {
        Options {
            name: name.to_string(),
            ..Default::default()
        }
    }
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.conf.push((key.to_string(), value.to_string()));
        self
    }
}

pub struct Cluster {
    pub port: u16,
    pub dir: PathBuf,
    pub data: PathBuf,
    pub bindir: PathBuf,
    running: bool,
}

impl Cluster {
    /// `initdb` a new cluster and start it.
    pub fn start(opts: Options) -> Result<Cluster> {
        Self::start_with(bindir()?, opts)
    }

    /// `initdb` a new cluster of the server in `bindir` (another major's tree) and start it.
    pub fn start_with(bindir: PathBuf, opts: Options) -> Result<Cluster> {
        let mut c = Self::init(bindir, opts)?;
        c.start_server()?;
        Ok(c)
    }

    /// `pg_upgrade` this cluster (stopped first) into a new cluster of the server in
    /// `bindir`, with `opts` in its configuration, left stopped ([`Cluster::start_again`]
    /// starts it). This cluster's data directory stays as pg_upgrade left it (copy mode).
    pub fn pg_upgrade_to(&mut self, bindir: PathBuf, opts: Options) -> Result<Cluster> {
        self.stop("fast")?;
        // pg_upgrade wants the same data checksums on both sides; PostgreSQL 18's initdb
        // turns them on unless told not to.
        let control = run(as_server_user(self.bindir.join("pg_controldata")).arg(&self.data))?;
        let checksums = String::from_utf8_lossy(&control.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("Data page checksum version:"))
            .map(|v| v.trim() != "0")
            .context("pg_controldata printed no data page checksum version")?;
        let help = run(Command::new(bindir.join("initdb")).arg("--help"))?;
        let flag = if checksums {
            Some("--data-checksums")
        } else if String::from_utf8_lossy(&help.stdout).contains("--no-data-checksums") {
            Some("--no-data-checksums")
        } else {
            None
        };
        let new = Self::init_with(bindir, opts, flag)?;
        // pg_upgrade writes its logs and sockets into its working directory.
        let out = as_server_user(new.bindir.join("pg_upgrade"))
            .current_dir(&new.dir)
            .arg("-b")
            .arg(&self.bindir)
            .arg("-B")
            .arg(&new.bindir)
            .arg("-d")
            .arg(&self.data)
            .arg("-D")
            .arg(&new.data)
            .args(["-U", "postgres", "--no-sync"])
            .arg("-p")
            .arg(free_port()?.to_string())
            .arg("-P")
            .arg(free_port()?.to_string())
            .stdin(Stdio::null())
            .output()
            .context("running pg_upgrade")?;
        if !out.status.success() {
            bail!(
                "pg_upgrade failed with {}:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(new)
    }

    fn init(bindir: PathBuf, opts: Options) -> Result<Cluster> {
        Self::init_with(bindir, opts, None)
    }

    fn init_with(bindir: PathBuf, opts: Options, extra: Option<&str>) -> Result<Cluster> {
        let dir = Self::make_dir(&opts.name)?;
        let data = dir.join("data");
        run(as_server_user(bindir.join("initdb"))
            .args(extra)
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]))?;
        let mut c = Cluster {
            port: 0,
            dir,
            data,
            bindir,
            running: false,
        };
        c.write_conf(&opts)?;
        Ok(c)
    }

    /// A streaming standby of `primary`, started (hot standby: read-only queries work), with
    /// `opts` added to the configuration it copied from the primary.
    pub fn standby_of(primary: &Cluster, opts: Options) -> Result<Cluster> {
        let dir = Self::make_dir("standby")?;
        let data = dir.join("data");
        run(as_server_user(primary.bindir.join("pg_basebackup"))
            .arg("-D")
            .arg(&data)
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ])
            .arg("-p")
            .arg(primary.port.to_string()))?;
        // The connection string `-R` writes holds every option this major's libpq knows
        // (17 adds sslnegotiation), but the walreceiver of the wheels' servers loads the
        // system's older libpq, which refuses an option it does not know: the standby
        // would never stream (it only had what the base backup copied). The options that
        // matter here, and nothing else.
        let auto = data.join("postgresql.auto.conf");
        let text = std::fs::read_to_string(&auto)?;
        let mut kept: Vec<String> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("primary_conninfo"))
            .map(str::to_string)
            .collect();
        kept.push(format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres'",
            primary.port
        ));
        std::fs::write(&auto, kept.join("\n") + "\n")?;
        let mut c = Cluster {
            port: 0,
            dir,
            data,
            bindir: primary.bindir.clone(),
            running: false,
        };
        c.write_conf(&opts)?;
        c.start_server()?;
        Ok(c)
    }

    fn make_dir(name: &str) -> Result<PathBuf> {
        let dir = std::env::temp_dir().join(format!(
            "dedup-{}-{}-{}",
            if name.is_empty() { "pg" } else { name },
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        if is_root() {
            run(Command::new("chown").arg("postgres:").arg(&dir))?;
        }
        Ok(dir)
    }

    fn write_conf(&mut self, opts: &Options) -> Result<()> {
        self.port = free_port()?;
        let mut conf = format!(
            "\n# dedup throwaway cluster\nport = {}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nmax_connections = 120\nfsync = on\n\
             log_line_prefix = '%m [%p] %q%a '\n",
            self.port,
            self.dir.display()
        );
        for (k, v) in &opts.conf {
            // pg_tle must be preloaded for the pgtle edition, whatever else a test loads.
            let v = if k == "shared_preload_libraries" && edition() == Edition::PgTle {
                format!("pg_tle,{v}")
            } else {
                v.clone()
            };
            conf.push_str(&format!("{k} = '{}'\n", v.replace('\'', "''")));
        }
        if edition() == Edition::PgTle
            && !opts
                .conf
                .iter()
                .any(|(k, _)| k == "shared_preload_libraries")
        {
            conf.push_str("shared_preload_libraries = 'pg_tle'\n");
        }
        // Appending as root to a file owned by postgres is fine: ownership stays.
        let path = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path)?;
        // A standby copies its primary's settings: the last occurrence wins, so appending works.
        text.push_str(&conf);
        std::fs::write(&path, text)?;
        Ok(())
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output> {
        run(as_server_user(self.bindir.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.log())
            .args(args))
    }

    fn start_server(&mut self) -> Result<()> {
        self.pg_ctl(&["-w", "-t", "120", "start"])
            .with_context(|| format!("starting server; log:\n{}", self.log_tail(30)))?;
        self.running = true;
        LIVE.lock()
            .unwrap()
            .push((self.bindir.clone(), self.data.clone()));
        Ok(())
    }

    /// Stop with `mode` (`fast`, `immediate`, `smart`).
    pub fn stop(&mut self, mode: &str) -> Result<()> {
        if self.running {
            self.pg_ctl(&["-m", mode, "-w", "-t", "120", "stop"])?;
            self.running = false;
            LIVE.lock().unwrap().retain(|(_, d)| d != &self.data);
        }
        Ok(())
    }

    /// Start again after [`Cluster::stop`], on the same port.
    pub fn start_again(&mut self) -> Result<()> {
        self.start_server()
    }

    /// `pg_ctl promote`: the standby leaves recovery and accepts writes.
    pub fn promote(&self) -> Result<()> {
        self.pg_ctl(&["-w", "-t", "120", "promote"])?;
        Ok(())
    }

    /// Add settings to postgresql.conf (they apply at the next reload or restart).
    pub fn append_conf(&self, opts: &Options) -> Result<()> {
        let path = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path)?;
        for (k, v) in &opts.conf {
            text.push_str(&format!("{k} = '{}'\n", v.replace('\'', "''")));
        }
        std::fs::write(&path, text)?;
        Ok(())
    }

    /// The whole server log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// The last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// libpq / tokio-postgres connection string for `dbname`.
    pub fn dsn(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={dbname}",
            self.port
        )
    }

    /// Run SQL through psql (`-X -v ON_ERROR_STOP=1 -At`) and return its output.
    pub fn psql(&self, dbname: &str, sql: &str) -> Result<String> {
        let out = run(Command::new(self.bindir.join("psql"))
            .args([
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-At",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
            ])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(dbname)
            .arg("-c")
            .arg(sql))?;
        Ok(String::from_utf8(out.stdout)?.trim_end().to_string())
    }

    /// A new database with the extension installed (the edition of [`edition`]).
    pub fn create_db_with_extension(&self, dbname: &str) -> Result<()> {
        self.psql("postgres", &format!("CREATE DATABASE {dbname}"))?;
        self.install_dedup(dbname)
    }

    /// dedup in an existing database: `CREATE EXTENSION dedup`; for the pgtle edition after
    /// `CREATE EXTENSION pg_tle` and the registration script; for the plain edition its
    /// script instead.
    pub fn install_dedup(&self, dbname: &str) -> Result<()> {
        self.install_edition(dbname, edition())
    }

    /// dedup of `edition` in an existing database, whatever `DEDUP_EDITION` says (the test of
    /// the switch to the native extension installs the portable editions itself).
    pub fn install_edition(&self, dbname: &str, edition: Edition) -> Result<()> {
        match edition {
            Edition::Native => {
                self.psql(dbname, "CREATE EXTENSION dedup")?;
            }
            Edition::PgTle => {
                self.register_with_pgtle(dbname)?;
                self.psql(dbname, "CREATE EXTENSION dedup")?;
            }
            Edition::Plain => {
                self.psql_file(dbname, &portable_file("dedup.plain.sql"))?;
            }
        }
        Ok(())
    }

    /// The SQL that installs dedup in `dbname`, to run in a session of one's own (e.g.
    /// under a hostile search_path): `CREATE EXTENSION dedup` (for the pgtle edition once
    /// pg_tle and the registration are in that database), or the plain script's text.
    pub fn install_statement(&self, dbname: &str) -> Result<String> {
        Ok(match edition() {
            Edition::Native => "CREATE EXTENSION dedup;".to_string(),
            Edition::PgTle => {
                self.register_with_pgtle(dbname)?;
                "CREATE EXTENSION dedup;".to_string()
            }
            Edition::Plain => std::fs::read_to_string(portable_file("dedup.plain.sql"))?,
        })
    }

    /// pg_tle in `dbname`, and dedup registered with it (the portable edition's script).
    fn register_with_pgtle(&self, dbname: &str) -> Result<()> {
        self.psql(dbname, "CREATE EXTENSION IF NOT EXISTS pg_tle")?;
        self.psql_file(dbname, &portable_file("dedup.pgtle.sql"))?;
        Ok(())
    }

    /// Run a file of SQL with psql, stopping at the first error.
    pub fn psql_file(&self, dbname: &str, file: &Path) -> Result<String> {
        let out = run(Command::new(self.bindir.join("psql"))
            .args([
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
            ])
            .args(["-U", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(dbname)
            .arg("-f")
            .arg(file))
        .with_context(|| format!("psql -f {}", file.display()))?;
        Ok(String::from_utf8(out.stdout)?.trim_end().to_string())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let _ = self.stop("immediate");
        }
        if std::env::var_os("DEDUP_KEEP_CLUSTERS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
