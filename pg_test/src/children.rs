//! Child processes that must not outlive us (a throwaway `redis-server`, the experiment's
//! consumers): their process ids, so that the signal handler of
//! [`crate::cluster::stop_all_on_signal`] can kill them on Ctrl-C or SIGTERM, where no
//! destructor runs. Owners register a child when they spawn it and unregister it once they
//! have reaped it themselves.
use std::path::PathBuf;
use std::sync::Mutex;

/// Live children: process id, what it is (for the message), and a directory to delete
/// once it is dead.
static LIVE: Mutex<Vec<(u32, String, Option<PathBuf>)>> = Mutex::new(Vec::new());

/// Remember a child to kill on a signal, and optionally a directory to remove afterwards.
pub fn register(pid: u32, what: &str, dir: Option<PathBuf>) {
    if let Ok(mut live) = LIVE.lock() {
        live.push((pid, what.to_string(), dir));
    }
}

/// Forget a child its owner has reaped (its pid may be reused from now on).
pub fn unregister(pid: u32) {
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|(p, _, _)| *p != pid);
    }
}

/// SIGKILL every registered child, reap it, and remove its directory. For signal handlers:
/// the owners' destructors will not run.
pub fn kill_all() {
    let live = match LIVE.lock() {
        Ok(mut l) => std::mem::take(&mut *l),
        Err(_) => return,
    };
    for (pid, what, dir) in live {
        eprintln!("interrupted: killing {what} (pid {pid})");
        // SAFETY: kill(2) and waitpid(2) on a child we spawned and have not reaped.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
