//! Rotation (docs/design/generations.md, "Rotation", "Dropping never stalls a claim"): the
//! steps over `dedup.generations`, `dedup.use_generations()`, `dedup.rotate_generations()`
//! and the worker's `dedup._rotate(step)`.
//! Each step runs in its caller's transaction and records where it is in the generation's
//! row, so a step a crash or an ERROR cut short is done again at the next call:
//! - publish, per series (one per retention in force, the row's `retention`):
//!   `dedup.processed_<n+1>` is made and becomes the series' `current`, the old one
//!   `sealing`; or the first of a new series; or a current one whose retention is no longer
//!   in force becomes `sealing` with no successor;
//! - seal: the transactions holding a lock on the sealing table (GetLockConflicts, as CREATE
//!   INDEX CONCURRENTLY lists them) are stored once in `waits` and then polled, never waited
//!   for; once all ended it is `sealed`, and sealed_at (then) starts its retention;
//! - retire: a sealed table past sealed_at plus the retention of each scope of its claims
//!   (read once into `scopes` where retentions differ), in which no lease still runs, is
//!   `retired`;
//! - drop: the same stored wait (in every lock mode), a lock taken only if free at once,
//!   then DROP TABLE (n >= 1, row deleted) or TRUNCATE dedup.processed (n = 0, row kept).
//!
//! Every change to `dedup.generations` takes `epoch::publishing()` first, so claimers reload.
use super::epoch;
use crate::{citus, claim, error, guc, prune};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{CStr, CString};

const CURRENT: &str = "current";
const SEALING: &str = "sealing";
const SEALED: &str = "sealed";
const RETIRED: &str = "retired";
/// `waits` of generation 0 once `dedup.processed` is truncated: retired for good.
const TRUNCATED: &str = "truncated";

/// `dedup.use_generations()`: make `dedup.processed` generation 0 and publish generation 1
/// in the caller's transaction.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
pub(crate) fn use_generations() -> String {
    const F: &str = "dedup.use_generations";
    // SAFETY: superuser() looks the current user up in the syscache (a catalog ERROR is
    // raised through this #[pg_extern]'s guard).
    if !unsafe { pg_sys::superuser() } {
        error::generations_superuser(F);
    }
    if !epoch::available() {
        error::generations_need_preload(F);
    }
    if citus::in_database() {
        error::generations_on_citus(F);
    }
    // SAFETY: in this function's transaction, under its guard.
    let processed = unsafe { processed_relid(F) };
    // Before reading the catalog: a second use_generations() waits here for the first.
    epoch::publishing();
    let rows = Spi::connect_mut(|c| {
        // update(): a snapshot taken now, after the lock (a read-only statement would use
        // the one taken before it).
        c.update(
            "SELECT pg_catalog.count(*) FROM dedup.generations",
            None,
            &[],
        )?
        .first()
        .get_one::<i64>()
    })
    .unwrap_or_else(|e| pgrx::error!("{F}: reading dedup.generations failed: {e}"))
    .unwrap_or(0);
    if rows > 0 {
        error::generations_already(F);
    }
    // The publishing lock waited for every transaction that called a lease function (they
    // hold it in share mode: generations::lease_tables), so no lease is on its way into
    // dedup.processed by its INSERT ... ON CONFLICT; the leases there (running, or expired
    // and not taken over) are found in generation 0 by the lease functions from the commit
    // on, and moved out of it when taken over, extended or completed.
    exec(
        "INSERT INTO dedup.generations (n, relname, relid, state, opened_at) \
         VALUES (0, 'processed', $1::pg_catalog.regclass, 'current', pg_catalog.now())",
        &[DatumWithOid::from(processed)],
        "recording dedup.processed as generation 0",
    );
    // Again now that the INSERT holds dedup.generations in ROW EXCLUSIVE mode: a
    // dedup.distribute() that checked for generations holds it in SHARE mode to its end,
    // so it has ended by now, and the wait for the lock read the catalog's invalidations,
    // so a citus extension created since the check above is seen. Claims routed by Citus
    // would never look in a generation (citus::in_database).
    if citus::in_database() {
        error::generations_on_citus(F);
    }
    let retention = Retention::now();
    let rows = load(true);
    let processed = rows.iter().find(|g| g.n == 0);
    let mut published = vec![publish_next(&rows, processed, &retention.default, &[None])];
    // Each scope's own retention has a series of its own from the start.
    for s in retention
        .series
        .iter()
        .filter(|s| s.span != retention.default.span)
    {
        published.push(publish_next(&load(true), None, s, &[]));
    }
    // And its scopes go there at once: every claim so far is in dedup.processed, which is
    // being sealed, so no current generation holds a claim of any scope.
    let rows = load(true);
    let routes = retention
        .routes(&rows)
        .unwrap_or_else(|| pgrx::error!("{F}: a retention in force has no generation"));
    write_routes(&rows, &routes, None);
    format!(
        "dedup.processed is generation 0 and {published}: claims go there from this \
         transaction's commit on. dedup.processed is sealed once the transactions that use it \
         now have ended, and truncated {longest:.0} s (the longest retention) after that; a \
         new generation of each retention in force is published every quarter of it \
         ({width:.0} s for dedup.retention) by the background worker, or by \
         dedup.rotate_generations()",
        published = published.join(", "),
        longest = retention.longest,
        width = retention.default.width(),
    )
}

/// `dedup.rotate_generations(publish)`: the rotation steps that are due, in the caller's
/// transaction; with `publish`, a new generation now (no retirement or drop).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
pub(crate) fn rotate_generations(publish: default!(bool, false)) -> String {
    const F: &str = "dedup.rotate_generations";
    // SAFETY: as in use_generations.
    if !unsafe { pg_sys::superuser() } {
        error::generations_superuser(F);
    }
    if !in_use() {
        error::generations_not_in_use(F);
    }
    if !epoch::available() {
        error::generations_need_preload(F);
    }
    step(publish)
}

/// The rotation steps, at most one of each kind, in the caller's transaction, in the order
/// seal, drop, retire, publish; what they did, or "nothing due". With `force_publish`: the
/// seal (a generation being sealed must be sealed before the next is published), then a
/// publication whether or not it is due.
pub(crate) fn step(force_publish: bool) -> String {
    // SAFETY: RecoveryInProgress reads shared state, no ERROR.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return "nothing: a standby rotates nothing, its primary does".to_string();
    }
    if !in_use() {
        return "nothing: this database does not use generations".to_string();
    }
    let retention = std::cell::OnceCell::new();
    let kinds: &[Kind] = if force_publish {
        &[Kind::Seal, Kind::Publish]
    } else {
        &Kind::ALL
    };
    let mut done: Vec<String> = kinds
        .iter()
        .filter_map(|kind| run(*kind, force_publish, &retention))
        .collect();
    done.extend(summarise());
    if done.is_empty() {
        "nothing due".to_string()
    } else {
        done.join("; ")
    }
}

/// The worker's rotation of the database it is connected to. Call it outside any
/// transaction, after the worker pinned its settings and checked the extension's schema
/// (`ready_to_prune`), before or after the prune pass. Each step runs in a transaction of
/// its own (`prune::in_transaction`), so a publication commits before the seal wait that
/// follows lists the old generation's lockers; what a step did is logged, an ERROR is
/// logged as a WARNING and the next step goes on (on Citus every step fails so). Each step
/// runs in `dedup._rotate`, as the extension's owner: a `dedup.prune_role` that is not a
/// superuser needs `EXECUTE` on it, otherwise one WARNING per pass, and nothing rotates.
pub(crate) fn worker_pass(dbname: &str) {
    let ready = prune::in_transaction(|| {
        // Whether the database uses generations is read as a claim reads it, without SQL
        // (generations/mod.rs): a role that is not a superuser may not read
        // dedup.generations (revoked from PUBLIC).
        // SAFETY: in the transaction, under in_transaction's PgTry.
        if !unsafe { super::in_use("dedup worker") } {
            return Ok(false);
        }
        if !epoch::available() {
            return Err("dedup is not in shared_preload_libraries".to_string());
        }
        // The steps run in dedup._rotate, as the extension's owner: a dedup.prune_role that
        // is not a superuser needs EXECUTE on it (docs/retention.md, "The background
        // worker"). The name is qualified, and the schema dedup grants CREATE to no role
        // but superusers (ready_to_prune checked it), so it is the extension's function.
        // SAFETY: superuser() reads the current user's catalog row (syscache), no ERROR.
        if !unsafe { pg_sys::superuser() } {
            let may = Spi::get_one::<bool>(
                "SELECT pg_catalog.has_function_privilege('dedup._rotate(pg_catalog.text)', 'EXECUTE')",
            )
            .map_err(|e| e.to_string())?
            .unwrap_or(false);
            if !may {
                return Err("dedup.prune_role is not a superuser and may not execute \
                     dedup._rotate(text): GRANT EXECUTE ON FUNCTION dedup._rotate(text) TO it \
                     in this database (or leave dedup.prune_role empty for the bootstrap \
                     superuser), then reload"
                    .to_string());
            }
        }
        Ok(true)
    });
    match ready {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => {
            // A database that no longer uses generations (the extension dropped): free the
            // summaries it left.
            // (But one still being published, by a use_generations() not committed yet.)
            // SAFETY: in the transaction forget_idle_database needs.
            let _ = prune::in_transaction(|| unsafe { super::summary::forget_idle_database() });
            return;
        }
        Ok(Err(why)) => {
            warning!("dedup: not rotating the generations of database \"{dbname}\": {why}");
            return;
        }
        Err(message) => {
            warning!(
                "dedup: could not prepare to rotate the generations of database \"{dbname}\": {message}"
            );
            return;
        }
    }
    let mut published = false;
    for kind in Kind::ALL {
        let did = in_own_transaction(dbname, kind, false);
        // Without force, the publish step says something only when it published.
        published |= kind == Kind::Publish && did.is_some_and(|m| m.starts_with("published"));
    }
    // List the new generation's predecessor's lockers now that the publication has
    // committed: the wait counts from here, not from the next pass. Claimers in flight at
    // the publication are normal, so a wait is logged at DEBUG1 here. They usually end
    // within milliseconds: the seal is looked at again every SEAL_POLL for up to
    // SEAL_PATIENCE (each look asks only the transactions listed, taking no lock), so that
    // the generation is sealed, and summarised below, in this pass. Until then every new
    // claim probes its index too; left to the next pass, that was a pass interval per
    // publication (a third of the time at the benchmark's 30 s width and 11 s interval).
    if published {
        let until = std::time::Instant::now() + SEAL_PATIENCE;
        // (Not while a DROP DATABASE that may go on waits for the worker to leave.)
        while in_own_transaction(dbname, Kind::Seal, true)
            .is_some_and(|said| said.starts_with("waiting"))
            && std::time::Instant::now() < until
            && !crate::worker::database_is_being_dropped()
            && crate::worker::sleep_until(std::time::Instant::now() + SEAL_POLL)
        {}
    }
    // Building a summary reads a whole generation: not while a DROP DATABASE that may go on
    // waits for the worker to leave (if the drop fails, the next pass builds it).
    if crate::worker::database_is_being_dropped() {
        return;
    }
    match prune::in_transaction(|| call_rotate("summarise")) {
        Ok(said) => {
            for line in said {
                // A summary that does not fit is said at LOG (each pass, until it fits or
                // its generation goes: every claim pays a probe meanwhile; its line ends
                // with what that costs); a race with another writer of the summaries, at
                // DEBUG1 (the next pass builds it).
                if line.starts_with("did not")
                    && !line.ends_with(crate::generations::summary::UNSUMMARISED)
                {
                    debug1!("dedup: database \"{dbname}\": {line}");
                } else {
                    log!("dedup: database \"{dbname}\": {line}");
                }
            }
        }
        Err(message) => warning!(
            "dedup: the summaries of the generations of database \"{dbname}\" failed: {message}"
        ),
    }
}

