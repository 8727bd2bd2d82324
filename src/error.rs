//! The errors dedup raises for an argument or the state of a job: one SQLSTATE, a message
//! naming the argument, and a hint. (A failure that should not happen, such as a read of
//! dedup's own tables that failed, is raised where it happens with `pgrx::error!`: XX000.)
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// Longest job id accepted, in bytes. A btree entry holds at most about 2.7 kB on an
/// 8 kB page; with this limit a claim row is never compressed or moved to TOAST.
pub const MAX_JOB_ID_BYTES: usize = 1024;
/// Longest scope accepted, in bytes.
pub const MAX_SCOPE_BYTES: usize = 128;
/// Longest payload fingerprint accepted, in bytes (a hex SHA-512 is 128).
pub const MAX_FINGERPRINT_BYTES: usize = 256;

fn raise(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    ErrorReport::new(code, message, "dedup")
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

pub fn null_argument(func: &str, arg: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{func}: {arg} must not be NULL"),
        if matches!(arg, "stream" | "partition" | "position") {
            "Pass the stream's name, the partition's number and the entry's position."
        } else if arg == "scope" && func == "dedup.try_claim" {
            "Omit the argument to use the scope 'default', or pass a scope name."
        } else if arg == "scope" {
            "Pass a scope name; the scope of claims made without one is 'default'."
        } else if matches!(arg, "func" | "event" | "processed_at") {
            "This internal function is called by dedup's own functions with a constant here: \
             call the public function (dedup.try_claim, dedup.lease, dedup.advance) instead."
        } else if arg == "fingerprints" {
            "Pass one fingerprint per job id, in the same order (NULL for a job without one), or \
             leave the argument out."
        } else {
            "A job without an id cannot be deduplicated: pass the message's unique id (a NULL \
             claim read as \"not claimed\" would skip the job)."
        },
    )
}

pub fn not_positive(func: &str, arg: &str, value: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{func}: {arg} must be positive, not {value}"),
        match arg {
            "max_rows" => "Pass NULL (the default) to prune every expired claim.",
            _ => "Pass NULL to remove the scope's own retention and use dedup.retention.",
        },
    )
}

/// The one check of a text argument's length: 1 to `max` bytes, else 22023 (empty) or
/// 22001 (longer), with the hint of `arg` (a name such as `scope`, or an element such as
/// `job_ids[3]`, made only when the check fails). Its NULL is checked where the argument is
/// unwrapped ([`null_argument`]), in the order the function documents.
pub fn check_length<A: AsRef<str>>(func: &str, arg: impl FnOnce() -> A, value: &str, max: usize) {
    if value.is_empty() {
        empty_argument(func, arg().as_ref());
    }
    if value.len() > max {
        too_long(func, arg().as_ref(), value.len(), max);
    }
}

pub fn empty_argument(func: &str, arg: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{func}: {arg} must not be empty"),
        "Pass a non-empty value; job ids and scopes are compared byte for byte.",
    )
}

pub fn too_long(func: &str, arg: &str, len: usize, max: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_STRING_DATA_RIGHT_TRUNCATION,
        format!("{func}: {arg} is {len} bytes long, longer than the limit of {max} bytes"),
        if arg == "scope" {
            "Use a shorter scope name, e.g. the queue or handler name."
        } else if arg == "fingerprint" {
            "Pass a hash of the payload, e.g. encode(sha256(convert_to(payload, 'UTF8')), 'hex'), \
             not the payload itself."
        } else if arg == "stream" {
            "Use a shorter stream name, e.g. the topic's or the queue's name."
        } else {
            "Claim a digest of a long key instead, e.g. encode(sha256(convert_to(key, 'UTF8')), 'hex'), \
             which is 64 bytes."
        },
    )
}

pub fn needs_update(func: &str, what: &str, version: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("{func}: {what} needs version {version} of the extension in this database"),
        "Run ALTER EXTENSION dedup UPDATE.",
    )
}

pub fn leased(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: the job is held by a lease (dedup.lease), not claimed"),
        "Use one API per scope: dedup.try_claim for effects in this database, dedup.lease for \
         external effects.",
    )
}

