//! A throwaway `redis-server` (Debian's package): loopback only, a free port, no
//! persistence, a temporary directory of its own. Killed and deleted on drop, and on Ctrl-C
//! through [`crate::children`].
use crate::children;
use crate::cluster::free_port;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
}

impl RedisServer {
    /// Start `redis-server` (`DEDUP_REDIS_SERVER` overrides the program) and wait until it
    /// answers PING.
    pub async fn start() -> Result<RedisServer> {
        let program =
            std::env::var("DEDUP_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string());
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("dedup-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = Command::new(&program)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
                "--logfile",
                "redis.log",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "starting {program}: is Debian's redis-server installed? \
                     (scripts/setup.sh installs it)"
                )
            })?;
        children::register(child.id(), "redis-server", Some(dir.clone()));
        let mut server = RedisServer { port, dir, child };
        server.wait_until_up().await?;
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    async fn wait_until_up(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = redis::Client::open(self.url())?;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server exited with {status} at start; its log:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
                if pong.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on port {} did not answer within 20 s; its log:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        children::unregister(self.child.id());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
