//! A throwaway Citus cluster on loopback ports: a coordinator and two workers, each a
//! [`Cluster`] with `shared_preload_libraries = 'citus,dedup'`, Citus and dedup created in
//! the database `citus` on every node (dedup through Citus's propagation of `CREATE
//! EXTENSION`), the workers added to the coordinator. The server tree is the one of
//! `DEDUP_PG_CONFIG`, into which `scripts/citus.sh` installed Citus.
use crate::cluster::{Cluster, Options};
use anyhow::{Context, Result};

/// The database every node uses (Citus runs a cluster per database name).
pub const DB: &str = "citus";

pub struct CitusCluster {
    pub coordinator: Cluster,
    pub workers: Vec<Cluster>,
}

fn options(name: &str, extra: &[(String, String)]) -> Options {
    let mut o = Options::named(name)
        .set("shared_preload_libraries", "citus,dedup")
        // Two-phase commit of multi-node transactions, and shard moves by logical
        // replication.
        .set("max_prepared_transactions", "200")
        .set("wal_level", "logical")
        .set("max_connections", "200")
        // Recover prepared transactions left by a node's crash soon (default 60 s).
        .set("citus.recover_2pc_interval", "1s")
        // The prune worker visits each database every 2 s here.
        .set("dedup.prune_interval", "2");
    for (k, v) in extra {
        o = o.set(k, v);
    }
    o
}

impl CitusCluster {
    pub fn start() -> Result<CitusCluster> {
        Self::start_with(Vec::new())
    }

    /// With `conf` added to every node's settings (the benchmark's).
    pub fn start_with(conf: Vec<(String, String)>) -> Result<CitusCluster> {
        let pg_config = crate::cluster::pg_config();
        let out = std::process::Command::new(&pg_config)
            .arg("--pkglibdir")
            .output()?;
        let libdir = String::from_utf8(out.stdout)?.trim().to_string();
        if !std::path::Path::new(&libdir).join("citus.so").exists() {
            anyhow::bail!(
                "Citus is not installed in {libdir} (the tree of {}): run scripts/citus.sh, \
                 or set DEDUP_PG_CONFIG to the tree it built Citus into",
                pg_config.display()
            );
        }
        let coordinator = Cluster::start(options("citus-coordinator", &conf))?;
        let workers = vec![
            Cluster::start(options("citus-worker1", &conf))?,
            Cluster::start(options("citus-worker2", &conf))?,
        ];
        let c = CitusCluster {
            coordinator,
            workers,
        };
        for node in c.nodes() {
            node.psql("postgres", &format!("CREATE DATABASE {DB}"))?;
            node.psql(DB, "CREATE EXTENSION citus")
                .with_context(|| format!("CREATE EXTENSION citus on port {}", node.port))?;
        }
        c.coordinator.psql(
            DB,
            &format!(
                "SELECT pg_catalog.citus_set_coordinator_host('127.0.0.1', {})",
                c.coordinator.port
            ),
        )?;
        for w in &c.workers {
            c.coordinator.psql(
                DB,
                &format!("SELECT pg_catalog.citus_add_node('127.0.0.1', {})", w.port),
            )?;
        }
        // Propagated to the workers by Citus.
        c.coordinator.psql(DB, "CREATE EXTENSION dedup")?;
        Ok(c)
    }

    /// The coordinator, then the workers.
    pub fn nodes(&self) -> impl Iterator<Item = &Cluster> {
        std::iter::once(&self.coordinator).chain(self.workers.iter())
    }

    /// Connection strings of every node, coordinator first.
    pub fn dsns(&self) -> Vec<String> {
        self.nodes().map(|n| n.dsn(DB)).collect()
    }
}