pub fn not_claimed_here(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: the job was not claimed by this transaction"),
        "Call it in the transaction whose dedup.try_claim returned true, after the effect; a \
         lease stores its result with dedup.complete.",
    )
}

pub fn on_standby(func: &str) -> ! {
    let refused = WriteRefused::of(func);
    raise(
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        format!("{func}: cannot {} on a standby server", refused.verb),
        refused.standby_hint,
    )
}

pub fn read_only(func: &str) -> ! {
    let refused = WriteRefused::of(func);
    raise(
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        format!("{func}: cannot {} in a read-only transaction", refused.verb),
        refused.read_only_hint,
    )
}

/// What `func` cannot do where writes are refused, and what to do instead.
struct WriteRefused {
    verb: &'static str,
    read_only_hint: &'static str,
    standby_hint: &'static str,
}

impl WriteRefused {
    fn of(func: &str) -> Self {
        match func {
            "dedup.prune" => WriteRefused {
                verb: "prune",
                read_only_hint: "Pruning deletes claims: call dedup.prune() in a READ WRITE \
                                 transaction (check default_transaction_read_only and SET \
                                 TRANSACTION).",
                standby_hint: "Claims are pruned on the primary (by its worker, or dedup.prune() \
                               there); the deletions reach the standby by replication.",
            },
            "dedup.advance" => WriteRefused {
                verb: "advance",
                read_only_hint: "Run dedup.advance and the batch's effects in a READ WRITE \
                                 transaction (check default_transaction_read_only and SET \
                                 TRANSACTION).",
                standby_hint: "Raising a mark is a write: connect the consumer to the primary, \
                               e.g. with target_session_attrs=read-write in its connection string.",
            },
            _ => WriteRefused {
                verb: "claim",
                read_only_hint: "Run the claim and its effect in a READ WRITE transaction \
                                 (check default_transaction_read_only and SET TRANSACTION).",
                standby_hint: "A claim is a write: connect the consumer to the primary, \
                               e.g. with target_session_attrs=read-write in its connection string.",
            },
        }
    }
}

pub fn parallel_mode(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
        format!("{func}: cannot claim during a parallel operation"),
        "Call it from a plain statement, not from a parallel query.",
    )
}

pub fn warn_outside_transaction(func: &str) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!(
            "{func} was called outside a transaction block: the claim has committed on its own"
        ),
        "dedup",
    )
    .set_detail(
        "If the job's effect then fails or its process dies, the job stays claimed but is never \
         done (at-most-once).",
    )
    .set_hint(
        "Call it between BEGIN and COMMIT, in the transaction of the effect. If the claim and \
         the effect are one statement on purpose, SET dedup.warn_outside_transaction = off.",
    )
    .report(PgLogLevel::WARNING);
}

pub fn serialization_failure(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        format!("{func}: could not serialize access due to a concurrent claim of the same job"),
        "A transaction that committed after this transaction's snapshot claimed the job. \
         Retry the whole transaction: the retry finds the claim (try_claim returns false, \
         dedup.lease answers busy or done).",
    )
}

pub fn table_missing() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        "dedup: table dedup.processed does not exist".to_string(),
        "Is the extension installed in this database (\\dx dedup)? Its table must not be \
         dropped or renamed.",
    )
}

/// A table named dedup.processed that is not the extension's: no claim is written into it
/// (security::a_look_alike_claim_table_is_refused).
pub fn not_the_extensions_table() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "dedup: dedup.processed is not the table of the extension dedup".to_string(),
        "Someone replaced the schema dedup or its table (a schema dedup renamed, a look-alike \
         made): see what the schema holds and who owns it (docs/operations.md, Security \
         model); the extension's own schema is pg_extension.extnamespace.",
    )
}

pub fn unexpected_layout(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: dedup.processed does not have the columns of any version of dedup"),
        "dedup.processed must not be altered by hand: its columns are the extension's.",
    )
}

pub fn not_a_heap_table(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: dedup.processed is not a plain heap table (partitioned, or of another access method)"),
        "dedup.processed must stay the table the extension made: claims are written into its \
         heap and its primary key directly.",
    )
}

