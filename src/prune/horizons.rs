//! Horizons: the cutoffs and horizons in force for a batch (which claims are expired, and
//! how old their xmin must be), whether the database has horizons, and a pass's mark.
use crate::{error, guc};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashMap;

/// The time a retention ago, measured back from now in UTC, as a `timestamptz` expression
/// whose `{}` is the retention's: a day is 24 hours whatever the session's TimeZone (in a
/// zone with a daylight-saving jump of 23 hours, '1 day' would last one hour, and the
/// claims of a one-day scope be pruned after an hour), and '1 month' counts the month it
/// spans now. The pruner's cutoffs and the rotation's retentions in seconds
/// (generations/rotate.rs) both use it.
pub(crate) const UTC_AGO: &str = "pg_catalog.timezone('UTC'::pg_catalog.text, \
      pg_catalog.timezone('UTC'::pg_catalog.text, pg_catalog.now()) OPERATOR(pg_catalog.-) ({}))";

/// Expiry cutoffs (microseconds since 2000-01-01, as `timestamptz`) for one batch, and the
/// horizons a claim's xmin must be below (`dedup._horizon`), so that a claim is kept its
/// retention from its commit (retention::a_claim_is_kept_its_retention_from_commit).
pub(super) struct Cutoffs {
    /// The batch transaction's start (`now()`).
    pub(super) now: i64,
    pub(super) global: Cutoff,
    scopes: HashMap<String, Cutoff>,
}

/// One retention's cutoff and horizon.
#[derive(Clone)]
pub(super) struct Cutoff {
    /// Claims whose processed_at is before this are expired.
    pub(super) at: i64,
    /// The xid (as text) an expired claim's xmin must be older than: None when no pass is
    /// old enough (processed_at alone decides), Some("0") when nothing may be pruned.
    pub(super) horizon: Option<String>,
}

impl Cutoff {
    /// Nothing of this retention may be pruned now (its horizon is too far back).
    pub(super) fn blocked(&self) -> bool {
        self.horizon.as_deref() == Some("0")
    }
}

impl Cutoffs {
    /// Read the retentions in force now (inside a transaction). `horizons`: the extension
    /// has dedup._horizons (0.6.0 on; older versions judge by processed_at alone).
    pub(super) fn load(horizons: bool) -> Cutoffs {
        // SAFETY: GetCurrentTransactionStartTimestamp only returns the backend-global
        // xactStartTimestamp (no ERROR), through pgrx's guarded binding; we are inside a
        // transaction (dedup.prune()'s, or in_transaction's), on the main thread.
        let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
        let global_at = now - i64::from(guc::RETENTION.get()) * 1_000_000;
        let horizon = if horizons {
            "dedup._horizon(c.cutoff)::pg_catalog.text"
        } else {
            "NULL::pg_catalog.text"
        };
        // In UTC (UTC_AGO). The row with scope NULL is dedup.retention's.
        let query = format!(
            "SELECT c.scope, c.cutoff, {horizon} \
               FROM (SELECT r.scope, {ago} AS cutoff \
                       FROM dedup.scope_retention AS r \
                     UNION ALL SELECT NULL, $1::pg_catalog.timestamptz) AS c",
            ago = UTC_AGO.replace("{}", "r.retention"),
        );
        let (global, scopes) = Spi::connect(|c| {
            let rows = c.select(&query, None, &[DatumWithOid::from(timestamp(global_at))])?;
            let mut global = None;
            let mut scopes = HashMap::new();
            for row in rows {
                let scope: Option<String> = row.get(1)?;
                let at: TimestampWithTimeZone = row.get(2)?.expect("retention is NOT NULL");
                let cutoff = Cutoff {
                    at: pg_sys::TimestampTz::from(at),
                    horizon: row.get(3)?,
                };
                match scope {
                    Some(scope) => {
                        scopes.insert(scope, cutoff);
                    }
                    None => global = Some(cutoff),
                }
            }
            Ok::<_, pgrx::spi::Error>((global.expect("the row of dedup.retention"), scopes))
        })
        .unwrap_or_else(|e| pgrx::error!("dedup: reading dedup.scope_retention failed: {e}"));
        Cutoffs {
            now,
            global,
            scopes,
        }
    }

    /// The scopes' cutoffs and horizons as parallel arrays, for a statement's parameters.
    pub(super) fn arrays(&self) -> (Vec<String>, Vec<TimestampWithTimeZone>, Vec<Option<String>>) {
        let mut scopes = Vec::new();
        let mut ats = Vec::new();
        let mut horizons = Vec::new();
        for (s, c) in &self.scopes {
            scopes.push(s.clone());
            ats.push(timestamp(c.at));
            horizons.push(c.horizon.clone());
        }
        (scopes, ats, horizons)
    }

    /// The longest retention in force (microseconds): `dedup.retention`'s or a scope's own.
    pub(super) fn longest_retention(&self) -> i64 {
        let earliest = self
            .scopes
            .values()
            .map(|c| c.at)
            .fold(self.global.at, i64::min);
        self.now - earliest
    }

    pub(super) fn of(&self, scope: &str) -> &Cutoff {
        self.scopes.get(scope).unwrap_or(&self.global)
    }
}

/// A `timestamptz` of microseconds since 2000-01-01.
pub(super) fn timestamp(micros: i64) -> TimestampWithTimeZone {
    // SAFETY: any i64 is a valid timestamptz datum (infinity included).
    unsafe {
        TimestampWithTimeZone::from_datum(pg_sys::Datum::from(micros), false).expect("not null")
    }
}

/// Does this database's dedup have `dedup._horizons` (0.6.0 on), as a member of the
/// extension? (Inside a transaction.)
pub(super) fn has_horizons() -> bool {
    // SAFETY: syscache lookups inside a transaction, under the caller's guard (the
    // #[pg_extern] dedup.prune(), or in_transaction's PgTry); InvalidOid for a missing name
    // or an object of no extension; the names are 'static NUL-terminated C strings.
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return false;
        }
        let relid = pg_sys::get_relname_relid(c"_horizons".as_ptr(), nsp);
        relid != pg_sys::InvalidOid
            && pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, relid)
                == pg_sys::get_extension_oid(c"dedup".as_ptr(), true)
    }
}

/// At a pass's start: record this moment's horizon (dedup._mark_horizon), and warn of a
/// retention whose horizon is too far back to prune anything. Returns whether the
/// database has horizons (a database still on an older version of dedup has none).
pub(super) fn mark_horizon(scope: Option<&str>) -> bool {
    if !has_horizons() {
        return false;
    }
    Spi::run_with_args(
        "SELECT dedup._mark_horizon($1::pg_catalog.float8)",
        &[DatumWithOid::from(f64::from(guc::RETENTION.get()))],
    )
    .unwrap_or_else(|e| pgrx::error!("dedup: recording the prune horizon failed: {e}"));
    let cutoffs = Cutoffs::load(true);
    if cutoffs.global.blocked() {
        error::warn_horizon_too_old("dedup.retention");
    }
    for (s, c) in &cutoffs.scopes {
        if c.blocked() && scope.is_none_or(|only| only == s) {
            error::warn_horizon_too_old(&format!("the retention of scope '{s}'"));
        }
    }
    true
}
