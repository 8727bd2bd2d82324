//! The claim path: `dedup.try_claim(job_id, scope)`.
use crate::{error, guc};
use pgrx::prelude::*;
use pgrx::{pg_sys, IntoDatum};

const FUNC: &str = "dedup.try_claim";

/// Claim `job_id` in `scope` for the current transaction.
///
/// `true`: this transaction now holds the claim (permanent at COMMIT, gone at ROLLBACK).
/// `false`: a committed claim exists. A claim held by a concurrent transaction makes the call
/// wait for that transaction's end.
#[pg_extern(name = "try_claim", volatile, parallel_unsafe, security_definer)]
fn try_claim_text(job_id: Option<&str>, scope: default!(Option<&str>, "'default'")) -> bool {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    claim(job_id, scope)
}

/// The same job as its decimal text form: `try_claim(42)` and `try_claim('42')` are one job.
#[pg_extern(name = "try_claim", volatile, parallel_unsafe, security_definer)]
fn try_claim_bigint(job_id: Option<i64>, scope: default!(Option<&str>, "'default'")) -> bool {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    claim(&job_id.to_string(), scope)
}

/// The same job as the uuid's canonical text form (lowercase, hyphenated).
#[pg_extern(name = "try_claim", volatile, parallel_unsafe, security_definer)]
fn try_claim_uuid(job_id: Option<pgrx::Uuid>, scope: default!(Option<&str>, "'default'")) -> bool {
    let job_id = job_id.unwrap_or_else(|| error::null_argument(FUNC, "job_id"));
    claim(&job_id.to_string(), scope)
}

fn check_key<'a>(scope: Option<&'a str>, job_id: &str) -> &'a str {
    let scope = scope.unwrap_or_else(|| error::null_argument(FUNC, "scope"));
    if job_id.is_empty() {
        error::empty_argument(FUNC, "job_id");
    }
    if job_id.len() > error::MAX_JOB_ID_BYTES {
        error::too_long(FUNC, "job_id", job_id.len(), error::MAX_JOB_ID_BYTES);
    }
    if scope.is_empty() {
        error::empty_argument(FUNC, "scope");
    }
    if scope.len() > error::MAX_SCOPE_BYTES {
        error::too_long(FUNC, "scope", scope.len(), error::MAX_SCOPE_BYTES);
    }
    scope
}

fn check_transaction() {
    unsafe {
        if pg_sys::RecoveryInProgress() {
            error::on_standby(FUNC);
        }
        if pg_sys::XactReadOnly {
            error::read_only(FUNC);
        }
        if pg_sys::IsInParallelMode() {
            error::parallel_mode(FUNC);
        }
        if !pg_sys::IsTransactionBlock() && guc::WARN_OUTSIDE_TRANSACTION.get() {
            error::warn_outside_transaction(FUNC);
        }
    }
}

fn claim(job_id: &str, scope: Option<&str>) -> bool {
    let scope = check_key(scope, job_id);
    check_transaction();
    unsafe { spi_insert(scope, job_id) }
}

// Prototype: INSERT ... ON CONFLICT DO NOTHING through SPI with a plan kept for the
// backend's lifetime.
static mut PLAN: pg_sys::SPIPlanPtr = std::ptr::null_mut();

unsafe fn spi_insert(scope: &str, job_id: &str) -> bool {
    if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
        pgrx::error!("SPI_connect failed");
    }
    let plan = std::ptr::addr_of_mut!(PLAN);
    if (*plan).is_null() {
        let mut argtypes = [pg_sys::TEXTOID, pg_sys::TEXTOID];
        let p = pg_sys::SPI_prepare(
            c"INSERT INTO dedup.processed (scope, job_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
                .as_ptr(),
            2,
            argtypes.as_mut_ptr(),
        );
        if p.is_null() || pg_sys::SPI_keepplan(p) != 0 {
            pgrx::error!("SPI_prepare failed");
        }
        *plan = p;
    }
    let mut values = [
        scope.into_datum().unwrap(),
        job_id.into_datum().unwrap(),
    ];
    let rc = pg_sys::SPI_execute_plan(*plan, values.as_mut_ptr(), std::ptr::null(), false, 0);
    if rc != pg_sys::SPI_OK_INSERT as i32 {
        pgrx::error!("SPI_execute_plan returned {rc}");
    }
    let inserted = pg_sys::SPI_processed == 1;
    pg_sys::SPI_finish();
    inserted
}
