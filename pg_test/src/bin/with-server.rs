//! `with-server [--conf key=value]... [--db NAME] -- COMMAND [ARGS]...`
//!
//! Starts a throwaway PostgreSQL cluster (as the `postgres` user when run as root) on a
//! free loopback port, optionally creates database NAME with `CREATE EXTENSION dedup`,
//! runs COMMAND with PGHOST, PGPORT, PGUSER (and PGDATABASE) set, then stops the server
//! and deletes its directory: also when COMMAND fails and on Ctrl-C.
use anyhow::{bail, Result};
use dedup_pg_test::cluster::{stop_all_on_signal, Cluster, Options};
use std::process::Command;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut opts = Options::named("server");
    let mut db = None;
    let mut citus = false;
    let mut cmd = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--conf" => {
                let kv = args.next().unwrap_or_default();
                let Some((k, v)) = kv.split_once('=') else { bail!("--conf wants key=value") };
                opts = opts.set(k, v);
            }
            "--db" => db = args.next(),
            "--citus" => citus = true,
            "--" => {
                cmd.extend(args.by_ref());
            }
            other => bail!("unknown argument {other}; usage: with-server [--conf k=v]... [--db NAME] -- COMMAND..."),
        }
    }
    if cmd.is_empty() {
        bail!("no command; usage: with-server [--conf k=v]... [--db NAME] -- COMMAND...");
    }
    stop_all_on_signal();
    if citus {
        return with_citus(opts, &cmd);
    }
    let mut cluster = Cluster::start(opts)?;
    eprintln!(
        "[with-server] PostgreSQL on 127.0.0.1:{} (data in {})",
        cluster.port,
        cluster.data.display()
    );
    if let Some(db) = &db {
        cluster.create_db_with_extension(db)?;
    }
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..])
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port.to_string())
        .env("PGUSER", "postgres")
        .env("DEDUP_PG_DATA", &cluster.data)
        .env("DEDUP_PG_BINDIR", &cluster.bindir);
    if let Some(db) = &db {
        c.env("PGDATABASE", db);
    }
    let status = c.status();
    cluster.stop("fast")?;
    drop(cluster);
    let status = status?;
    std::process::exit(status.code().unwrap_or(1));
}

fn with_citus(opts: Options, cmd: &[String]) -> Result<()> {
    let cc = dedup_pg_test::citus::CitusCluster::start_with(opts.conf.clone())?;
    cc.coordinator
        .psql(dedup_pg_test::citus::DB, "SELECT dedup.distribute()")?;
    let ports: Vec<String> = cc.nodes().map(|n| n.port.to_string()).collect();
    eprintln!(
        "[with-server] Citus cluster on 127.0.0.1 ports {}",
        ports.join(" ")
    );
    let status = Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cc.coordinator.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", dedup_pg_test::citus::DB)
        .env("DEDUP_CITUS_PORTS", ports.join(" "))
        .env("DEDUP_PG_BINDIR", &cc.coordinator.bindir)
        .status();
    drop(cc);
    std::process::exit(status?.code().unwrap_or(1));
}
