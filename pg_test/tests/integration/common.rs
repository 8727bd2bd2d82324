//! What every integration test gets: the shared cluster, a database of its own, and
//! helpers to connect and to watch sessions wait on one another.
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::Cluster;
pub use dedup_pg_test::wait_until_blocked;
use dedup_pg_test::{connect, sqlstate, Conn};
use std::sync::Arc;

pub struct Ctx {
    pub cluster: Arc<Cluster>,
    pub db: String,
}

impl Ctx {
    pub fn dsn(&self) -> String {
        self.cluster.dsn(&self.db)
    }
    pub async fn connect(&self) -> Result<Conn> {
        connect(&self.dsn()).await
    }
    pub async fn connect_as(&self, user: &str) -> Result<Conn> {
        connect(&format!("{} user={user}", self.dsn())).await
    }
}

/// `SELECT <expr>` returning one boolean.
pub async fn claim(c: &Conn, sql: &str) -> Result<bool> {
    let row = c
        .query_one(sql, &[])
        .await
        .with_context(|| sql.to_string())?;
    Ok(row.get(0))
}

/// The SQLSTATE of `result`'s error, or an error if it succeeded.
pub fn expect_sqlstate<T: std::fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    what: &str,
) -> Result<String> {
    match result {
        Ok(v) => bail!("{what}: expected an error, got {v:?}"),
        Err(e) => Ok(sqlstate(&e)
            .map(str::to_string)
            .unwrap_or_else(|| format!("no SQLSTATE: {e}"))),
    }
}

pub fn ensure_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> Result<()> {
    if got != want {
        bail!("{what}: got {got:?}, want {want:?}");
    }
    Ok(())
}

/// Create a role holding exactly the grants the docs (docs/operations.md, "Security model")
/// tell users to give an API caller (`LOGIN`, nothing else: the claim, lease and result
/// functions are `PUBLIC`), then run `grants` (each `{role}` replaced by its name) as a
/// superuser, and connect as it.
pub async fn unprivileged(ctx: &Ctx, name: &str, grants: &str) -> Result<(String, Conn)> {
    let role = format!("{name}_{}", ctx.db);
    let admin = ctx.connect().await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;{}",
            grants.replace("{role}", &role)
        ))
        .await
        .with_context(|| format!("creating role {role}"))?;
    let conn = ctx.connect_as(&role).await?;
    Ok((role, conn))
}

/// Writers, one connection each to `dsn`, that claim new jobs (`w{writer}-{k}`) and insert
/// each one's effect into `effects`, one transaction per job, until their connection fails
/// under them (a server stopped, a session terminated).
pub struct Writers(Vec<tokio::task::JoinHandle<(Vec<String>, Vec<String>)>>);

impl Writers {
    pub fn start(dsn: &str, n: usize) -> Writers {
        Writers(
            (0..n)
                .map(|w| {
                    let dsn = dsn.to_string();
                    tokio::spawn(async move {
                        let (mut tried, mut acked) = (Vec::new(), Vec::new());
                        let Ok(c) = connect(&dsn).await else {
                            return (tried, acked);
                        };
                        for k in 0.. {
                            let job = format!("w{w}-{k}");
                            tried.push(job.clone());
                            let r = async {
                                c.batch_execute("BEGIN").await?;
                                let fresh: bool = c
                                    .query_one("SELECT dedup.try_claim($1)", &[&job])
                                    .await?
                                    .get(0);
                                if fresh {
                                    c.execute("INSERT INTO effects VALUES ($1)", &[&job])
                                        .await?;
                                }
                                c.batch_execute("COMMIT").await
                            }
                            .await;
                            match r {
                                Ok(()) => acked.push(job),
                                Err(_) => break,
                            }
                        }
                        (tried, acked)
                    })
                })
                .collect(),
        )
    }

    /// Once their connections are gone: every job the writers tried, and those whose
    /// COMMIT returned.
    pub async fn finish(self) -> Result<(Vec<String>, Vec<String>)> {
        let (mut tried, mut acked) = (Vec::new(), Vec::new());
        for w in self.0 {
            let (t, a) = w.await?;
            tried.extend(t);
            acked.extend(a);
        }
        Ok((tried, acked))
    }
}

/// Deliver every job of `jobs` again on `c`, each claim and its effect in one
/// transaction; returns how many ran (were claimed) this time.
pub async fn redeliver(c: &Conn, jobs: &[String]) -> Result<usize> {
    let mut ran = 0;
    for job in jobs {
        c.batch_execute("BEGIN").await?;
        let fresh: bool = c
            .query_one("SELECT dedup.try_claim($1)", &[job])
            .await?
            .get(0);
        if fresh {
            c.execute("INSERT INTO effects VALUES ($1)", &[job]).await?;
            ran += 1;
        }
        c.batch_execute("COMMIT").await?;
    }
    Ok(ran)
}

/// `kill -9` of a server process (a backend, the launcher) whose id the server reported:
/// the postmaster then restarts every process, as after any crash.
pub fn kill9(pid: i32) -> Result<()> {
    // SAFETY: kill(2) takes any process id and only sends the signal.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("kill -9 {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Run one of the project's Python scripts; its output is the error when it fails.
pub fn python(script: &std::path::Path, args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "{}: {}{}",
            script.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
