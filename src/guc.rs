//! Settings (GUCs). Every name starts with `dedup.`, and the prefix is reserved, so a
//! misspelt `SET dedup.warn_outside_transation` is an error instead of a silent no-op.
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `dedup.warn_outside_transaction`: warn when `try_claim` runs outside a transaction block.
pub static WARN_OUTSIDE_TRANSACTION: GucSetting<bool> = GucSetting::<bool>::new(true);

pub fn init() {
    GucRegistry::define_bool_guc(
        c"dedup.warn_outside_transaction",
        c"Warn when dedup.try_claim is called outside a transaction block.",
        c"Outside BEGIN ... COMMIT the claim commits by itself, before the effect runs: a crash \
          between the two loses the job (at-most-once). Turn this off only where the claim and \
          the effect are one statement.",
        &WARN_OUTSIDE_TRANSACTION,
        GucContext::Userset,
        GucFlags::default(),
    );
    reserve_prefix();
}

#[cfg(any(feature = "pg13", feature = "pg14"))]
fn reserve_prefix() {
    // MarkGUCPrefixReserved arrived in PostgreSQL 15.
    unsafe { pgrx::pg_sys::EmitWarningsOnPlaceholders(c"dedup".as_ptr()) }
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
fn reserve_prefix() {
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"dedup".as_ptr()) }
}
