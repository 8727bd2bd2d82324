//! Retention: deleting claims older than their scope's retention, in short batches.
//!
//! The claim table has no index on time: one would cost every claim about 7% more instructions
//! (docs/retention.md, "How a pass works"). A pass sweeps the table instead. Each batch reads a
//! range of [`BLOCKS_PER_BATCH`] blocks through a bulk-read buffer ring (as VACUUM and large
//! sequential scans do, so a pass does not push the working set out of shared_buffers),
//! collects the expired claims it sees, at most `dedup.prune_batch_size`, and deletes them by
//! TID with a DELETE that checks their age again and skips rows other transactions have locked.
//! The background worker commits every batch; `dedup.prune()` runs its batches inside the
//! caller's transaction. A pass holds the prune lock, which no SQL can take.
//!
//! Concurrent claims are never blocked by a prune except for the key being deleted: a
//! claim of a key whose old row a batch is deleting waits for that batch to commit, then
//! inserts its new row (one winner, by the primary key, as always).
mod forgotten;
pub(crate) mod horizons;
mod pass;
mod settings;
mod status;

use crate::{error, guc};
use pass::lock_for_transaction;
pub use pass::{in_transaction, run_pass, try_lock_for_session, Pass, Transactions};
use pgrx::pg_sys;
use pgrx::prelude::*;
pub use status::{backing_off, load_resume, record_failure, record_pass, save_resume};

/// Blocks read per batch: 8 MB with 8 kB pages.
pub const BLOCKS_PER_BATCH: u32 = 1024;

const FUNC: &str = "dedup.prune";

fn check_writable() {
    // SAFETY: RecoveryInProgress goes through pgrx's guarded binding (it reads the shared
    // recovery state, no ERROR); XactReadOnly is a plain read of a backend-global bool. The
    // caller is the #[pg_extern] dedup.prune(), whose wrapper turns error::*'s panics into
    // ERRORs.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            error::on_standby(FUNC);
        }
        if pg_sys::XactReadOnly {
            error::read_only(FUNC);
        }
    }
}

/// `dedup.prune(scope, max_rows)`: delete expired claims now, in the caller's transaction.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn prune(scope: default!(Option<&str>, "NULL"), max_rows: default!(Option<i64>, "NULL")) -> i64 {
    if let Some(n) = max_rows.filter(|n| *n <= 0) {
        error::not_positive(FUNC, "max_rows", &n.to_string());
    }
    check_writable();
    let retention = guc::RETENTION.get();
    let (shortest, what) = guc::shortest_sensible_retention();
    if retention < shortest {
        error::warn_short_retention("dedup.retention", i64::from(retention), shortest, what);
    }
    // Waits for a running prune of this database (the worker's, or another session's).
    lock_for_transaction();
    let pass = run_pass(scope, max_rows, &Transactions::Caller, None)
        .expect("errors are raised, not returned");
    // SAFETY: GetSessionUserId reads a backend-global (an Assert only);
    // GetUserNameFromId(noerr = false) raises an ERROR for a role that no longer exists,
    // through this #[pg_extern]'s guard, and otherwise returns a NUL-terminated name
    // pstrdup'd in CurrentMemoryContext, valid for this call and copied out at once.
    let by = unsafe {
        std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetSessionUserId(), false))
            .to_string_lossy()
            .into_owned()
    };
    record_pass(scope, &pass, &by);
    pass.deleted
}

/// `dedup._caller()`: the role that called the SECURITY DEFINER function we are in (the
/// session's current role, or the role of SET ROLE), for dedup.forget's audit row.
#[pg_extern(name = "_caller", stable, parallel_safe)]
pub(crate) fn caller() -> String {
    // SAFETY: GetOuterUserId reads a global; GetUserNameFromId(noerr = false) raises an
    // ERROR for a role that no longer exists, through this #[pg_extern]'s guard, and
    // otherwise returns a NUL-terminated name palloc'd in CurrentMemoryContext, copied out
    // at once.
    unsafe {
        std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetOuterUserId(), false))
            .to_string_lossy()
            .into_owned()
    }
}

extension_sql!(
    r#"
REVOKE ALL ON FUNCTION dedup.prune(pg_catalog.text, pg_catalog.int8) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup.set_retention(pg_catalog.text, pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION dedup._caller() FROM PUBLIC;
COMMENT ON FUNCTION dedup.prune(pg_catalog.text, pg_catalog.int8) IS
'Delete claims older than their retention (all scopes, or one), at most max_rows; returns how many. Runs in the caller''s transaction; waits for a prune already running in this database.';
COMMENT ON FUNCTION dedup.set_retention(pg_catalog.text, pg_catalog.interval) IS
'Give a scope its own retention, overriding dedup.retention; NULL removes it.';
COMMENT ON FUNCTION dedup.retention(pg_catalog.text) IS
'The retention in force for a scope: its own, or dedup.retention.';
"#,
    name = "prune_privileges",
    requires = [prune, set_retention, retention, caller]
);