/// How long a worker pass that published looks again for the old generation's seal, and
/// how often.
const SEAL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
const SEAL_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Set while the worker calls `dedup._rotate` ([`call_rotate`]): backend-local, so no
/// session can set it.
static WORKER_CALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `dedup._rotate(step)`: one step of the background worker's rotation of this database
/// (`seal`, `drop`, `retire` or `publish`, each only if it is due, as
/// `rotate_generations()` takes it), or `summarise` (the summaries of the sealed
/// generations brought up to date); what it did, as lines (none: nothing due). Run as the
/// extension's owner (SECURITY DEFINER, `search_path` pinned), so that a `dedup.prune_role`
/// that is not a superuser rotates with one grant, `EXECUTE` on this function, and no
/// privilege on the generations; not granted to `PUBLIC`. Refused (42501) outside the
/// worker, whose settings are pinned and whose transactions end at once: a session of the
/// granted role could otherwise hold the publishing lock (a `BEGIN` left open) or commit a
/// publication with its own settings (`synchronous_commit`, `default_tablespace`).
#[pg_extern(name = "_rotate", volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn rotate_step(step: Option<&str>) -> Vec<String> {
    const F: &str = "dedup._rotate";
    if !WORKER_CALL.load(std::sync::atomic::Ordering::Relaxed) {
        error::worker_only(F);
    }
    // The owner (this function runs as) must be a superuser: the steps create, drop and
    // truncate tables, and read the lock table.
    // SAFETY: superuser() looks the current user up in the syscache, under the guard.
    if !unsafe { pg_sys::superuser() } {
        pgrx::error!("{F}: the owner of the extension dedup is not a superuser");
    }
    let kind = match step.unwrap_or_default() {
        "seal" => Some(Kind::Seal),
        "drop" => Some(Kind::Drop),
        "retire" => Some(Kind::Retire),
        "publish" => Some(Kind::Publish),
        "summarise" => None,
        other => pgrx::error!("{F}: there is no rotation step {other:?}"),
    };
    // SAFETY: RecoveryInProgress reads shared state, no ERROR.
    if unsafe { pg_sys::RecoveryInProgress() } || !in_use() {
        return Vec::new();
    }
    if !epoch::available() {
        error::generations_need_preload(F);
    }
    if citus::distributed() {
        error::generations_on_citus(F);
    }
    match kind {
        Some(kind) => run(kind, false, &std::cell::OnceCell::new())
            .into_iter()
            .collect(),
        None => summarise(),
    }
}

/// Call `dedup._rotate(step)` (in the caller's transaction, the worker's): what it said.
fn call_rotate(step: &str) -> Vec<String> {
    /// Clears the flag however the call ends (an ERROR unwinds through here).
    struct Flag;
    impl Drop for Flag {
        fn drop(&mut self) {
            WORKER_CALL.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
    WORKER_CALL.store(true, std::sync::atomic::Ordering::Relaxed);
    let _flag = Flag;
    Spi::get_one_with_args::<Vec<String>>(
        "SELECT dedup._rotate($1::pg_catalog.text)",
        &[DatumWithOid::from(step)],
    )
    .unwrap_or_else(|e| pgrx::error!("dedup: calling dedup._rotate('{step}') failed: {e}"))
    .unwrap_or_default()
}

/// Bring the summaries of this database's sealed generations up to date
/// (`summary::sync`): what it did. In a transaction, after the seal waits of the generations
/// the catalog (as of a snapshot taken now) calls sealed.
pub(crate) fn summarise() -> Vec<String> {
    // SAFETY: in a transaction, under pgrx's guard (the caller's #[pg_extern], or
    // prune::in_transaction's PgTry).
    unsafe {
        let ended = super::summary::ended_openers();
        let Some(list) = super::load("dedup.rotate_generations") else {
            return Vec::new();
        };
        let (sealed, open): (Vec<_>, Vec<_>) = list
            .currents
            .iter()
            .chain(&list.others)
            .partition(|g| g.sealed);
        let gens = |l: Vec<&super::Generation>| -> Vec<super::summary::Gen> {
            l.into_iter().map(super::summary::Gen::from).collect()
        };
        let (sealed, open) = (gens(sealed), gens(open));
        super::summary::sync(&sealed, &open, &ended)
    }
}

/// The name of this database (in a transaction: a syscache look-up).
fn this_database() -> String {
    // SAFETY: in a transaction, under pgrx's guard; get_database_name returns a palloc'd
    // copy of the name, or NULL for a database dropped meanwhile (not this one, which this
    // backend is connected to).
    unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        if name.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// Run one step in a transaction of its own and log what it said.
fn in_own_transaction(dbname: &str, kind: Kind, quiet_wait: bool) -> Option<String> {
    match prune::in_transaction(|| call_rotate(kind.name()).into_iter().next()) {
        Ok(Some(message)) => {
            if quiet_wait && message.starts_with("waiting") {
                debug1!("dedup: database \"{dbname}\": {message}");
            } else {
                log!("dedup: database \"{dbname}\": {message}");
            }
            Some(message)
        }
        Ok(None) => None,
        Err(message) => {
            warning!(
                "dedup: the {} step of the generations of database \"{dbname}\" failed: {message}",
                kind.name()
            );
            None
        }
    }
}

/// The kinds of step, in the order a call runs them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Seal,
    Drop,
    Retire,
    Publish,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Seal, Kind::Drop, Kind::Retire, Kind::Publish];

    fn name(self) -> &'static str {
        match self {
            Kind::Seal => "seal",
            Kind::Drop => "drop",
            Kind::Retire => "retire",
            Kind::Publish => "publish",
        }
    }
}

/// One step of `kind` if there is one to do or to report (inside a transaction). The
/// retentions in force are read for the steps that use them (retire, publish), once.
fn run(
    kind: Kind,
    force_publish: bool,
    retention: &std::cell::OnceCell<Retention>,
) -> Option<String> {
    match kind {
        Kind::Seal => seal(),
        Kind::Drop => drop_retired(),
        Kind::Retire => retire(retention.get_or_init(Retention::now)),
        Kind::Publish => publish(retention.get_or_init(Retention::now), force_publish),
    }
}

/// An interval in seconds measured back from now in UTC, as the pruner's cutoffs are
/// (`prune::horizons::UTC_AGO`), so that '1 month' counts the month it spans now: `{}` is
/// the interval's expression.
fn secs(interval: &str) -> String {
    format!(
        "pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) {})",
        crate::prune::horizons::UTC_AGO.replace("{}", interval)
    )
}

/// A retention in force (`dedup.retention`'s, or a scope's own), which has a series of
/// generations: one current at a time, each a quarter of it wide.
#[derive(Clone, Debug)]
struct Series {
    retention: pgrx::datum::Interval,
    /// The interval as a span in µs (a month is 30 days), as PostgreSQL compares intervals.
    span: i128,
    secs: f64,
}

impl Series {
    /// A generation's width: a quarter of the retention, at least a second.
    fn width(&self) -> f64 {
        width(self.secs)
    }
}

fn width(secs: f64) -> f64 {
    (secs / 4.0).max(1.0)
}

/// The retentions in force, as the steps use them.
struct Retention {
    /// The longest, in seconds.
    longest: f64,
    /// The series of `dedup.retention`.
    default: Series,
    /// The retentions in force that have a series, each once (as PostgreSQL's `=` on
    /// intervals has it): `dedup.retention`'s, and the longest [`MOST_SERIES`] - 1 of the
    /// others. Each must have a current generation.
    series: Vec<Series>,
    /// The scopes with a retention of their own: in seconds, and as a span in µs (as
    /// PostgreSQL compares intervals), which routes them. One map, so that a scope has both
    /// or neither.
    scopes: std::collections::HashMap<String, (f64, i128)>,
}

impl Retention {
    fn now() -> Retention {
        let default_secs = f64::from(guc::RETENTION.get());
        let query = format!(
            "SELECT NULL::pg_catalog.text, s.r, {secs} \
               FROM (SELECT pg_catalog.make_interval(secs => $1::pg_catalog.float8) AS r \
                     UNION SELECT r.retention FROM dedup.scope_retention AS r) AS s \
             UNION ALL \
             SELECT r.scope::pg_catalog.text, r.retention, {scope_secs} \
               FROM dedup.scope_retention AS r",
            secs = secs("s.r"),
            scope_secs = secs("r.retention"),
        );
        let mut series = Vec::new();
        let mut scopes = std::collections::HashMap::new();
        Spi::connect(|c| {
            for row in c.select(&query, None, &[DatumWithOid::from(default_secs)])? {
                let scope: Option<String> = row.get(1)?;
                let retention: Option<pgrx::datum::Interval> = row.get(2)?;
                let secs: f64 = row.get(3)?.unwrap_or(default_secs);
                match (scope, retention) {
                    // A scope's retention is NOT NULL (sql/retention.sql); a scope without
                    // one would have dedup.retention's, as a scope not listed has.
                    (Some(scope), Some(retention)) => {
                        scopes.insert(scope, (secs, retention.as_micros()));
                    }
                    (None, Some(retention)) => series.push(Series {
                        span: retention.as_micros(),
                        retention,
                        secs,
                    }),
                    (_, None) => {}
                }
            }
            Ok::<_, pgrx::spi::Error>(())
        })
        .unwrap_or_else(|e| pgrx::error!("dedup: reading the retentions in force failed: {e}"));
        let default_span = i128::from(guc::RETENTION.get()) * 1_000_000;
        let default = series
            .iter()
            .find(|s| s.span == default_span)
            .cloned()
            .unwrap_or_else(|| pgrx::error!("dedup: the series of dedup.retention is missing"));
        // Past the cap, the shortest retentions have no series of their own: their claims
        // go to the shortest longer series ([`nearest`], by the published routes), kept longer
        // than their retention, never in a shorter series that their claims would hold back.
        series.retain(|s| s.span != default_span);
        series.sort_by_key(|s| std::cmp::Reverse(s.span));
        series.truncate(MOST_SERIES - 1);
        series.push(default.clone());
        // The longest of every retention, not of the series': '1 mon' and '30 days' are one
        // series, but measured back from now they differ.
        let longest = series
            .iter()
            .map(|s| s.secs)
            .chain(scopes.values().map(|(secs, _)| *secs))
            .fold(default.secs, f64::max);
        Retention {
            longest,
            default,
            series,
            scopes,
        }
    }

    /// The retention of `scope` in seconds: its own, else `dedup.retention`'s.
    fn of(&self, scope: &str) -> f64 {
        self.scopes
            .get(scope)
            .map_or(self.default.secs, |(secs, _)| *secs)
    }

