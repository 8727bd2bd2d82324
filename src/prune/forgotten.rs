//! `forget`'s pruning: the audit rows of `dedup.forgotten` past their scope's retention.
use super::horizons::{timestamp, Cutoffs};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Delete the audit rows of dedup.forget older than their scope's retention (0.6.0 on; a
/// database whose extension is older has no such table). Few rows: one statement, the
/// retentions passed in (on Citus dedup.scope_retention is a reference table, which a
/// statement on the node's own dedup.forgotten cannot join).
pub(super) fn prune_forgotten(scope: Option<&str>) -> i64 {
    // SAFETY: syscache lookups inside a transaction, under the caller's guard; InvalidOid
    // for a missing name.
    let relid = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return 0;
        }
        pg_sys::get_relname_relid(c"forgotten".as_ptr(), nsp)
    };
    if relid == pg_sys::InvalidOid {
        return 0;
    }
    // Only the extension's own table (no other role can create one in the schema dedup,
    // whose CREATE privilege is the owner's; checked anyway: the worker is a superuser).
    let member = Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_depend AS d \
                         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass \
                           AND d.objid OPERATOR(pg_catalog.=) $1 \
                           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass \
                           AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog.\"char\")",
        &[DatumWithOid::from(relid)],
    )
    .ok()
    .flatten()
    .unwrap_or(false);
    if !member {
        return 0;
    }
    let cutoffs = Cutoffs::load(false);
    let (scopes, limits, _) = cutoffs.arrays();
    Spi::connect_mut(|c| {
        c.update(
            "DELETE FROM dedup.forgotten AS f \
              WHERE f.forgotten_at OPERATOR(pg_catalog.<) COALESCE( \
                      (SELECT c.cutoff \
                         FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), \
                                         pg_catalog.unnest($3::pg_catalog.timestamptz[])) AS c(scope, cutoff) \
                        WHERE c.scope OPERATOR(pg_catalog.=) f.scope), \
                      $1::pg_catalog.timestamptz) \
                AND ($4::pg_catalog.text IS NULL OR f.scope OPERATOR(pg_catalog.=) $4)",
            None,
            &[
                DatumWithOid::from(timestamp(cutoffs.global.at)),
                DatumWithOid::from(scopes),
                DatumWithOid::from(limits),
                DatumWithOid::from(scope),
            ],
        )
        .map(|t| t.len() as i64)
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: pruning dedup.forgotten failed: {e}"))
}
