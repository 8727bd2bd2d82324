//! `#[pg_test]` unit tests. Each runs in one transaction of the test server, rolled back
//! afterwards, on its own connection; anything that needs several sessions, a crash or a
//! restart lives in `pg_test/`.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use super::*;
    use pgrx::pg_sys;
    use pgrx::pg_sys::panic::CaughtError;

    fn claim(sql: &str) -> bool {
        Spi::get_one::<bool>(sql)
            .expect("query failed")
            .expect("try_claim returned NULL")
    }

    /// Run `sql` in a subtransaction; return the SQLSTATE, message and hint of the error it
    /// raised, or None if it succeeded.
    fn error_of(sql: &str) -> Option<(String, String, String)> {
        // SAFETY: runs inside a #[pg_test] (a #[pg_extern] in the test's transaction, on the
        // backend's main thread), as PL/pgSQL's exception blocks do: the memory context and
        // resource owner are saved, BeginInternalSubTransaction (which can raise an ERROR
        // through the test's pgrx guard) starts a subtransaction, the PgTry catches any
        // error of `sql` (pgrx has already copied it into Rust strings and flushed
        // PostgreSQL's error state), RollbackAndReleaseCurrentSubTransaction or
        // ReleaseCurrentSubTransaction ends it (freeing its memory and resources), and the
        // saved context and owner, which belong to the outer transaction and outlive the
        // subtransaction, are restored.
        unsafe {
            let cxt = pg_sys::CurrentMemoryContext;
            let owner = pg_sys::CurrentResourceOwner;
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            let caught = PgTryBuilder::new(|| {
                Spi::run(sql).expect("SPI failed");
                None
            })
            .catch_others(|e| match e {
                CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => Some((
                    sqlstate(r.sql_error_code() as i32),
                    r.message().to_string(),
                    r.hint().unwrap_or_default().to_string(),
                )),
                CaughtError::RustPanic { ereport, .. } => {
                    Some(("panic".into(), ereport.message().to_string(), String::new()))
                }
            })
            .execute();
            if caught.is_some() {
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
            } else {
                pg_sys::ReleaseCurrentSubTransaction();
            }
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::CurrentResourceOwner = owner;
            caught
        }
    }

    /// Run `sql`, which must fail with SQLSTATE `state` and a message containing `words`;
    /// returns the message and hint.
    fn expect_error(sql: &str, state: &str, words: &str) -> (String, String) {
        let Some((got_state, message, hint)) = error_of(sql) else {
            panic!("{sql} did not fail");
        };
        assert_eq!(got_state, state, "{sql}: {message}");
        assert!(
            message.contains(words),
            "{sql}: message {message:?} lacks {words:?}"
        );
        (message, hint)
    }

    /// The five-character SQLSTATE of a packed error code.
    fn sqlstate(code: i32) -> String {
        (0..5)
            .map(|i| (((code >> (6 * i)) & 0x3f) as u8 + b'0') as char)
            .collect()
    }

    #[pg_test]
    fn first_claim_wins_second_is_a_duplicate() {
        assert!(claim("SELECT dedup.try_claim('job-1')"));
        assert!(!claim("SELECT dedup.try_claim('job-1')"));
        // Same job id in another scope is another job.
        assert!(claim("SELECT dedup.try_claim('job-1', 'payments')"));
        assert!(!claim("SELECT dedup.try_claim('job-1', 'payments')"));
        // The default scope is called 'default'.
        assert!(!claim("SELECT dedup.try_claim('job-1', 'default')"));
    }

    #[pg_test]
    fn bigint_and_its_decimal_text_are_one_job() {
        assert!(claim("SELECT dedup.try_claim(42::bigint)"));
        assert!(!claim("SELECT dedup.try_claim('42')"));
        assert!(claim("SELECT dedup.try_claim('-7')"));
        assert!(!claim("SELECT dedup.try_claim(-7::bigint)"));
        // An int literal resolves to the bigint overload.
        assert!(!claim("SELECT dedup.try_claim(42)"));
        // Text is compared byte for byte: a leading zero is another job.
        assert!(claim("SELECT dedup.try_claim('042')"));
        assert_eq!(
            Spi::get_one::<String>("SELECT job_id FROM dedup.processed WHERE job_id = '42'"),
            Ok(Some("42".to_string()))
        );
    }

    #[pg_test]
    fn uuid_is_its_lowercase_hyphenated_text() {
        let u = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
        assert!(claim(&format!("SELECT dedup.try_claim('{u}'::uuid)")));
        assert!(!claim(&format!("SELECT dedup.try_claim('{u}')")));
        // uuid input accepts other spellings; they are the same uuid, so the same job.
        assert!(!claim(&format!(
            "SELECT dedup.try_claim('{}'::uuid)",
            u.to_uppercase()
        )));
        assert!(!claim(
            "SELECT dedup.try_claim('{a0eebc999c0b4ef8bb6d6bb9bd380a11}'::uuid)"
        ));
        // As text, another spelling is another job.
        assert!(claim(&format!(
            "SELECT dedup.try_claim('{}')",
            u.to_uppercase()
        )));
    }

    #[pg_test]
    fn claim_records_scope_job_and_transaction_time() {
        assert!(claim("SELECT dedup.try_claim('t-1', 'q')"));
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT processed_at = now() FROM dedup.processed WHERE scope = 'q' AND job_id = 't-1'"
            ),
            Ok(Some(true))
        );
    }

    #[pg_test]
    fn rolled_back_subtransaction_releases_its_claim() {
        // SAFETY: as in error_of: inside the #[pg_test]'s transaction, on the main thread; the
        // saved memory context and resource owner are the outer transaction's, valid after
        // RollbackAndReleaseCurrentSubTransaction ends the subtransaction (and frees what
        // it owned), and are restored. An ERROR inside unwinds to the test's pgrx guard.
        unsafe {
            let cxt = pg_sys::CurrentMemoryContext;
            let owner = pg_sys::CurrentResourceOwner;
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            assert!(claim("SELECT dedup.try_claim('sp-1')"));
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::CurrentResourceOwner = owner;
        }
        assert!(claim("SELECT dedup.try_claim('sp-1')"));
    }

    #[pg_test]
    fn many_claims_in_one_statement() {
        assert_eq!(
            Spi::get_one::<i64>(
                "SELECT count(*) FILTER (WHERE dedup.try_claim(g % 500)) FROM generate_series(1, 2000) g"
            ),
            Ok(Some(500))
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM dedup.processed"),
            Ok(Some(500))
        );
    }

    #[pg_test]
    fn limits_are_inclusive() {
        let id = "x".repeat(1024);
        let scope = "s".repeat(128);
        assert!(claim(&format!("SELECT dedup.try_claim('{id}', '{scope}')")));
        // Multibyte characters count in bytes: 512 two-byte characters are 1024 bytes.
        let id = "é".repeat(512);
        assert!(claim(&format!("SELECT dedup.try_claim('{id}')")));
    }

    /// Every bad input: (SQL, SQLSTATE, words the message must contain).
    const BAD_INPUT: &[(&str, &str, &str)] = &[
        (
            "SELECT dedup.try_claim(NULL::text)",
            "22004",
            "job_id must not be NULL",
        ),
        (
            "SELECT dedup.try_claim(NULL::bigint)",
            "22004",
            "job_id must not be NULL",
        ),
        (
            "SELECT dedup.try_claim(NULL::uuid)",
            "22004",
            "job_id must not be NULL",
        ),
        (
            "SELECT dedup.try_claim('j', NULL)",
            "22004",
            "scope must not be NULL",
        ),
        (
            "SELECT dedup.try_claim(1::bigint, NULL)",
            "22004",
            "scope must not be NULL",
        ),
        (
            "SELECT dedup.try_claim(gen_random_uuid(), NULL)",
            "22004",
            "scope must not be NULL",
        ),
        (
            "SELECT dedup.try_claim('')",
            "22023",
            "job_id must not be empty",
        ),
        (
            "SELECT dedup.try_claim('j', '')",
            "22023",
            "scope must not be empty",
        ),
        (
            "SELECT dedup.try_claim(repeat('x', 1025))",
            "22001",
            "job_id is 1025 bytes long",
        ),
        (
            "SELECT dedup.try_claim(repeat('é', 513))",
            "22001",
            "job_id is 1026 bytes long",
        ),
        (
            "SELECT dedup.try_claim('j', repeat('s', 129))",
            "22001",
            "scope is 129 bytes long",
        ),
        (
            "SELECT dedup.try_claim(7::bigint, repeat('s', 129))",
            "22001",
            "scope is 129 bytes long",
        ),
    ];

    #[pg_test]
    fn bad_input_is_an_error_with_sqlstate_and_hint() {
        for (sql, state, words) in BAD_INPUT {
            let (message, hint) = expect_error(sql, state, words);
            assert!(
                message.starts_with("dedup.try_claim"),
                "{sql}: message {message:?}"
            );
            assert!(!hint.is_empty(), "{sql}: no hint");
        }
        // Nothing was claimed by any of them.
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM dedup.processed"),
            Ok(Some(0))
        );
    }

    #[pg_test]
    fn read_only_transaction_is_refused() {
        Spi::run("SET LOCAL transaction_read_only = on").unwrap();
        let (state, message, hint) = error_of("SELECT dedup.try_claim('ro')").expect("no error");
        assert_eq!(state, "25006");
        assert!(message.contains("read-only transaction"), "{message}");
        assert!(hint.contains("READ WRITE"), "{hint}");
    }

    #[pg_test]
    fn warn_outside_transaction_is_a_reserved_boolean_setting() {
        assert_eq!(
            Spi::get_one::<String>("SELECT current_setting('dedup.warn_outside_transaction')"),
            Ok(Some("on".to_string()))
        );
        Spi::run("SET LOCAL dedup.warn_outside_transaction = off").unwrap();
        assert_eq!(
            Spi::get_one::<String>("SELECT current_setting('dedup.warn_outside_transaction')"),
            Ok(Some("off".to_string()))
        );
        // The prefix is reserved: a misspelt setting is an error, not a silent placeholder.
        let (state, message, _) =
            error_of("SET LOCAL dedup.warn_outside_transation = off").expect("no error");
        assert_eq!(state, "42602", "{message}");
        assert!(
            message.contains("invalid configuration parameter name"),
            "{message}"
        );
    }

    #[pg_test]
    fn declared_volatile_parallel_unsafe_not_strict() {
        // Three in C, three with a fingerprint in SQL that the planner can inline (no SET,
        // no SECURITY DEFINER).
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(l.lanname, ',' ORDER BY l.lanname) FROM pg_proc p \
                 JOIN pg_language l ON l.oid = p.prolang \
                 WHERE p.oid::regprocedure::text LIKE 'dedup.try_claim(%' \
                   AND p.provolatile = 'v' AND p.proparallel = 'u' AND NOT p.proisstrict \
                   AND NOT p.prosecdef AND p.proconfig IS NULL"
            ),
            Ok(Some("c,c,c,sql,sql,sql".to_string()))
        );
    }

    #[pg_test]
    fn written_here_is_this_transactions_rows() {
        // dedup._written_here, which the row-level security of dedup.distribute() asks: a
        // claim this transaction made (savepoints included, not one rolled back) is, a row
        // of another schema or a tid past the table's end is not (false, not an ERROR).
        let here = |job: &str| {
            Spi::get_one::<bool>(&format!(
                "SELECT dedup._written_here(tableoid, ctid) FROM dedup.processed \
                  WHERE job_id = '{job}'"
            ))
            .expect("query failed")
        };
        assert!(claim("SELECT dedup.try_claim('wh-1')"));
        // Blocks with an exception handler are subtransactions: one ends well, one aborts.
        Spi::run(
            "DO $$ BEGIN BEGIN PERFORM dedup.try_claim('wh-2'); \
             EXCEPTION WHEN OTHERS THEN NULL; END; END $$",
        )
        .unwrap();
        Spi::run(
            "DO $$ BEGIN BEGIN PERFORM dedup.try_claim('wh-3'); RAISE EXCEPTION 'undo'; \
             EXCEPTION WHEN raise_exception THEN NULL; END; END $$",
        )
        .unwrap();
        assert_eq!(here("wh-1"), Some(true));
        assert_eq!(here("wh-2"), Some(true));
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM dedup.processed WHERE job_id = 'wh-3'"),
            Ok(Some(0))
        );
        for sql in [
            "SELECT dedup._written_here('pg_catalog.pg_class'::regclass, '(0,1)')",
            "SELECT dedup._written_here('dedup.processed'::regclass, '(100000,1)')",
            "SELECT dedup._written_here('dedup.processed'::regclass, '(0,65000)')",
            "SELECT dedup._written_here(0, '(0,1)')",
        ] {
            assert_eq!(Spi::get_one::<bool>(sql), Ok(Some(false)), "{sql}");
        }
    }

    #[pg_test]
    fn processed_table_layout() {
        // Key columns in the "C" collation (bytewise comparison); the primary key starts
        // with job_id, which tells keys apart at the first column; no other index; the
        // claims are dumped by pg_dump.
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(attname || ':' || coalesce(collname, '-'), ',' ORDER BY attnum) \
                 FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation \
                 WHERE attrelid = 'dedup.processed'::regclass AND attnum > 0"
            ),
            Ok(Some(
                "scope:C,job_id:C,processed_at:-,fingerprint:C,result:-,lease_id:-,lease_expires_at:-"
                    .to_string()
            ))
        );
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
                 WHERE conrelid = 'dedup.processed'::regclass AND contype = 'p'"
            ),
            Ok(Some("PRIMARY KEY (job_id, scope)".to_string()))
        );
        assert_eq!(
            Spi::get_one::<i64>(
                "SELECT count(*) FROM pg_index WHERE indrelid = 'dedup.processed'::regclass"
            ),
            Ok(Some(1))
        );
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT 'dedup.processed'::regclass = ANY (extconfig) FROM pg_extension WHERE extname = 'dedup'"
            ),
            Ok(Some(true))
        );
    }

    fn count(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql)
            .expect("query failed")
            .expect("NULL count")
    }

    /// Claims of every (scope, age) pair, 350 each: more than three batches of 100.
    fn load_aged_claims() {
        Spi::run(
            "INSERT INTO dedup.processed (scope, job_id, processed_at) \
             SELECT v.scope, v.scope || '/' || v.age || '/' || g, now() - v.age::interval \
               FROM (VALUES ('default', '8 days'), ('default', '6 days'), \
                            ('payments', '31 days'), ('payments', '8 days'), \
                            ('fast', '2 hours'), ('fast', '30 minutes')) AS v(scope, age), \
                    generate_series(1, 350) AS g",
        )
        .unwrap();
        Spi::run("SELECT dedup.set_retention('payments', '30 days'), dedup.set_retention('fast', '1 hour')")
            .unwrap();
        Spi::run("SET LOCAL dedup.prune_batch_size = 100").unwrap();
    }

    #[pg_test]
    fn prune_deletes_exactly_the_expired_claims() {
        load_aged_claims();
        // Expired: default 8 days (retention 7 days), payments 31 days (30), fast 2 hours (1).
        assert_eq!(count("SELECT dedup.prune()"), 1050);
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(DISTINCT split_part(job_id, '/', 1) || ' ' || split_part(job_id, '/', 2), ', ') \
                 FROM dedup.processed"
            ),
            Ok(Some("default 6 days, fast 30 minutes, payments 8 days".to_string()))
        );
        assert_eq!(count("SELECT count(*) FROM dedup.processed"), 1050);
        assert_eq!(count("SELECT dedup.prune()"), 0);
        // The pass is recorded: all scopes (NULL) and each scope it deleted from.
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(coalesce(scope, '*') || '=' || rows_deleted, ' ' ORDER BY scope NULLS FIRST) \
                 FROM dedup.prune_status"
            ),
            Ok(Some("*=0 default=350 fast=350 payments=350".to_string()))
        );
    }

    #[pg_test]
    fn prune_of_one_scope_and_at_most_max_rows() {
        load_aged_claims();
        assert_eq!(count("SELECT dedup.prune('fast')"), 350);
        assert_eq!(count("SELECT dedup.prune('default', max_rows => 120)"), 120);
        assert_eq!(count("SELECT dedup.prune(max_rows => 1000)"), 580);
        assert_eq!(count("SELECT dedup.prune()"), 0);
        // A claim exactly at the retention boundary is younger than it: kept.
        Spi::run(
            "INSERT INTO dedup.processed VALUES ('default', 'edge', now() - interval '7 days')",
        )
        .unwrap();
        assert_eq!(count("SELECT dedup.prune()"), 0);
    }

    #[pg_test]
    fn retention_in_force_per_scope() {
        assert_eq!(
            Spi::get_one::<String>("SELECT dedup.retention()::text"),
            Ok(Some("7 days".into()))
        );
        assert_eq!(
            Spi::get_one::<String>("SELECT dedup.retention('any')::text"),
            Ok(Some("7 days".into()))
        );
        Spi::run("SELECT dedup.set_retention('q', '2 days 3 hours')").unwrap();
        assert_eq!(
            Spi::get_one::<String>("SELECT dedup.retention('q')::text"),
            Ok(Some("2 days 03:00:00".into()))
        );
        Spi::run("SELECT dedup.set_retention('q', NULL)").unwrap();
        assert_eq!(
            Spi::get_one::<String>("SELECT dedup.retention('q')::text"),
            Ok(Some("7 days".into()))
        );
    }

    #[pg_test]
    fn settings_take_units() {
        for (set, show) in [
            ("SET LOCAL dedup.lease_duration = '7d'", "7d"),
            ("SET LOCAL dedup.lease_duration = '36h'", "36h"),
            ("SET LOCAL dedup.lease_duration = 90", "90s"),
            ("SET LOCAL dedup.prune_batch_size = 250", "250"),
        ] {
            Spi::run(set).unwrap();
            let name = set.split_whitespace().nth(2).unwrap();
            assert_eq!(
                Spi::get_one::<String>(&format!("SELECT current_setting('{name}')")),
                Ok(Some(show.to_string())),
                "{set}"
            );
        }
    }

    /// Bad input to the retention functions: (SQL, SQLSTATE, words the message must contain).
    const BAD_RETENTION_INPUT: &[(&str, &str, &str)] = &[
        (
            "SELECT dedup.set_retention(NULL, '1 day')",
            "22004",
            "scope must not be NULL",
        ),
        (
            "SELECT dedup.set_retention('', '1 day')",
            "22023",
            "scope must not be empty",
        ),
        (
            "SELECT dedup.set_retention(repeat('s', 129), '1 day')",
            "22001",
            "scope is 129 bytes long",
        ),
        (
            "SELECT dedup.set_retention('q', '0 seconds')",
            "22023",
            "retention must be positive",
        ),
        (
            "SELECT dedup.set_retention('q', '-1 day')",
            "22023",
            "retention must be positive",
        ),
        (
            "SELECT dedup.set_retention('q', '1 month -29 days')",
            "22023",
            "retention must be positive whatever a month's length, not 1 mon -29 days",
        ),
        (
            "SELECT dedup.prune(max_rows => 0)",
            "22023",
            "max_rows must be positive",
        ),
        (
            "SELECT dedup.prune(max_rows => -5)",
            "22023",
            "max_rows must be positive",
        ),
        (
            "SELECT dedup.retention(NULL)",
            "22004",
            "scope must not be NULL",
        ),
        ("SET LOCAL dedup.retention = 0", "22023", "dedup.retention"),
        // A session's retention is refused: the worker would not keep it.
        (
            "SET LOCAL dedup.retention = '30d'",
            "22023",
            "dedup.retention",
        ),
        (
            "SET LOCAL dedup.prune_batch_size = 10",
            "22023",
            "dedup.prune_batch_size",
        ),
    ];

    #[pg_test]
    fn bad_retention_input_is_an_error_with_sqlstate() {
        for (sql, state, words) in BAD_RETENTION_INPUT {
            expect_error(sql, state, words);
        }
        assert_eq!(count("SELECT count(*) FROM dedup.scope_retention"), 0);
    }

    #[pg_test]
    fn prune_in_a_read_only_transaction_is_refused() {
        Spi::run("SET LOCAL transaction_read_only = on").unwrap();
        let (state, message, _) = error_of("SELECT dedup.prune()").expect("no error");
        assert_eq!(state, "25006", "{message}");
    }

    fn text(sql: &str) -> String {
        Spi::get_one::<String>(sql)
            .expect("query failed")
            .expect("NULL")
    }

    #[pg_test]
    fn lease_acquire_busy_complete_done() {
        assert_eq!(text("SELECT status FROM dedup.lease('mail-1')"), "acquired");
        // The lease's row, as a holder would keep it.
        let id = text("SELECT lease_id::text FROM dedup.processed WHERE job_id = 'mail-1'");
        assert_eq!(text("SELECT status FROM dedup.lease('mail-1')"), "busy");
        assert!(!claim(
            "SELECT EXISTS (SELECT FROM dedup.claim_result('mail-1'))"
        ));
        Spi::run(&format!(
            "SELECT dedup.complete('mail-1', '{id}', '{{\"sent\": true}}')"
        ))
        .unwrap();
        // Completing again with the same lease changes nothing.
        Spi::run(&format!(
            "SELECT dedup.complete('mail-1', '{id}', '{{\"sent\": 2}}')"
        ))
        .unwrap();
        assert_eq!(
            text("SELECT status || ' ' || result::text FROM dedup.lease('mail-1')"),
            "done {\"sent\": true}"
        );
        assert_eq!(
            text("SELECT result::text FROM dedup.claim_result('mail-1')"),
            "{\"sent\": true}"
        );
        // A completed lease is a done job for try_claim too.
        assert!(!claim("SELECT dedup.try_claim('mail-1')"));
    }

    #[pg_test]
    fn lease_extend_and_release() {
        let id = text("SELECT lease_id::text FROM dedup.lease('mail-2', duration => '10 seconds')");
        assert!(claim(&format!(
            "SELECT dedup.extend_lease('mail-2', '{id}', '5 minutes') > clock_timestamp() + interval '4 minutes'"
        )));
        Spi::run(&format!("SELECT dedup.release_lease('mail-2', '{id}')")).unwrap();
        let again = text("SELECT lease_id::text FROM dedup.lease('mail-2')");
        assert_ne!(again, id);
        // The released lease is gone: its holder can neither complete nor extend it.
        for f in ["complete", "extend_lease", "release_lease"] {
            let (_, message, _) =
                error_of(&format!("SELECT dedup.{f}('mail-2', '{id}')")).expect("no error");
            assert!(
                message.contains("the job is leased under another lease_id"),
                "{f}: {message}"
            );
        }
        Spi::run(&format!("SELECT dedup.complete('mail-2', '{again}')")).unwrap();
        let (_, message, _) =
            error_of(&format!("SELECT dedup.extend_lease('mail-2', '{again}')")).expect("no error");
        assert!(
            message.contains("the lease was completed already"),
            "{message}"
        );
        let (_, message, _) =
            error_of("SELECT dedup.complete('never-leased', gen_random_uuid())").expect("no error");
        assert!(
            message.contains("there is no lease on the job"),
            "{message}"
        );
    }

    #[pg_test]
    fn expired_lease_is_taken_over() {
        let first = text("SELECT lease_id::text FROM dedup.lease('mail-3')");
        Spi::run("UPDATE dedup.processed SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE job_id = 'mail-3'")
            .unwrap();
        let second = text("SELECT status || ' ' || lease_id::text FROM dedup.lease('mail-3')");
        assert_eq!(
            second,
            format!("acquired {}", second.split(' ').nth(1).unwrap())
        );
        assert!(!second.contains(&first));
        let (_, message, _) =
            error_of(&format!("SELECT dedup.complete('mail-3', '{first}')")).expect("no error");
        assert!(
            message.contains("another caller took the job over"),
            "{message}"
        );
    }

    #[pg_test]
    fn try_claim_with_a_fingerprint() {
        assert!(claim(
            "SELECT dedup.try_claim('order-1', 'default', 'sha-a')"
        ));
        assert!(!claim(
            "SELECT dedup.try_claim('order-1', 'default', 'sha-a')"
        ));
        // Without a fingerprint, a repeat is a plain duplicate.
        assert!(!claim("SELECT dedup.try_claim('order-1')"));
        let (_, message, hint) =
            error_of("SELECT dedup.try_claim('order-1', 'default', 'sha-b')").expect("no error");
        assert!(
            message.contains("claimed with a different payload fingerprint"),
            "{message}"
        );
        assert!(!hint.is_empty());
        // A claim made without one cannot be compared: a duplicate.
        assert!(claim("SELECT dedup.try_claim(7::bigint, 'nums')"));
        assert!(!claim("SELECT dedup.try_claim(7::bigint, 'nums', 'sha-x')"));
        assert!(claim(
            "SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 'u', 'f')"
        ));
        assert!(error_of(
            "SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 'u', 'g')"
        )
        .is_some());
        // The lease API compares the same fingerprint.
        assert_eq!(
            text("SELECT status FROM dedup.lease('order-1', fingerprint => 'sha-a')"),
            "done"
        );
        assert!(error_of("SELECT * FROM dedup.lease('order-1', fingerprint => 'sha-b')").is_some());
    }

    #[pg_test]
    fn stored_result_of_a_claim() {
        assert!(claim("SELECT dedup.try_claim('api-1')"));
        Spi::run("SELECT dedup.set_result('api-1', '{\"status\": 201}')").unwrap();
        assert_eq!(
            text("SELECT result::text FROM dedup.claim_result('api-1')"),
            "{\"status\": 201}"
        );
        assert!(claim(
            "SELECT claimed_at = now() FROM dedup.claim_result('api-1')"
        ));
        assert_eq!(
            count("SELECT count(*) FROM dedup.claim_result('no-such-job')"),
            0
        );
        let (state, message, _) =
            error_of("SELECT dedup.set_result('no-such-job', '{}')").expect("no error");
        assert_eq!(state, "55000", "{message}");
        // A leased job takes its result through dedup.complete.
        Spi::run("SELECT dedup.lease('api-2')").unwrap();
        let (state, message, _) =
            error_of("SELECT dedup.set_result('api-2', '{}')").expect("no error");
        assert_eq!(state, "55000", "{message}");
        let (state, message, _) = error_of("SELECT dedup.try_claim('api-2')").expect("no error");
        assert_eq!(state, "55000", "{message}");
        assert!(message.contains("held by a lease"), "{message}");
    }

    #[pg_test]
    fn prune_keeps_a_running_lease_however_old() {
        Spi::run("SET LOCAL dedup.prune_batch_size = 100").unwrap();
        Spi::run("SELECT dedup.lease('running'), dedup.lease('expired'), dedup.lease('completed')")
            .unwrap();
        Spi::run("SELECT dedup.complete('completed', lease_id) FROM dedup.processed WHERE job_id = 'completed'").unwrap();
        Spi::run(
            "UPDATE dedup.processed SET processed_at = now() - interval '8 days', \
             lease_expires_at = CASE job_id WHEN 'expired' THEN now() - interval '1 day' ELSE lease_expires_at END",
        )
        .unwrap();
        assert_eq!(count("SELECT dedup.prune()"), 2);
        assert_eq!(
            text("SELECT string_agg(job_id, ',') FROM dedup.processed"),
            "running"
        );
    }

    /// Bad input to the lease functions: (SQL, SQLSTATE, words the message must contain).
    const BAD_LEASE_INPUT: &[(&str, &str, &str)] = &[
        (
            "SELECT dedup.lease(NULL)",
            "22004",
            "dedup.lease: job_id must not be NULL",
        ),
        (
            "SELECT dedup.lease('')",
            "22023",
            "dedup.lease: job_id must not be empty",
        ),
        (
            "SELECT dedup.lease('j', NULL)",
            "22004",
            "dedup.lease: scope must not be NULL",
        ),
        (
            "SELECT dedup.lease('j', duration => '0 seconds')",
            "22023",
            "duration must be positive",
        ),
        (
            "SELECT dedup.lease('j', duration => '-1 second')",
            "22023",
            "duration must be positive",
        ),
        (
            "SELECT dedup.lease('j', duration => '8 days')",
            "22023",
            "longer than the retention of scope",
        ),
        (
            "SELECT dedup.lease('j', fingerprint => '')",
            "22023",
            "fingerprint must not be empty",
        ),
        (
            "SELECT dedup.lease('j', fingerprint => repeat('f', 257))",
            "22001",
            "fingerprint is 257 bytes long",
        ),
        (
            "SELECT dedup.complete('j', NULL)",
            "22004",
            "lease_id must not be NULL",
        ),
        (
            "SELECT dedup.complete(NULL, gen_random_uuid())",
            "22004",
            "dedup.complete: job_id must not be NULL",
        ),
        (
            "SELECT dedup.extend_lease('j', gen_random_uuid(), '-5 seconds')",
            "22023",
            "duration must be positive",
        ),
        (
            "SELECT dedup.try_claim('j', 'default', repeat('f', 257))",
            "22001",
            "fingerprint is 257 bytes long",
        ),
        (
            "SELECT dedup.try_claim('j', NULL, 'f')",
            "22004",
            "scope must not be NULL",
        ),
        (
            "SELECT dedup.set_result(NULL, '{}')",
            "22004",
            "dedup.set_result: job_id must not be NULL",
        ),
    ];

    #[pg_test]
    fn bad_lease_input_is_an_error_with_sqlstate() {
        for (sql, state, words) in BAD_LEASE_INPUT {
            expect_error(sql, state, words);
        }
        assert_eq!(count("SELECT count(*) FROM dedup.processed"), 0);
    }
}