    /// The routes as they should be: for each current generation of a series in force (by
    /// n), the scopes whose claims it takes, `[None]` (every scope not named elsewhere) for
    /// `dedup.retention`'s; a scope with a retention of its own goes to its series, or the
    /// nearest ([`nearest`]). None if a series in force has no current
    /// generation yet.
    fn routes(&self, rows: &[Row]) -> Option<Routes> {
        let currents: Vec<&Row> = rows
            .iter()
            .filter(|g| g.state == CURRENT && self.series_of(g.span).is_some())
            .collect();
        if self.series.iter().any(|s| !has_current(rows, s.span)) {
            return None;
        }
        let default = currents
            .iter()
            .find(|g| g.span == Some(self.default.span))?
            .n;
        let spans: Vec<(usize, i128)> = currents
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.span.map(|s| (i, s)))
            .collect();
        let mut named = std::collections::BTreeMap::new();
        for (scope, (_, span)) in &self.scopes {
            let n = nearest(&spans, *span).map_or(default, |i| currents[i].n);
            if n != default {
                named.insert(scope.clone(), n);
            }
        }
        Some(Routes { named, default })
    }

    /// The series of span `span`, if it is in force.
    fn series_of(&self, span: Option<i128>) -> Option<&Series> {
        span.and_then(|span| self.series.iter().find(|s| s.span == span))
    }
}

/// Whether the series of `span` has a current generation in `rows`.
fn has_current(rows: &[Row], span: i128) -> bool {
    rows.iter()
        .any(|g| g.state == CURRENT && g.span == Some(span))
}

/// Which of `spans` (an index and a retention as a span in µs, PostgreSQL's interval
/// comparison) a retention of `span` goes to: its own, else the nearest: the shortest longer
/// one, else the longest (a claim kept longer than its retention, never less: [`retire`]
/// goes by the retentions of the scopes in a generation). None if `spans` is empty.
fn nearest(spans: &[(usize, i128)], span: i128) -> Option<usize> {
    spans
        .iter()
        .filter(|(_, s)| *s >= span)
        .min_by_key(|(_, s)| *s)
        .or_else(|| spans.iter().max_by_key(|(_, s)| *s))
        .map(|(i, _)| *i)
}

/// Where the claims of each scope go: the current generation (n) of a scope named, and of
/// every other scope (`default`).
#[derive(Clone, PartialEq, Debug)]
struct Routes {
    named: std::collections::BTreeMap<String, i32>,
    default: i32,
}

impl Routes {
    /// The routes published in the current generations of `rows` (None: none takes every
    /// scope, as only inside `use_generations()`).
    fn published(rows: &[Row]) -> Option<Routes> {
        let mut named = std::collections::BTreeMap::new();
        let mut default = None;
        for g in rows.iter().filter(|g| g.state == CURRENT) {
            for name in g.routes.iter().flatten() {
                match name {
                    Some(scope) => {
                        named.insert(scope.clone(), g.n);
                    }
                    None => default = Some(g.n),
                }
            }
        }
        let default = default?;
        named.retain(|_, n| *n != default);
        Some(Routes { named, default })
    }

    fn of(&self, scope: &str) -> i32 {
        self.named.get(scope).copied().unwrap_or(self.default)
    }

    /// The routes of generation `n` as `dedup.generations.routes` has them.
    fn column(&self, n: i32) -> Vec<Option<String>> {
        let every = (n == self.default).then_some(None);
        every
            .into_iter()
            .chain(
                self.named
                    .iter()
                    .filter(|(_, m)| **m == n)
                    .map(|(scope, _)| Some(scope.clone())),
            )
            .collect()
    }
}

/// A move of the routes: away from current generation `from`, the routes as published
/// `before` and as they are `after` it (where `from` stands for its successor).
#[derive(Debug, PartialEq)]
struct RouteMove {
    from: i32,
    before: Routes,
    after: Routes,
}

/// A move of the routes that is due: from the current generation `from` (the lowest n of
/// those some scope leaves, or that is no longer in force). The scopes that leave `from`
/// go where `desired` has them; no other scope moves (each leaves its generation with a
/// publication away from it).
fn route_move(rows: &[Row], retention: &Retention) -> Option<RouteMove> {
    let published = Routes::published(rows)?;
    let desired = retention.routes(rows)?;
    let not_in_force = rows
        .iter()
        .filter(|g| g.state == CURRENT && retention.series_of(g.span).is_none())
        .map(|g| g.n);
    let scopes: std::collections::BTreeSet<&String> =
        published.named.keys().chain(desired.named.keys()).collect();
    let leaving = scopes
        .iter()
        .filter(|s| published.of(s) != desired.of(s))
        .map(|s| published.of(s));
    let from = not_in_force
        .chain(leaving)
        .chain((published.default != desired.default).then_some(published.default))
        .min()?;
    let mut after = published.clone();
    for scope in scopes {
        if published.of(scope) == from {
            after.named.insert(scope.clone(), desired.of(scope));
        }
    }
    if published.default == from {
        after.default = desired.default;
    }
    after.named.retain(|_, n| *n != after.default);
    Some(RouteMove {
        from,
        before: published,
        after,
    })
}

/// The most scopes a generation's `scopes` lists: beyond, the generation is kept for the
/// longest retention in force.
const MOST_SCOPES: i64 = 1000;

/// The most series (retentions with generations of their own), `dedup.retention`'s
/// included: a claim looks up the summaries of every series' sealed generations (and opens
/// one, two locks, where a summary says "maybe", or has none), and locks the one being
/// sealed; PostgreSQL 15 to 17 keep 16 locks per backend in the fast path.
const MOST_SERIES: usize = 4;

/// A row of `dedup.generations`, with what is due for it now.
#[derive(Clone, PartialEq, Debug)]
struct Row {
    n: i32,
    relname: String,
    relid: pg_sys::Oid,
    state: String,
    waits: Option<String>,
    /// This transaction wrote the row (its xmin is ours): a change not committed yet.
    mine: bool,
    /// Its series: its retention as a span in µs (None for generation 0).
    span: Option<i128>,
    /// Its series' retention in seconds, as [`secs`] measures it (None for generation 0).
    series_secs: Option<f64>,
    /// Seconds since opened_at.
    age: f64,
    /// Seconds since sealed_at (None: not sealed).
    sealed_for: Option<f64>,
    /// The scopes of its claims, once looked for (a None element: more than [`MOST_SCOPES`]).
    scopes: Option<Vec<Option<String>>>,
    /// The scopes whose claims it takes, as published (a None element: every scope no
    /// other current generation names).
    routes: Option<Vec<Option<String>>>,
}

impl Row {
    fn name(&self) -> String {
        format!("dedup.{}", self.relname)
    }

    /// Its series' retention in seconds: the longest in force for generation 0, or for a
    /// series no longer in force whose retention was longer.
    fn retention_secs(&self, retention: &Retention) -> f64 {
        self.series_secs.unwrap_or(retention.longest)
    }

    /// The current generation is older than its series' width.
    fn publish_due(&self, retention: &Retention) -> bool {
        self.age >= width(self.retention_secs(retention))
    }
}

/// Operators written OPERATOR() all bind alike, left to right: hence the parentheses. Made
/// once per backend.
fn rows_query() -> &'static str {
    static QUERY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    QUERY.get_or_init(|| {
        format!(
            "SELECT g.n, g.relname::pg_catalog.text, g.relid::pg_catalog.oid, g.state, g.waits, \
                g.xmin::pg_catalog.text, g.retention, {secs}, \
                pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) g.opened_at)::pg_catalog.float8, \
                pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) g.sealed_at)::pg_catalog.float8, \
                g.scopes, g.routes \
           FROM dedup.generations AS g ORDER BY g.n",
            secs = secs("g.retention")
        )
    })
}