pub fn warn_short_retention(what: &str, seconds: i64, shortest: i32, shortest_is: &str) {
    let than = if shortest_is == "a minute" {
        "a minute".to_string()
    } else {
        format!("{shortest_is} ({shortest} s)")
    };
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("{what} of {seconds} s is shorter than {than}"),
        "dedup",
    )
    .set_detail(
        "A duplicate that arrives after its claim was pruned runs again: retention must be \
         longer than the latest a duplicate can arrive.",
    )
    .set_hint(
        "Size it from the longest redelivery or replay horizon: producer retries, the \
         visibility or claim timeout, replays from stream history or a dead-letter queue.",
    )
    .report(PgLogLevel::WARNING);
}

/// A retention positive with 30-day months but not in every month ('1 month -29 days' is
/// -1 day after a February of 28 days): its cutoff would be in the future then, and every
/// claim of the scope expired (retention::a_retention_positive_only_in_some_months_is_refused).
pub fn retention_not_positive_every_month(func: &str, retention: &str, shortest: f64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!(
            "{func}: retention must be positive whatever a month's length, not {retention} \
             ({shortest} s in the shortest month)"
        ),
        "A month is 28 to 31 days long: write the retention without negative parts, \
         e.g. '30 days' or '1 month'.",
    )
}

/// A retention whose horizon is too many transactions back to compare with a claim's 32-bit
/// xmin: its claims are kept, not pruned, until it is shorter (a claim is pruned only once
/// the horizon shows it was visible a whole retention ago).
pub fn warn_horizon_too_old(what: &str) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("dedup: no claim under {what} can be pruned now"),
        "dedup",
    )
    .set_detail(
        "A claim is pruned once the prune pass a whole retention ago saw its transaction \
         ended; that pass was two billion transactions ago or more, too far back to compare.",
    )
    .set_hint(
        "Shorten the retention so that it spans fewer transactions, or prune more often; \
         the claims are kept meanwhile.",
    )
    .report(PgLogLevel::WARNING);
}

/// The library is preloaded but `dedup.expired_memory` is 0: no summaries of pruned claims.
pub fn expired_memory_off(func: &str) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("{func}: dedup.expired_memory is 0: pruned claims are not remembered"),
        "dedup",
    )
    .set_detail("Copies that run again after their claim expired are not counted.")
    .set_hint(
        "Set dedup.expired_memory (8MB by default) in postgresql.conf and restart the server.",
    )
    .report(PgLogLevel::WARNING);
}

/// `dedup.generation_summaries()` with `dedup.generation_memory = 0`.
pub fn generation_memory_off(func: &str) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("{func}: dedup.generation_memory is 0: sealed generations are not summarised"),
        "dedup",
    )
    .set_detail("A claim probes the index of every sealed generation.")
    .set_hint(
        "Set dedup.generation_memory (32MB by default) in postgresql.conf and restart the server.",
    )
    .report(PgLogLevel::WARNING);
}

/// `dedup.processed` is a Citus table, but not one distributed by job_id.
pub fn not_hash_distributed(partmethod: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "dedup: dedup.processed is a Citus table that is not distributed by job_id (partmethod {partmethod})"
        ),
        "Claims are routed only on a hash-distributed claim table: run \
         SELECT undistribute_table('dedup.processed') on the coordinator, then SELECT dedup.distribute().",
    )
}

/// A claim on a Citus worker whose claim table is not distributed: it would stay there.
pub fn worker_not_distributed(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "{func}: this node is a Citus worker and dedup.processed is not distributed: \
             a claim here would be seen by no other node"
        ),
        "Run SELECT dedup.distribute() on the coordinator (docs/citus.md), or claim on the coordinator.",
    )
}

/// More job ids in one batch than a call takes.
pub fn batch_too_large(func: &str, len: usize, max: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("{func}: {len} job ids in one call, more than the limit of {max}"),
        "Claim the batch in several calls of at most that many ids, each call's ids taken in \
         order from the whole batch sorted by their bytes (then two transactions splitting \
         overlapping batches still claim in one order and cannot deadlock each other).",
    )
}