/// The rows of `dedup.generations`, by n. `fresh`: with a snapshot taken now (a statement
/// run as a write: in READ COMMITTED it sees what another rotator committed while this one
/// waited for the publishing lock); otherwise the caller's snapshot, and no transaction ID.
fn load(fresh: bool) -> Vec<Row> {
    let query = rows_query();
    let rows = Spi::connect_mut(|c| {
        let table = if fresh {
            c.update(query, None, &[])?
        } else {
            c.select(query, None, &[])?
        };
        let mut rows = Vec::new();
        for row in table {
            let xmin: String = row.get(6)?.unwrap_or_default();
            let retention: Option<pgrx::datum::Interval> = row.get(7)?;
            rows.push(Row {
                n: row.get(1)?.unwrap_or(-1),
                relname: row.get(2)?.unwrap_or_default(),
                relid: row.get(3)?.unwrap_or(pg_sys::InvalidOid),
                state: row.get(4)?.unwrap_or_default(),
                waits: row.get(5)?,
                mine: xmin.parse::<u32>().is_ok_and(|x| {
                    // SAFETY: TransactionIdIsCurrentTransactionId only compares with this
                    // backend's transaction state; no ERROR.
                    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(x.into()) }
                }),
                span: retention.map(|r| r.as_micros()),
                series_secs: row.get(8)?,
                age: row.get(9)?.unwrap_or(0.0),
                sealed_for: row.get(10)?,
                scopes: row.get(11)?,
                routes: row.get(12)?,
            });
        }
        Ok::<_, pgrx::spi::Error>(rows)
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: reading dedup.generations failed: {e}"));
    // The names go into DDL: only the ones this module gives.
    for row in &rows {
        if row.relname != super::relname_of(row.n) {
            pgrx::error!(
                "dedup: generation {} of dedup.generations is named {:?}, not {}",
                row.n,
                row.relname,
                super::relname_of(row.n)
            );
        }
    }
    rows
}

/// `g` as it is now, under the publishing lock; None if another session changed it since
/// the caller read it (that session did the step).
fn reread(g: &Row) -> Option<Row> {
    load(true)
        .into_iter()
        .find(|r| r.n == g.n && r.state == g.state && r.waits == g.waits && r.relid == g.relid)
}

/// Run a statement that changes something; the number of rows it changed.
fn exec(query: &str, args: &[DatumWithOid<'_>], what: &str) -> usize {
    Spi::connect_mut(|c| c.update(query, None, args).map(|t| t.len()))
        .unwrap_or_else(|e| pgrx::error!("dedup: {what} failed: {e}"))
}

/// An UPDATE or DELETE of generation `n`'s row that must change it.
fn change_row(query: &str, n: i32, what: &str) {
    if exec(query, &[DatumWithOid::from(n)], what) != 1 {
        pgrx::error!("dedup: {what}: generation {n} is not in dedup.generations as it was");
    }
}

/// Does this database use generations: the extension's `dedup.generations` exists and has
/// a row (inside a transaction).
fn in_use() -> bool {
    // SAFETY: syscache lookups in the caller's transaction, under its guard.
    let catalog = unsafe { super::extension_relid(c"generations") } != pg_sys::InvalidOid;
    catalog
        && Spi::connect(|c| {
            c.select("SELECT EXISTS (SELECT FROM dedup.generations)", None, &[])?
                .first()
                .get_one::<bool>()
        })
        .unwrap_or_else(|e| pgrx::error!("dedup: reading dedup.generations failed: {e}"))
        .unwrap_or(false)
}

/// The OID of `dedup.processed`, checked as a claim checks it: the extension's own table,
/// a heap table with the columns of 0.3.0 on and its primary key.
///
/// # Safety
///
/// In a transaction, under pgrx's guard (open_processed and check_layout raise ERRORs).
unsafe fn processed_relid(func: &str) -> pg_sys::Oid {
    // SAFETY: the contract above; open_processed returns an open relation (RowExclusiveLock,
    // kept to the transaction's end by NoLock), read before table_close.
    let rel = claim::open_processed();
    let layout = claim::check_layout(rel, func);
    let relid = (*rel).rd_id;
    pg_sys::table_close(rel, pg_sys::NoLock as _);
    if layout != claim::Layout::Leases {
        error::unexpected_layout(func);
    }
    relid
}

// ---- Publish ----------------------------------------------------------------------------

/// Publish a new generation if one is due, or `force`d. In this order, one at most:
/// - the first generation of a retention in force that has no current one (a scope's new
///   retention), also while another is being sealed: no scope goes there yet;
/// - none while a generation is being sealed (a generation is published once the one before
///   it is sealed);
/// - a move of the routes ([`route_move`]): the current generation that scopes leave (a
///   retention changed), or whose retention is no longer in force, is published away from,
///   and its leaving scopes go to the current generations of their series (the routes in
///   `dedup.generations` change in the same transaction). A current generation thus holds
///   claims only of scopes routed to it since it became current, so a claim looks in no
///   other series' current generation (`generations::List`);
/// - the next generation of the series whose current one is older than its width; forced,
///   of `dedup.retention`'s series (a forced publication is a move of the routes instead
///   when one is due).
fn publish(retention: &Retention, force: bool) -> Option<String> {
    let rows = load(false);
    if let Some(s) = retention
        .series
        .iter()
        .find(|s| !has_current(&rows, s.span))
    {
        epoch::publishing();
        let rows = load(true);
        // Else another session published it meanwhile.
        return (!has_current(&rows, s.span)).then(|| publish_next(&rows, None, s, &[]));
    }
    if let Some(s) = rows.iter().find(|g| g.state == SEALING) {
        return force.then(|| {
            format!(
                "not published: {} is still being sealed (a generation is published once the \
                 one before it is sealed)",
                s.name()
            )
        });
    }
    if route_move(&rows, retention).is_some() {
        epoch::publishing();
        let rows = load(true);
        if rows.iter().any(|g| g.state == SEALING) {
            // Another session published meanwhile.
            return None;
        }
        return route_move(&rows, retention).map(|m| move_routes(&rows, &m, retention));
    }
    let currents = || rows.iter().filter(|g| g.state == CURRENT);
    let due = if force {
        currents()
            .find(|g| g.span == Some(retention.default.span))
            .or_else(|| currents().next())
    } else {
        currents().find(|g| g.publish_due(retention))
    }?;
    let series = retention.series_of(due.span)?;
    let n = due.n;
    epoch::publishing();
    let rows = load(true);
    let from = rows.iter().find(|g| g.n == n && g.state == CURRENT);
    let still = from.is_some() && !rows.iter().any(|g| g.state == SEALING);
    // Else another session published meanwhile.
    still.then(|| {
        let routes = from.and_then(|g| g.routes.clone()).unwrap_or_default();
        publish_next(&rows, from, series, &routes)
    })
}

/// Make move `m`: publish away from its current generation `from`, with a successor if its
/// retention is still in force, and write the routes after it into the current
/// generations. The caller holds the publishing lock and read `rows` under it.
fn move_routes(rows: &[Row], m: &RouteMove, retention: &Retention) -> String {
    let RouteMove {
        from,
        before,
        after,
    } = m;
    let from = *from;
    let g = rows
        .iter()
        .find(|g| g.n == from)
        .unwrap_or_else(|| pgrx::error!("dedup: generation {from} is not in dedup.generations"));
    let moved: std::collections::BTreeSet<&String> = before
        .named
        .keys()
        .chain(after.named.keys())
        .filter(|s| before.of(s) == from && after.of(s) != from)
        .collect();
    let every = before.default == from && after.default != from;
    let said = match retention.series_of(g.span) {
        Some(series) => publish_next(rows, Some(g), series, &after.column(from)),
        None => {
            change_row(
                "UPDATE dedup.generations AS g SET state = 'sealing', waits = NULL \
                  WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'current'",
                from,
                "marking the current generation sealing",
            );
            format!(
                "published away from {}: its retention is no longer in force (its claims are \
                 kept for the retentions of their scopes)",
                g.name()
            )
        }
    };
    write_routes(rows, after, Some(from));
    let mut to = Vec::new();
    if every {
        to.push(format!(
            "every scope not named to {}",
            super::relname_of(after.default)
        ));
    }
    for scope in moved {
        to.push(format!("{scope} to {}", super::relname_of(after.of(scope))));
    }
    if to.is_empty() {
        said
    } else {
        format!("{said}; routes moved: {}", to.join(", "))
    }
}

/// Write `routes` into each current generation of `rows` (but `except`) whose routes differ
/// (under the publishing lock).
fn write_routes(rows: &[Row], routes: &Routes, except: Option<i32>) {
    for g in rows
        .iter()
        .filter(|g| g.state == CURRENT && Some(g.n) != except)
    {
        let column = routes.column(g.n);
        if g.routes.as_ref() != Some(&column) {
            set_routes(g.n, &column);
        }
    }
}

/// Write the routes of current generation `n` (under the publishing lock).
fn set_routes(n: i32, routes: &[Option<String>]) {
    exec(
        "UPDATE dedup.generations AS g SET routes = $2 \
          WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'current'",
        &[DatumWithOid::from(n), DatumWithOid::from(routes.to_vec())],
        "publishing the routes of a generation",
    );
}

/// Make generation max(n) + 1 the current one of `series`, taking the claims of `routes`
/// (the scopes as `dedup.generations.routes` has them), and `from` (its current one)
/// `sealing`. The caller holds the publishing lock and read `rows` under it.
fn publish_next(
    rows: &[Row],
    from: Option<&Row>,
    series: &Series,
    routes: &[Option<String>],
) -> String {
    let n = rows
        .iter()
        .map(|g| g.n)
        .max()
        .and_then(|m| m.checked_add(1))
        .unwrap_or_else(|| pgrx::error!("dedup: no generation number is left"));
    let relname = super::relname_of(n);
    let relid = create_generation(&relname);
    // Its summary, filled as its claims go in (summary::open_collecting), sized by the
    // claims of the generation it follows: opened before this publication commits, so before
    // any claim can insert into it.
    if guc::SUMMARIES_AS_CLAIMED.get() && super::summary::available() {
        use super::summary::{Counted, Expected};
        let expected = from.map_or(Expected::NotKnown { at_least: 0 }, |g| {
            match super::summary::keys_of_summary(g.relid, g.n) {
                Counted::Keys(k) => Expected::Keys(k),
                Counted::TooFull { at_least } => Expected::NotKnown { at_least },
                // Without a summary (a restart lost it, or it found no room), what its table's
                // last ANALYZE or VACUUM counted; -1: never.
                Counted::NoSummary => Spi::get_one_with_args::<f32>(
                    "SELECT c.reltuples FROM pg_catalog.pg_class AS c \
                      WHERE c.oid OPERATOR(pg_catalog.=) $1",
                    &[DatumWithOid::from(g.relid)],
                )
                .ok()
                .flatten()
                .filter(|&t| t >= 0.0)
                .map_or(Expected::NotKnown { at_least: 0 }, |t| {
                    Expected::Keys(t as u64)
                }),
            }
        });
        // The generations still read (a retired one's summary is freed to make room).
        let live: Vec<super::summary::Gen> = rows
            .iter()
            .filter(|g| [CURRENT, SEALING, SEALED].contains(&g.state.as_str()))
            .map(|g| super::summary::Gen {
                n: g.n,
                relid: g.relid,
            })
            .collect();
        // SAFETY: reads this transaction's state (CREATE TABLE gave it an xid).
        let opener = unsafe { pg_sys::GetTopTransactionIdIfAny() };
        let (freed, opened) = super::summary::open_collecting(relid, n, expected, &live, opener);
        // Named as the worker's own lines name it (this may run in a user's
        // rotate_generations() or use_generations()); the name looked up only to say one.
        for line in freed {
            pgrx::log!("dedup: database \"{}\": {line}", this_database());
        }
        // Said where the seal will have to read the generation (a LOG line, as the worker's
        // own "did not summarise").
        if opened.starts_with("did not") {
            pgrx::log!("dedup: database \"{}\": {opened}", this_database());
        } else if !opened.is_empty() {
            pgrx::debug1!("dedup: database \"{}\": {opened}", this_database());
        }
    }
    if let Some(from) = from {
        change_row(
            "UPDATE dedup.generations AS g SET state = 'sealing', waits = NULL \
              WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'current'",
            from.n,
            "marking the current generation sealing",
        );
    }
    exec(
        "INSERT INTO dedup.generations (n, relname, relid, state, opened_at, retention, routes) \
         VALUES ($1, $2::pg_catalog.name, $3::pg_catalog.regclass, 'current', pg_catalog.now(), $4, $5)",
        &[
            DatumWithOid::from(n),
            DatumWithOid::from(relname.as_str()),
            DatumWithOid::from(relid),
            DatumWithOid::from(series.retention),
            DatumWithOid::from(routes.to_vec()),
        ],
        "recording the new generation",
    );
    if from.is_some() {
        format!("published dedup.{relname}")
    } else {
        format!(
            "published dedup.{relname}, the first of the retention of {:.0} s",
            series.secs
        )
    }
}

/// The privileges on relation `$1` of roles other than its owner (PUBLIC included), as a
/// FROM clause of aclexplode's rows `a`.
const ACL_OTHERS: &str = "FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a \
      WHERE c.oid OPERATOR(pg_catalog.=) $1 \
        AND a.grantee OPERATOR(pg_catalog.<>) c.relowner";

/// Create `dedup.<relname>` with the columns of `dedup.processed` (sql/claims.sql), its
/// primary key and nothing else, in processed's tablespaces, owned by processed's owner and
/// granting nothing to anyone else (whatever default privileges gave); its OID.
fn create_generation(relname: &str) -> pg_sys::Oid {
    let (owner, table_space, index_space) = Spi::get_three::<String, String, String>(
        "SELECT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text), \
                (SELECT pg_catalog.quote_ident(t.spcname::pg_catalog.text) \
                   FROM pg_catalog.pg_tablespace AS t \
                  WHERE t.oid OPERATOR(pg_catalog.=) c.reltablespace), \
                (SELECT pg_catalog.quote_ident(t.spcname::pg_catalog.text) \
                   FROM pg_catalog.pg_index AS i \
                   JOIN pg_catalog.pg_class AS x ON x.oid OPERATOR(pg_catalog.=) i.indexrelid \
                   JOIN pg_catalog.pg_tablespace AS t ON t.oid OPERATOR(pg_catalog.=) x.reltablespace \
                  WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid AND i.indisprimary) \
           FROM pg_catalog.pg_class AS c \
          WHERE c.relname OPERATOR(pg_catalog.=) 'processed'::pg_catalog.name \
            AND c.relnamespace OPERATOR(pg_catalog.=) \
                (SELECT s.oid FROM pg_catalog.pg_namespace AS s \
                  WHERE s.nspname OPERATOR(pg_catalog.=) 'dedup'::pg_catalog.name)",
    )
    .unwrap_or_else(|e| pgrx::error!("dedup: reading the owner of dedup.processed failed: {e}"));
    let owner = owner.unwrap_or_else(|| pgrx::error!("dedup: dedup.processed has no owner"));
    let index_space = index_space
        .map(|t| format!(" USING INDEX TABLESPACE {t}"))
        .unwrap_or_default();
    let table_space = table_space
        .map(|t| format!(" TABLESPACE {t}"))
        .unwrap_or_default();
    // The columns of sql/claims.sql, in its order (claim::COLUMNS); USING heap whatever
    // default_table_access_method says (claims are written into the heap directly). No
    // vacuum started by inserts (PostgreSQL 13 on): it is there to set an insert-only table's
    // pages all-visible and freeze them before an anti-wraparound vacuum must, and a
    // generation takes inserts only and is dropped after its retention: before any such
    // vacuum where a retention's worth of transaction ids stays under
    // autovacuum_freeze_max_age; past that, it gets one that reads and freezes it whole
    // (docs/reference/objects.md, dedup.generations). Flat out the insert vacuum was some 4
    // to 7% of the server's CPU (docs/performance.md, "Generations by CPU"). A vacuum for
    // dead tuples (forget, a lease that moves) and the anti-wraparound vacuum, which this
    // setting does not stop, still come.
    exec(
        &format!(
            "CREATE TABLE dedup.{relname} ( \
                scope            pg_catalog.text COLLATE pg_catalog.\"C\" NOT NULL, \
                job_id           pg_catalog.text COLLATE pg_catalog.\"C\" NOT NULL, \
                processed_at     pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(), \
                fingerprint      pg_catalog.text COLLATE pg_catalog.\"C\", \
                result           pg_catalog.jsonb, \
                lease_id         pg_catalog.uuid, \
                lease_expires_at pg_catalog.timestamptz, \
                CONSTRAINT {relname}_pkey PRIMARY KEY (job_id, scope){index_space} \
             ) USING heap \
               WITH (autovacuum_vacuum_insert_threshold = -1, \
                     toast.autovacuum_vacuum_insert_threshold = -1){table_space}"
        ),
        &[],
        &format!("creating dedup.{relname}"),
    );
    exec(
        &format!("ALTER TABLE dedup.{relname} OWNER TO {owner}"),
        &[],
        &format!("giving dedup.{relname} to the owner of dedup.processed"),
    );
    let relid = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT c.oid FROM pg_catalog.pg_class AS c \
          WHERE c.relname OPERATOR(pg_catalog.=) $1::pg_catalog.name \
            AND c.relnamespace OPERATOR(pg_catalog.=) \
                (SELECT s.oid FROM pg_catalog.pg_namespace AS s \
                  WHERE s.nspname OPERATOR(pg_catalog.=) 'dedup'::pg_catalog.name)",
        &[DatumWithOid::from(relname)],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| pgrx::error!("dedup: dedup.{relname} was not created"));
    // Nobody but the owner writes a generation: try_claim is the only way in (as for
    // dedup.processed, sql/claims.sql). REVOKE by a superuser acts as the owner, the grantor
    // of what default privileges gave (ALTER TABLE OWNER made the new owner their grantor).
    exec(
        &format!("REVOKE ALL ON TABLE dedup.{relname} FROM PUBLIC"),
        &[],
        &format!("revoking the privileges of PUBLIC on dedup.{relname}"),
    );
    let grantees = Spi::connect(|c| {
        let rows = c.select(
            &format!(
                "SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)::pg_catalog.text) \
                 {ACL_OTHERS} AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid"
            ),
            None,
            &[DatumWithOid::from(relid)],
        )?;
        let mut grantees = Vec::new();
        for row in rows {
            if let Some(g) = row.get::<String>(1)? {
                grantees.push(g);
            }
        }
        Ok::<_, pgrx::spi::Error>(grantees)
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: reading the privileges of dedup.{relname} failed: {e}"));
    for grantee in grantees {
        exec(
            &format!("REVOKE ALL ON TABLE dedup.{relname} FROM {grantee} CASCADE"),
            &[],
            &format!("revoking the privileges of {grantee} on dedup.{relname}"),
        );
    }
    let left = Spi::get_one_with_args::<i64>(
        &format!("SELECT pg_catalog.count(*) {ACL_OTHERS}"),
        &[DatumWithOid::from(relid)],
    )
    .ok()
    .flatten()
    .unwrap_or(0);
    if left > 0 {
        pgrx::error!(
            "dedup: dedup.{relname} still grants privileges to a role other than its owner"
        );
    }
    relid
}

// ---- Seal -------------------------------------------------------------------------------

/// The seal of the generation being sealed: list its lockers once, poll them, seal it when
/// they have all ended.
fn seal() -> Option<String> {
    let g = load(false).into_iter().find(|g| g.state == SEALING)?;
    let name = g.name();
    let stored = g
        .waits
        .as_deref()
        .and_then(Waits::parse)
        .filter(Waits::this_run);
    if stored.is_none() && g.mine {
        // Listed before the publication commits, a claimer that locks the old generation
        // in between would be missed: it reads the old epoch and inserts there.
        return Some(format!(
            "{name} is sealed by a later call, once this transaction (which published the \
             generation after it) has committed"
        ));
    }
    if let Some(w) = &stored {
        let running = w.running();
        if !running.is_empty() {
            return Some(format!("waiting for {} to seal {name}", describe(&running)));
        }
    }
    if super::locked_by_me(g.relid, pg_sys::AccessShareLock) {
        // GetLockConflicts leaves this transaction out: it may have inserted there.
        return Some(format!(
            "{name} is sealed by a later call, once this transaction (which holds a lock on \
             it) has ended"
        ));
    }
    epoch::publishing();
    let g = reread(&g)?;
    let waits = match stored {
        Some(w) => w,
        None => {
            // The list is taken once (and again only after a restart): taken at every pass,
            // a stream of new lockers could hold the seal back for ever.
            let w = Waits::list(g.relid, pg_sys::ShareLock, true);
            set_waits(&g, &w.text());
            w
        }
    };
    let running = waits.running();
    if !running.is_empty() {
        return Some(format!("waiting for {} to seal {name}", describe(&running)));
    }
    // clock_timestamp(): after every listed transaction ended, so after every commit of a
    // claim in the generation; its retention counts from here.
    change_row(
        "UPDATE dedup.generations AS g \
            SET state = 'sealed', sealed_at = pg_catalog.clock_timestamp(), waits = NULL \
          WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'sealing'",
        g.n,
        "sealing",
    );
    Some(format!("sealed {name}"))
}

/// Store the wait list of `g` (under the publishing lock).
fn set_waits(g: &Row, waits: &str) {
    let changed = exec(
        "UPDATE dedup.generations AS g SET waits = $3 \
          WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) $2",
        &[
            DatumWithOid::from(g.n),
            DatumWithOid::from(g.state.as_str()),
            DatumWithOid::from(waits),
        ],
        "recording a wait list",
    );
    if changed != 1 {
        pgrx::error!("dedup: generation {} is no longer {}", g.n, g.state);
    }
}

// ---- Retire -----------------------------------------------------------------------------

/// Retire the oldest sealed generation whose claims are all past their retention and in
/// which no lease still runs (a newer one is retired while an older one is held back:
/// nothing needs them retired in order). A generation's claims are past their retention
/// once its seal is older than the longest retention in force, or than its series'
/// retention and that of each scope of its claims (the retentions in force now: a scope's
/// retention raised after its claims were taken keeps them the longer; a claim of a scope
/// routed to the series when it was taken, before the worker moved the routes after that
/// scope's retention changed, keeps the generation for that scope's retention). The scopes are looked for once, with
/// a scan of the generation, when its series' retention has passed while a longer one is
/// in force, and kept in its row.
fn retire(retention: &Retention) -> Option<String> {
    let candidates: Vec<Row> = load(false)
        .into_iter()
        .filter(|g| {
            g.state == SEALED
                && g.sealed_for
                    .is_some_and(|t| t >= g.retention_secs(retention).min(retention.longest))
        })
        .collect();
    // A lease still running there is not retired with it (a copy would lease the job again
    // while its holder works). A sealed generation gains no lease and no lease is changed
    // in place there (a lease function changes in place only in the generation claims go
    // to, which it locks as a claim does, so the seal waited for it): one taken over,
    // extended or completed moves to the generation claims go to, so the count can only
    // fall. A lease is never longer than its scope's retention, so one is found here only
    // after that retention was shortened. (Its summary, built after the seal, knows the
    // latest lease_expires_at there: none runs past it, so no scan while that has passed;
    // otherwise a scan of the generation besides the hand-off's below, once per pass while
    // it is held back.)
    // Looked at before the publishing lock, whose transaction moves the epoch. A generation
    // held back does not hold back the next one due.
    let mut held = None;
    let mut free = None;
    // One generation's scopes read per step: the recording takes the publishing lock, held
    // to the step's end, which another scan would hold the longer.
    let mut recorded = false;
    for g in candidates {
        let sealed_for = g.sealed_for.unwrap_or(0.0);
        // The retention its claims were kept for: the longest of its scopes'.
        let mut kept_for = retention.longest;
        if sealed_for < retention.longest {
            let scopes = match &g.scopes {
                Some(scopes) => scopes.clone(),
                None if recorded => continue,
                None => {
                    recorded = true;
                    let scopes = scopes_of(&g);
                    epoch::publishing();
                    let g = reread(&g)?;
                    set_scopes(&g, &scopes);
                    scopes
                }
            };
            let longest = scopes
                .iter()
                .map(|s| s.as_deref().map_or(retention.longest, |s| retention.of(s)))
                .fold(g.retention_secs(retention), f64::max);
            if sealed_for < longest {
                continue;
            }
            kept_for = longest;
        }
        match running_leases(&g) {
            Some(why) => {
                held.get_or_insert(why);
            }
            None => {
                free = Some((g, kept_for));
                break;
            }
        }
    }
    let Some((g, kept_for)) = free else {
        return held;
    };
    epoch::publishing();
    let g = reread(&g)?;
    change_row(
        "UPDATE dedup.generations AS g \
            SET state = 'retired', retired_at = pg_catalog.now(), waits = NULL \
          WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'sealed'",
        g.n,
        "retiring",
    );
    // SAFETY: in the step's transaction, under its guard.
    let (read, kept) = unsafe { super::summary::pass_to_expired(g.relid, g.n, kept_for) };
    Some(format!(
        "retired {}: sealed {:.0} s ago, past the retention of each scope of its claims{}",
        g.name(),
        g.sealed_for.unwrap_or(0.0),
        if read == 0 {
            String::new()
        } else if kept == read {
            let claims = if read == 1 { "claim" } else { "claims" };
            format!("; its {read} {claims} remembered to count the copies that come later")
        } else {
            format!(
                "; {kept} of its {read} claims remembered to count the copies that come later \
                 (the others were past dedup.expired_lookback, or the summary was full: raise \
                 dedup.expired_memory)"
            )
        }
    ))
}

/// The scopes of the claims in sealed generation `g` (a scan of it), at most
/// [`MOST_SCOPES`]; a None element after them if there are more.
fn scopes_of(g: &Row) -> Vec<Option<String>> {
    let mut scopes: Vec<Option<String>> = Spi::connect(|c| {
        c.select(
            &format!(
                "SELECT DISTINCT p.scope::pg_catalog.text FROM dedup.{} AS p LIMIT $1",
                super::relname_of(g.n)
            ),
            None,
            &[DatumWithOid::from(MOST_SCOPES + 1)],
        )?
        .map(|row| row.get::<String>(1))
        .collect::<Result<Vec<_>, _>>()
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: reading the scopes of {} failed: {e}", g.name()));
    if scopes.len() as i64 > MOST_SCOPES {
        scopes.truncate(MOST_SCOPES as usize);
        scopes.push(None);
    }
    scopes
}

/// Store the scopes of `g`'s claims (under the publishing lock).
fn set_scopes(g: &Row, scopes: &[Option<String>]) {
    let changed = exec(
        "UPDATE dedup.generations AS g SET scopes = $2 \
          WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'sealed'",
        &[DatumWithOid::from(g.n), DatumWithOid::from(scopes.to_vec())],
        "recording the scopes of a generation",
    );
    if changed != 1 {
        pgrx::error!("dedup: generation {} is no longer sealed", g.n);
    }
}

/// What holds back the retirement of `g`: the leases in it that have not expired, or None.
/// Read from its summary when that says no lease there runs past now (no scan), else
/// counted with a scan of the generation.
fn running_leases(g: &Row) -> Option<String> {
    // SAFETY: GetCurrentTimestamp reads the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    if super::summary::built_with(g.relid, g.n).is_some_and(|(until, _)| until <= now) {
        return None;
    }
    let (count, until) = Spi::connect_mut(|c| {
        let row = c
            .update(
                &format!(
                    "SELECT pg_catalog.count(*), pg_catalog.max(p.lease_expires_at)::pg_catalog.text \
                       FROM dedup.{} AS p \
                      WHERE p.lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()",
                    super::relname_of(g.n)
                ),
                None,
                &[],
            )?
            .first();
        Ok::<_, pgrx::spi::Error>((row.get::<i64>(1)?.unwrap_or(0), row.get::<String>(2)?))
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: reading the leases of {} failed: {e}", g.name()));
    (count > 0).then(|| {
        format!(
            "waiting to retire {}: {count} lease(s) in it still running, the last until {}",
            g.name(),
            until.unwrap_or_default()
        )
    })
}

// ---- Drop -------------------------------------------------------------------------------

/// The drop of the oldest retired generation whose table is still there: list its lockers
/// once (every mode), poll them, then take its lock only if it is free at once, and drop it
/// (n >= 1) or truncate `dedup.processed` (n = 0).
fn drop_retired() -> Option<String> {
    let g = load(false)
        .into_iter()
        .find(|g| g.state == RETIRED && g.waits.as_deref() != Some(TRUNCATED))?;
    let name = g.name();
    let (verb, done) = if g.n == 0 {
        ("truncate", "truncated")
    } else {
        ("drop", "dropped")
    };
    let stored = g
        .waits
        .as_deref()
        .and_then(Waits::parse)
        .filter(Waits::this_run);
    if stored.is_none() && g.mine {
        // A claimer with the list from before the retirement may lock it until then.
        return Some(format!(
            "{name} is {done} by a later call, once this transaction (which retired it) has \
             committed"
        ));
    }
    let locked_out = || {
        format!(
            "{name} is locked by another transaction: it is {done} by a later call (the \
             rotation never waits in the lock queue)"
        )
    };
    if let Some(w) = &stored {
        let running = w.running();
        if !running.is_empty() {
            return Some(format!(
                "waiting for {} to {verb} {name}",
                describe(&running)
            ));
        }
        if !try_lock(g.relid) {
            return Some(locked_out());
        }
    }
    epoch::publishing();
    let Some(g) = reread(&g) else {
        unlock(g.relid);
        return None;
    };
    if stored.is_none() {
        let w = Waits::list(g.relid, pg_sys::AccessExclusiveLock, false);
        set_waits(&g, &w.text());
        let running = w.running();
        if !running.is_empty() {
            return Some(format!(
                "waiting for {} to {verb} {name}",
                describe(&running)
            ));
        }
        if !try_lock(g.relid) {
            return Some(locked_out());
        }
    }
    // Under AccessExclusiveLock: the table cannot be renamed, dropped or used meanwhile.
    // SAFETY: in the caller's transaction, under its guard, holding the lock on g.relid.
    match unsafe { recorded(&g) } {
        Recorded::Same => {
            // DROP TABLE and TRUNCATE also lock the table's indexes and TOAST table, which
            // any role can lock (pg_relation_size of the primary key in an open
            // transaction): taken here only if free at once too, so the drop never waits in
            // a lock queue holding the table's lock, with claimers queued behind it.
            if !try_lock_dependents(g.relid) {
                unlock(g.relid);
                return Some(locked_out());
            }
        }
        Recorded::Gone if g.n > 0 => {
            unlock(g.relid);
            change_row(
                "DELETE FROM dedup.generations AS g \
                  WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'retired'",
                g.n,
                "forgetting a dropped generation",
            );
            return Some(format!("forgot {name}: its table was dropped already"));
        }
        Recorded::Gone | Recorded::Other => {
            unlock(g.relid);
            let message = format!(
                "{name} is not {done}: it is not the table recorded in dedup.generations \
                 (relid {}); a superuser must check the schema dedup",
                u32::from(g.relid)
            );
            warning!("dedup: {message}");
            return Some(message);
        }
    }
    let kept = kept(&g);
    if g.n == 0 {
        exec(
            "TRUNCATE ONLY dedup.processed",
            &[],
            "truncating dedup.processed",
        );
        // Retired for good: it is never opened for claims again.
        change_row(
            "UPDATE dedup.generations AS g SET waits = 'truncated' \
              WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'retired'",
            g.n,
            "recording the truncation",
        );
    } else {
        exec(
            &format!("DROP TABLE dedup.{}", g.relname),
            &[],
            &format!("dropping {name}"),
        );
        change_row(
            "DELETE FROM dedup.generations AS g \
              WHERE g.n OPERATOR(pg_catalog.=) $1 AND g.state OPERATOR(pg_catalog.=) 'retired'",
            g.n,
            "forgetting a dropped generation",
        );
    }
    Some(format!("{done} {name}{kept}"))
}

/// How long the claims of retired generation `g` were kept, counted from their commits, as
/// its drop (or truncation) says it: every claim in it committed before its seal (the seal
/// waited for every transaction that could insert there), so each was kept at least now
/// less `sealed_at`; a claim of generation n >= 1 committed after its publication, so at
/// most now less `opened_at`. Generation 0 holds claims from before `use_generations()`:
/// at least only. Empty if the row has no seal time (it always has once retired).
fn kept(g: &Row) -> String {
    // A message only: a read that finds no row says nothing rather than fail the drop.
    let (least, most) = Spi::get_two_with_args::<f64, f64>(
        "SELECT pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() \
                    OPERATOR(pg_catalog.-) g.sealed_at), \
                pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() \
                    OPERATOR(pg_catalog.-) g.opened_at) \
           FROM dedup.generations AS g WHERE g.n OPERATOR(pg_catalog.=) $1",
        &[DatumWithOid::from(g.n)],
    )
    .unwrap_or((None, None));
    match (least, most) {
        (Some(least), _) if g.n == 0 => {
            format!(": its claims were kept at least {least:.0} s")
        }
        (Some(least), Some(most)) => {
            format!(": its claims were kept {least:.0} to {most:.0} s")
        }
        _ => String::new(),
    }
}

/// ACCESS EXCLUSIVE on `relid` if no one holds or waits for a lock in the way; never waits.
fn try_lock(relid: pg_sys::Oid) -> bool {
    // SAFETY: in the caller's transaction (the lock is its resource owner's until it ends);
    // ConditionalLockRelationOid returns false rather than wait, and raises an ERROR only
    // when the shared lock table is full, through the caller's guard.
    unsafe {
        pg_sys::ConditionalLockRelationOid(relid, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE)
    }
}

/// ACCESS EXCLUSIVE, each only if free at once, on the indexes of `relid`, its TOAST table
/// and the TOAST table's indexes; false (the ones taken released) if one is not free.
fn try_lock_dependents(relid: pg_sys::Oid) -> bool {
    let oids: Vec<pg_sys::Oid> = Spi::connect(|c| {
        let rows = c.select(
            "SELECT i.indexrelid FROM pg_catalog.pg_index AS i \
              WHERE i.indrelid OPERATOR(pg_catalog.=) $1 \
             UNION ALL \
             SELECT c.reltoastrelid FROM pg_catalog.pg_class AS c \
              WHERE c.oid OPERATOR(pg_catalog.=) $1 \
                AND c.reltoastrelid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid \
             UNION ALL \
             SELECT i.indexrelid FROM pg_catalog.pg_index AS i \
               JOIN pg_catalog.pg_class AS c \
                 ON i.indrelid OPERATOR(pg_catalog.=) c.reltoastrelid \
              WHERE c.oid OPERATOR(pg_catalog.=) $1",
            None,
            &[DatumWithOid::from(relid)],
        )?;
        let mut oids = Vec::new();
        for row in rows {
            if let Some(oid) = row.get::<pg_sys::Oid>(1)? {
                oids.push(oid);
            }
        }
        Ok::<_, pgrx::spi::Error>(oids)
    })
    .unwrap_or_else(|e| pgrx::error!("dedup: listing the indexes of a generation failed: {e}"));
    for (i, oid) in oids.iter().enumerate() {
        if !try_lock(*oid) {
            for taken in &oids[..i] {
                unlock(*taken);
            }
            return false;
        }
    }
    true
}

/// Release the lock of [`try_lock`] early (a table we leave alone), if this transaction
/// holds it.
fn unlock(relid: pg_sys::Oid) {
    let mode = pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE;
    // SAFETY: CheckRelationOidLockedByMe reads the local lock table only (orstronger =
    // false: that very mode); no ERROR.
    if unsafe { pg_sys::CheckRelationOidLockedByMe(relid, mode, false) } {
        // SAFETY: we hold it (try_lock); UnlockRelationOid releases one hold of it, a
        // WARNING at most if it were not held.
        unsafe { pg_sys::UnlockRelationOid(relid, mode) };
    }
}

/// What `relid` names now, compared with the row.
enum Recorded {
    /// The table dedup.<relname> itself, a plain table.
    Same,
    /// No relation has that OID, and no table dedup.<relname> exists.
    Gone,
    /// Something else (a restore gave the table a new OID, or the OID was reused).
    Other,
}

/// # Safety
///
/// In a transaction, under pgrx's guard (syscache lookups), holding a lock on `g.relid`
/// (so its name and schema cannot change meanwhile; taking it accepted invalidations).
unsafe fn recorded(g: &Row) -> Recorded {
    // SAFETY: the contract above. get_rel_name returns a palloc'd copy or NULL;
    // get_namespace_oid (missing_ok) and get_relname_relid return InvalidOid for what does
    // not exist; the C strings outlive the calls.
    let nsp = pg_sys::get_namespace_oid(c"dedup".as_ptr(), true);
    let name = pg_sys::get_rel_name(g.relid);
    if !name.is_null() {
        let same = nsp != pg_sys::InvalidOid
            && CStr::from_ptr(name).to_bytes() == g.relname.as_bytes()
            && pg_sys::get_rel_namespace(g.relid) == nsp
            && pg_sys::get_rel_relkind(g.relid) == pg_sys::RELKIND_RELATION as std::ffi::c_char;
        return if same {
            Recorded::Same
        } else {
            Recorded::Other
        };
    }
    let relname = CString::new(g.relname.as_str()).expect("no NUL in a generation's name");
    if nsp == pg_sys::InvalidOid
        || pg_sys::get_relname_relid(relname.as_ptr(), nsp) == pg_sys::InvalidOid
    {
        Recorded::Gone
    } else {
        Recorded::Other
    }
}

// ---- Wait lists -------------------------------------------------------------------------

/// The transactions a seal or a drop waits for: listed once, stored in the generation's
/// `waits` as "<postmaster start, µs>;<proc>:<lxid>,<proc>:<lxid>" (a virtual transaction
/// ID is only meaningful until the server restarts: a list from before is taken again).
struct Waits {
    started: i64,
    vxids: Vec<(i32, u32)>,
}

impl Waits {
    /// The virtual transactions (but ours) holding a lock on `relid` that conflicts with
    /// `mode`, as CREATE INDEX CONCURRENTLY's WaitForLockers lists them; prepared
    /// transactions included; with `inserters_only`, not an autovacuum worker's (see
    /// [`autovacuum`]). Takes no lock.
    fn list(relid: pg_sys::Oid, mode: u32, inserters_only: bool) -> Waits {
        // SET_LOCKTAG_RELATION (a macro): this database, the relation.
        let tag = pg_sys::LOCKTAG {
            // SAFETY: MyDatabaseId is set once the backend is connected.
            locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
            locktag_field2: relid.into(),
            locktag_field3: 0,
            locktag_field4: 0,
            locktag_type: pg_sys::LockTagType::LOCKTAG_RELATION as u8,
            locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
        };
        let mut count: std::ffi::c_int = 0;
        let mut vxids = Vec::new();
        // SAFETY: GetLockConflicts reads the lock table (and every backend's fast-path
        // slots) under the lock manager's LWLocks, released before it returns; it returns
        // `count` entries (then an invalid one) palloc'd in CurrentMemoryContext (a static
        // array in hot standby, where nothing calls this: step() returns first), read at
        // once. It leaves out this backend's own transaction. ERRORs (out of memory) go
        // through the caller's guard.
        unsafe {
            let array = pg_sys::GetLockConflicts(&tag, mode as pg_sys::LOCKMODE, &mut count);
            for i in 0..count.max(0) as usize {
                let (proc, lxid) = vxid::parts(&*array.add(i));
                if lxid != 0 && !(inserters_only && autovacuum(proc, lxid)) {
                    vxids.push((proc, lxid));
                }
            }
        }
        Waits {
            started: start_time(),
            vxids,
        }
    }

    fn text(&self) -> String {
        let list: Vec<String> = self.vxids.iter().map(|(p, l)| format!("{p}:{l}")).collect();
        format!("{};{}", self.started, list.join(","))
    }

    /// A stored list; None if there is none (or it is not one, as 'truncated').
    fn parse(s: &str) -> Option<Waits> {
        let (started, list) = s.split_once(';')?;
        let started = started.parse().ok()?;
        let mut vxids = Vec::new();
        for entry in list.split(',').filter(|e| !e.is_empty()) {
            let (proc, lxid) = entry.split_once(':')?;
            let lxid: u32 = lxid.parse().ok()?;
            if lxid == 0 {
                return None;
            }
            vxids.push((proc.parse().ok()?, lxid));
        }
        Some(Waits { started, vxids })
    }

    /// Taken since the postmaster started (a restart ended every transaction listed; a
    /// promoted standby's start differs too). Prepared transactions survive a restart, so
    /// an older list is taken again, not taken as done.
    fn this_run(&self) -> bool {
        self.started == start_time()
    }

    /// The listed transactions that have not ended yet.
    fn running(&self) -> Vec<(i32, u32)> {
        self.vxids
            .iter()
            .copied()
            .filter(|&(proc, lxid)| {
                // SAFETY: VirtualXactLock with wait = false checks the backend's fast-path
                // VXID (under its fpInfoLock), or for a transaction prepared since, its XID's
                // lock with a conditional LockAcquire released at once: it never waits.
                // true: the transaction has ended. lxid is valid (parse, list). An ERROR (a
                // full lock table) goes through the caller's guard.
                !unsafe { pg_sys::VirtualXactLock(vxid::make(proc, lxid), false) }
            })
            .collect()
    }
}

/// Whether the virtual transaction (`proc`, `lxid`) is an autovacuum worker's, still
/// running: it vacuums or analyzes the generation and inserts nothing, so the seal does not
/// wait for it. A generation is made without the vacuum its inserts would start
/// ([`create_generation`]), but an autoanalyze, an anti-wraparound vacuum or a vacuum its
/// owner turned back on still come, and one of a full generation can run for minutes, every
/// claim probing the generation's index until the seal (the benchmark's seal waited 11 s so,
/// when inserts still started one). A
/// transaction that ended since it was listed may be left out as well; one still running
/// is left out only if its own process is an autovacuum worker.
///
/// # Safety
///
/// On the backend's main thread, connected to shared memory.
unsafe fn autovacuum(proc: i32, lxid: u32) -> bool {
    // SAFETY: the contract above is proc_of's; `p` is NULL or a PGPROC of the shared array,
    // whose lxid and statusFlags are read without ProcArrayLock: each is one aligned load.
    // While the listed transaction runs, the process in `p` is the one running it, and an
    // autovacuum worker's PROC_IS_AUTOVACUUM is set when it starts and kept until it exits;
    // if the slot's transaction is another one, the listed one has ended.
    let p = vxid::proc_of(proc);
    !p.is_null()
        && vxid::lxid_of(p) == lxid
        && u32::from(std::ptr::read_volatile(std::ptr::addr_of!(
            (*p).statusFlags
        ))) & pg_sys::PROC_IS_AUTOVACUUM
            != 0
}

/// The postmaster's start time (µs since 2000).
fn start_time() -> i64 {
    // SAFETY: a plain read of a global set by the postmaster before any backend started.
    unsafe { pg_sys::PgStartTime }
}

/// Who holds a listed transaction, for the log.
enum Holder {
    Pid(i32),
    Prepared(pg_sys::TransactionId),
    /// Ended between the poll and this look.
    Unknown,
}

fn holder(proc: i32, lxid: u32) -> Holder {
    if proc < 0 {
        // A prepared transaction recovered at startup: its lxid is its XID.
        return Holder::Prepared(lxid.into());
    }
    // SAFETY: proc_of returns a PGPROC of the shared array (valid for the server's life)
    // or NULL; pid and lxid are read without a lock, for a message only: a backend that
    // moves on meanwhile is told as prepared or unknown.
    unsafe {
        let p = vxid::proc_of(proc);
        if !p.is_null() && vxid::lxid_of(p) == lxid {
            let pid = std::ptr::read_volatile(std::ptr::addr_of!((*p).pid));
            if pid != 0 {
                return Holder::Pid(pid);
            }
        }
        // Not that backend's transaction any more, yet not ended: prepared since.
        let mut more = false;
        let xid = unguarded::TwoPhaseGetXidByVirtualXID(vxid::make(proc, lxid), &mut more);
        if xid == pg_sys::InvalidTransactionId {
            Holder::Unknown
        } else {
            Holder::Prepared(xid)
        }
    }
}

/// "2 transactions (pids 123, 456; prepared transaction 'x')".
fn describe(running: &[(i32, u32)]) -> String {
    let mut pids = Vec::new();
    let mut others = Vec::new();
    for &(proc, lxid) in running {
        match holder(proc, lxid) {
            Holder::Pid(pid) => pids.push(pid.to_string()),
            Holder::Prepared(xid) => others.push(match gid_of(xid) {
                Some(gid) => format!("prepared transaction '{}'", gid.replace('\'', "''")),
                None => format!("prepared transaction of xid {}", xid.into_inner()),
            }),
            Holder::Unknown => others.push("one that just ended".to_string()),
        }
    }
    let mut who = Vec::new();
    if !pids.is_empty() {
        let s = if pids.len() == 1 { "" } else { "s" };
        who.push(format!("pid{s} {}", pids.join(", ")));
    }
    who.extend(others);
    let s = if running.len() == 1 { "" } else { "s" };
    format!("{} transaction{s} ({})", running.len(), who.join("; "))
}

/// The gid of the prepared transaction `xid`, if it is still prepared.
fn gid_of(xid: pg_sys::TransactionId) -> Option<String> {
    Spi::connect(|c| {
        let rows = c.select(
            "SELECT p.gid FROM pg_catalog.pg_prepared_xacts AS p \
              WHERE p.transaction OPERATOR(pg_catalog.=) $1::pg_catalog.xid",
            None,
            &[DatumWithOid::from(xid.into_inner().to_string())],
        )?;
        let mut gid = None;
        for row in rows {
            gid = row.get::<String>(1)?;
        }
        Ok::<_, pgrx::spi::Error>(gid)
    })
    .ok()
    .flatten()
}

/// VirtualTransactionId: 17 renamed `backendId` to `procNumber` (and moved PGPROC's lxid
/// into its `vxid`); 15 and 16 find a backend's PGPROC with BackendIdGetProc, which
/// pgrx-pg-sys does not bind, 17 and 18 with ProcNumberGetProc.
#[cfg(any(feature = "pg15", feature = "pg16"))]
mod vxid {
    use pgrx::pg_sys;

    pub(super) fn parts(v: &pg_sys::VirtualTransactionId) -> (i32, u32) {
        (v.backendId, v.localTransactionId)
    }

    pub(super) fn make(proc: i32, lxid: u32) -> pg_sys::VirtualTransactionId {
        pg_sys::VirtualTransactionId {
            backendId: proc,
            localTransactionId: lxid,
        }
    }

    /// # Safety
    ///
    /// On the backend's main thread, connected to shared memory.
    pub(super) unsafe fn proc_of(proc: i32) -> *mut pg_sys::PGPROC {
        // SAFETY: BackendIdGetProc returns NULL for an ID out of range (see unguarded).
        super::unguarded::BackendIdGetProc(proc)
    }

    /// # Safety
    ///
    /// `p` is a PGPROC of the shared array.
    pub(super) unsafe fn lxid_of(p: *const pg_sys::PGPROC) -> u32 {
        // SAFETY: an aligned u32 of shared memory, read without its lock (for a message, and
        // for `autovacuum`, which compares it with a listed transaction's).
        std::ptr::read_volatile(std::ptr::addr_of!((*p).lxid))
    }
}

#[cfg(any(feature = "pg17", feature = "pg18"))]
mod vxid {
    use pgrx::pg_sys;

    pub(super) fn parts(v: &pg_sys::VirtualTransactionId) -> (i32, u32) {
        (v.procNumber, v.localTransactionId)
    }

    pub(super) fn make(proc: i32, lxid: u32) -> pg_sys::VirtualTransactionId {
        pg_sys::VirtualTransactionId {
            procNumber: proc,
            localTransactionId: lxid,
        }
    }

    /// # Safety
    ///
    /// On the backend's main thread, connected to shared memory.
    pub(super) unsafe fn proc_of(proc: i32) -> *mut pg_sys::PGPROC {
        // SAFETY: ProcNumberGetProc returns NULL for a number out of range or a PGPROC
        // without a process; no ERROR.
        pg_sys::ProcNumberGetProc(proc)
    }

    /// # Safety
    ///
    /// `p` is a PGPROC of the shared array.
    pub(super) unsafe fn lxid_of(p: *const pg_sys::PGPROC) -> u32 {
        // SAFETY: an aligned u32 of shared memory, read without its lock (for a message, and
        // for `autovacuum`, which compares it with a listed transaction's).
        std::ptr::read_volatile(std::ptr::addr_of!((*p).vxid.lxid))
    }
}

/// Functions pgrx-pg-sys 0.18.1 does not bind, declared from the headers; neither can
/// raise an ERROR, so they are called without pgrx's guard.
mod unguarded {
    use pgrx::pg_sys;
    // SAFETY: each prototype is copied from the headers of the majors it is declared for
    // (storage/sinvaladt.h:34 in 15 and 16; access/twophase.h:37 in 15 to 18) and the
    // symbols are exported by the server.
    extern "C" {
        /// The PGPROC of a backend ID, or NULL (out of range, or no backend there): takes
        /// SInvalWriteLock shared, reads one array entry, releases it; no ereport.
        #[cfg(any(feature = "pg15", feature = "pg16"))]
        pub fn BackendIdGetProc(backend_id: std::ffi::c_int) -> *mut pg_sys::PGPROC;
        /// The XID of the prepared transaction that was the virtual transaction `vxid`
        /// (InvalidTransactionId if none); takes TwoPhaseStateLock shared and scans the
        /// prepared transactions; no ereport. `have_more` must point to a false bool.
        pub fn TwoPhaseGetXidByVirtualXID(
            vxid: pg_sys::VirtualTransactionId,
            have_more: *mut bool,
        ) -> pg_sys::TransactionId;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(secs: i64) -> Series {
        Series {
            retention: pgrx::datum::Interval::new(0, 0, secs * 1_000_000).unwrap(),
            span: i128::from(secs) * 1_000_000,
            secs: secs as f64,
        }
    }

    /// The retentions in force: `dedup.retention` of `default` s, the scopes' own.
    fn retention(default: i64, scopes: &[(&str, i64)]) -> Retention {
        let mut all: Vec<Series> = scopes
            .iter()
            .map(|(_, s)| *s)
            .filter(|s| *s != default)
            .map(series)
            .collect();
        all.sort_by_key(|s| std::cmp::Reverse(s.span));
        all.dedup_by_key(|s| s.span);
        all.push(series(default));
        Retention {
            longest: all.iter().map(|s| s.secs).fold(0.0, f64::max),
            default: series(default),
            series: all,
            scopes: scopes
                .iter()
                .map(|(n, s)| (n.to_string(), (*s as f64, i128::from(*s) * 1_000_000)))
                .collect(),
        }
    }

    /// A current generation `n` of the series of `secs` s with routes `routes` ("*": NULL).
    fn current(n: i32, secs: i64, routes: &[&str]) -> Row {
        Row {
            n,
            relname: super::super::relname_of(n),
            relid: pg_sys::Oid::from(16384 + n as u32),
            state: CURRENT.to_string(),
            waits: None,
            mine: false,
            span: Some(i128::from(secs) * 1_000_000),
            series_secs: Some(secs as f64),
            age: 0.0,
            sealed_for: None,
            scopes: None,
            routes: Some(
                routes
                    .iter()
                    .map(|r| (*r != "*").then(|| r.to_string()))
                    .collect(),
            ),
        }
    }

    type Columns = Vec<(i32, Vec<Option<String>>)>;

    /// Apply `route_move` as `move_routes` does (the generation left becomes sealing; its
    /// successor, n + 100, takes its routes if its series is in force), until none is due,
    /// checking at each move that every scope whose route changed left `from` (the one
    /// generation published away from); the moves made (from which generation) and the
    /// routes at the end, by n.
    fn settle(mut rows: Vec<Row>, r: &Retention) -> (Vec<i32>, Columns) {
        let mut moves = Vec::new();
        while let Some(RouteMove { from, after, .. }) = route_move(&rows, r) {
            assert!(moves.len() < 10, "no end of moves: {moves:?}");
            moves.push(from);
            let before = Routes::published(&rows).unwrap();
            let g = rows.iter().position(|g| g.n == from).unwrap();
            rows[g].state = SEALING.to_string();
            let successor = r.series_of(rows[g].span).map(|_| {
                let mut s = rows[g].clone();
                s.n = from + 100;
                s.state = CURRENT.to_string();
                s
            });
            let mut after = after;
            // `from` in `after` stands for its successor.
            if after.default == from {
                after.default = from + 100;
            }
            for n in after.named.values_mut() {
                if *n == from {
                    *n = from + 100;
                }
            }
            let names: Vec<String> = before
                .named
                .keys()
                .chain(after.named.keys())
                .cloned()
                .chain(["not named".to_string()])
                .collect();
            for scope in &names {
                let (was, is) = (before.of(scope), after.of(scope));
                assert!(
                    was == is || was == from,
                    "{scope} moved from generation {was} to {is}, not from {from}"
                );
            }
            rows.extend(successor);
            for g in rows.iter_mut().filter(|g| g.state == CURRENT) {
                g.routes = Some(after.column(g.n));
            }
            // Nothing is being sealed at the next step.
            rows.iter_mut()
                .filter(|g| g.state == SEALING)
                .for_each(|g| g.state = "sealed".to_string());
        }
        let routes = rows
            .iter()
            .filter(|g| g.state == CURRENT)
            .map(|g| (g.n, g.routes.clone().unwrap_or_default()))
            .collect();
        (moves, routes)
    }

    fn col(names: &[&str]) -> Vec<Option<String>> {
        names
            .iter()
            .map(|r| (*r != "*").then(|| r.to_string()))
            .collect()
    }

    #[test]
    fn a_retention_without_a_series_goes_to_the_shortest_longer_one_else_the_longest() {
        let spans = [(0, 60), (1, 3600), (2, 30)];
        let at = |secs: i128| nearest(&spans, secs);
        assert_eq!(at(60), Some(0), "its own series");
        assert_eq!(at(10), Some(2), "the shortest longer: 30 s");
        assert_eq!(at(45), Some(0), "the shortest longer: 60 s");
        assert_eq!(at(86_400), Some(1), "none longer: the longest");
        assert_eq!(nearest(&[], 60), None, "no series");
    }

    #[test]
    fn nothing_moves_while_the_routes_are_as_the_retentions_have_them() {
        let r = retention(60, &[("short", 2)]);
        let rows = vec![current(1, 60, &["*"]), current(2, 2, &["short"])];
        assert_eq!(route_move(&rows, &r), None);
        // A scope whose retention is dedup.retention's is not named.
        let r = retention(60, &[("same", 60)]);
        assert_eq!(route_move(&[current(1, 60, &["*"])], &r), None);
    }

    #[test]
    fn a_scope_that_leaves_publishes_away_from_the_generation_it_leaves() {
        // `short` gets a retention of its own: the default's generation is left.
        let r = retention(60, &[("short", 2)]);
        let rows = vec![current(1, 60, &["*"]), current(2, 2, &[])];
        let (moves, routes) = settle(rows, &r);
        assert_eq!(moves, vec![1]);
        assert_eq!(routes, vec![(2, col(&["short"])), (101, col(&["*"]))]);
        // Its retention reset: the 2 s series is no longer in force, no successor.
        let r = retention(60, &[]);
        let rows = vec![current(2, 2, &["short"]), current(101, 60, &["*"])];
        let (moves, routes) = settle(rows, &r);
        assert_eq!(moves, vec![2]);
        assert_eq!(routes, vec![(101, col(&["*"]))]);
    }

    #[test]
    fn two_scopes_that_swap_series_take_two_publications() {
        let r = retention(60, &[("a", 30), ("b", 10)]);
        // a is at the 10 s series, b at the 30 s one: each must leave its generation.
        let rows = vec![
            current(1, 60, &["*"]),
            current(2, 30, &["b"]),
            current(3, 10, &["a"]),
        ];
        let (moves, routes) = settle(rows, &r);
        assert_eq!(moves, vec![2, 3]);
        assert_eq!(
            routes,
            vec![(1, col(&["*"])), (102, col(&["a"])), (103, col(&["b"]))]
        );
    }

    #[test]
    fn the_default_moves_with_every_scope_not_named() {
        // dedup.retention changed from 60 s to 30 s; scope `keep` still has 60 s.
        let r = retention(30, &[("keep", 60)]);
        let rows = vec![current(1, 60, &["*"]), current(2, 30, &[])];
        let (moves, routes) = settle(rows, &r);
        assert_eq!(moves, vec![1]);
        // The 60 s series stays in force for `keep`, named at its successor.
        assert_eq!(routes, vec![(2, col(&["*"])), (101, col(&["keep"]))]);
        // And with no scope of 60 s left, the old default is no longer in force.
        let r = retention(30, &[]);
        let rows = vec![current(1, 60, &["*"]), current(2, 30, &[])];
        let (moves, routes) = settle(rows, &r);
        assert_eq!(moves, vec![1]);
        assert_eq!(routes, vec![(2, col(&["*"]))]);
    }

    #[test]
    fn a_scope_goes_nowhere_its_claims_were_since_that_generation_became_current() {
        // Any sequence of retentions: after each settle, every current generation that a
        // scope was routed to and left has been published away from, so a scope never
        // returns to a generation n it left.
        let steps: &[&[(&str, i64)]] = &[
            &[("s", 2)],
            &[("s", 60)],
            &[("s", 2), ("t", 2)],
            &[("t", 30)],
            &[("s", 30)],
            &[],
        ];
        let mut rows = vec![current(1, 60, &["*"])];
        let mut left: std::collections::HashSet<(String, i32)> = Default::default();
        let mut seen: std::collections::HashMap<String, i32> = Default::default();
        for (k, scopes) in steps.iter().enumerate() {
            let r = retention(60, scopes);
            // The first generation of each new series, as publish opens it.
            let mut next = rows.iter().map(|g| g.n).max().unwrap() + 1000;
            for s in &r.series {
                if !rows
                    .iter()
                    .any(|g| g.state == CURRENT && g.span == Some(s.span))
                {
                    rows.push(current(next, s.secs as i64, &[]));
                    next += 1;
                }
            }
            let (_, routes) = settle(rows.clone(), &r);
            // Rebuild the rows as settle left them (its successors are n + 100).
            let mut after: Vec<Row> = Vec::new();
            for (n, names) in &routes {
                let secs = rows
                    .iter()
                    .find(|g| g.n == *n || g.n + 100 == *n)
                    .and_then(|g| g.series_secs)
                    .unwrap() as i64;
                let mut g = current(*n, secs, &[]);
                g.routes = Some(names.clone());
                after.push(g);
            }
            let published = Routes::published(&after).unwrap();
            // Settled: the routes are where the retentions want them.
            assert_eq!(Some(&published), r.routes(&after).as_ref(), "step {k}");
            for scope in ["s", "t", "u"] {
                let n = published.of(scope);
                assert!(
                    !left.contains(&(scope.to_string(), n)),
                    "step {k}: {scope} routed back to generation {n}, which it left"
                );
                if let Some(old) = seen.insert(scope.to_string(), n) {
                    if old != n {
                        left.insert((scope.to_string(), old));
                    }
                }
            }
            rows = after;
        }
    }
}