/// A partition or position below zero.
pub fn negative(func: &str, arg: &str, value: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{func}: {arg} must not be negative, not {value}"),
        if arg == "position" {
            "Pass the entry's position in the partition (a Kafka offset, or a stream entry id \
             mapped to a bigint, see the docs); positions start at 0."
        } else {
            "Pass the partition's number, from 0."
        },
    )
}

/// dedup.advance or dedup.position on a Citus worker.
pub fn offsets_on_worker(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: this node is a Citus worker; the positions of partitions live on the coordinator"),
        "Call dedup.advance and dedup.position on the coordinator (in the transaction of the effects, \
         which may be distributed tables).",
    )
}

/// Parallel arrays of different lengths.
pub fn lengths_differ(func: &str, ids: usize, fingerprints: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!(
            "{func}: fingerprints has {fingerprints} element{}, job_ids {ids}",
            if fingerprints == 1 { "" } else { "s" }
        ),
        "Pass one fingerprint per job id, in the same order (NULL for a job without one).",
    )
}

/// A claim through Citus whose INSERT met a claim of the job each of its `tries` times, and
/// each time found it gone when it read it (deleted and committed in between, over and
/// over): nothing was claimed, and `false` would say the job was done.
pub fn claim_kept_changing(func: &str, scope: &str, job_id: &str, tries: u32) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        format!(
            "{func}: the claim of job '{}' in scope '{}' was made and removed again {tries} \
             times while this call looked at it; nothing was claimed",
            job_id.replace('\'', "''"),
            scope.replace('\'', "''")
        ),
        "Retry the whole transaction: another session is leasing and releasing (or \
         forgetting) this job over and over.",
    )
}

/// `dedup._count` with an event it does not count (it is called by dedup's own lease and
/// offset functions, with a constant event).
pub fn unknown_event(event: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("dedup._count: unknown event {event:?}"),
        "The events are acquired, done, busy, fingerprint_mismatch, advance and stale; \
         dedup's own functions call dedup._count, not applications.",
    )
}

/// `dedup.use_generations()` (or a claim in a database that uses generations) without the
/// library in `shared_preload_libraries`: the epoch that tells a claim its generations
/// changed lives in shared memory.
pub fn generations_need_preload(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: generations need dedup in shared_preload_libraries"),
        "Add dedup to shared_preload_libraries in postgresql.conf and restart the server: a \
         claim learns that its generations changed from a counter in shared memory.",
    )
}

/// A claim or a lease in the transaction that changed `dedup.generations`.
pub fn claim_while_publishing(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: this transaction changed the generations (rotate_generations, use_generations)"),
        "Commit the change first: its new generation is known to other claimers only from its \
         commit, so a claim made before then could be granted twice. Claim in another \
         transaction.",
    )
}

/// `dedup._rotate` called by a session, not by the background worker.
pub fn worker_only(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("{func} is the background worker's own: no session may call it"),
        "Grant EXECUTE on it to dedup.prune_role and let the worker rotate, or rotate by hand \
         as a superuser with dedup.rotate_generations().",
    )
}

/// `dedup.use_generations()` on Citus.
pub fn generations_on_citus(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("{func}: generations are not available on Citus yet"),
        "Distributed claim tables keep today's retention (batched deletes on each node).",
    )
}

/// `dedup.use_generations()` a second time.
pub fn generations_already(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: this database uses generations already"),
        "See dedup.generations; the background worker rotates them (or call \
         dedup.rotate_generations()).",
    )
}

/// `dedup.use_generations()` or `dedup.rotate_generations()` by a role that is not a
/// superuser.
pub fn generations_superuser(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("{func}: only a superuser may change the generations"),
        "Run it as a superuser; the background worker rotates generations on its own.",
    )
}

/// `dedup.rotate_generations()` in a database that does not use generations.
pub fn generations_not_in_use(func: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{func}: this database does not use generations"),
        "Turn them on with SELECT dedup.use_generations().",
    )
}
