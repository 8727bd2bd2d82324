//! dedup against a real PostgreSQL server, over real client connections, several at once.
//!
//! A custom harness (`harness = false`): it starts one throwaway cluster with the installed
//! extension, gives every test a database of its own, runs the tests one after another,
//! stops the cluster and exits non-zero if any failed. Tests that crash or restart a server
//! start a cluster of their own. `cargo test -p dedup-pg-test -- NAME` runs the tests whose
//! name contains NAME.
use anyhow::Result;
use dedup_pg_test::cluster::{self, Cluster, Options};
use futures_util::future::BoxFuture;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "integration/batch.rs"]
mod batch;
#[path = "integration/common.rs"]
mod common;
#[path = "integration/concurrency.rs"]
mod concurrency;
#[path = "integration/crash.rs"]
mod crash;
#[path = "integration/docs.rs"]
mod docs;
#[path = "integration/dump_restore.rs"]
mod dump_restore;
#[path = "integration/errors.rs"]
mod errors;
#[path = "integration/examples.rs"]
mod examples;
#[path = "integration/experiment.rs"]
mod experiment;
#[path = "integration/expired.rs"]
mod expired;
#[path = "integration/fake_service.rs"]
mod fake_service;
#[path = "integration/fuzz.rs"]
mod fuzz;
#[path = "integration/generations.rs"]
mod generations;
#[path = "integration/isolation_levels.rs"]
mod isolation_levels;
#[path = "integration/isolation_specs.rs"]
mod isolation_specs;
#[path = "integration/leases.rs"]
mod leases;
#[path = "integration/lifecycle.rs"]
mod lifecycle;
#[path = "integration/logical.rs"]
mod logical;
#[path = "integration/operations.rs"]
mod operations;
#[path = "integration/retention.rs"]
mod retention;
#[path = "integration/security.rs"]
mod security;
#[path = "integration/soak.rs"]
mod soak;
#[path = "integration/stats.rs"]
mod stats;
#[path = "integration/upgrade.rs"]
mod upgrade;
#[path = "integration/versions.rs"]
mod versions;
#[path = "integration/worker.rs"]
mod worker;

use common::Ctx;

type TestFn = fn(Ctx) -> BoxFuture<'static, Result<()>>;

macro_rules! tests {
    ($($module:ident :: $name:ident),* $(,)?) => {
        &[$((concat!(stringify!($module), "::", stringify!($name)), |ctx| Box::pin($module::$name(ctx)))),*]
    };
}

const TESTS: &[(&str, TestFn)] = tests![
    concurrency::second_session_waits_then_gets_false_after_commit,
    concurrency::second_session_waits_then_gets_true_after_rollback,
    concurrency::savepoint_rollback_releases_the_claim_to_a_waiter,
    concurrency::thirty_two_connections_claim_two_thousand_jobs,
    concurrency::terminated_backend_releases_its_claim,
    batch::try_claim_many_claims_each_job_once,
    batch::overlapping_batches_in_any_order_never_deadlock,
    batch::advance_raises_each_partition_once,
    batch::positions_gives_every_partitions_mark,
    batch::only_a_streams_owner_advances_it,
    crash::killed_backend_loses_its_claim_and_server_keeps_committed_ones,
    crash::immediate_stop_keeps_committed_claims_only,
    crash::set_result_refuses_a_claim_of_an_earlier_epoch,
    crash::failover_keeps_what_the_standby_replayed,
    fuzz::every_function_survives_adversarial_arguments,
    soak::steady_load_with_disruptions_keeps_every_effect_once,
    isolation_levels::snapshot_that_misses_a_committed_claim_gets_40001_then_false,
    isolation_levels::waiting_repeatable_read_claim_gets_40001_or_true,
    security::unprivileged_role_claims_but_cannot_touch_the_table,
    security::hostile_search_path_changes_nothing,
    security::create_extension_under_hostile_search_path,
    security::create_extension_refuses_a_schema_it_did_not_make,
    security::a_look_alike_claim_table_is_refused,
    security::worker_skips_a_schema_a_plain_role_controls,
    security::api_works_for_a_role_with_the_documented_grants,
    security::grants_are_the_documented_ones,
    security::worker_runs_no_code_a_database_owner_wrote,
    dump_restore::dump_and_restore_keep_every_claim,
    errors::bad_input_over_the_wire,
    errors::warning_outside_a_transaction_block,
    errors::each_error_names_what_is_at_fault,
    errors::standby_refuses_claims,
    errors::citus_functions_without_citus,
    lifecycle::extension_recreated_under_a_live_session,
    lifecycle::altered_table_is_refused,
    lifecycle::claims_go_on_while_the_table_is_truncated_and_vacuumed,
    lifecycle::only_the_primary_key_decides_a_claim,
    retention::prune_and_set_retention_are_for_privileged_roles,
    retention::a_retention_under_a_minute_warns,
    retention::claims_racing_a_prune_of_their_keys_have_one_winner,
    retention::claims_locked_by_another_role_do_not_stop_a_prune,
    retention::a_claim_is_kept_its_retention_from_commit,
    retention::a_retention_positive_only_in_some_months_is_refused,
    retention::retention_is_the_same_in_every_session,
    retention::prune_in_a_session_of_another_time_zone_keeps_a_day,
    retention::set_by_names_the_caller,
    worker::worker_prunes_every_database_with_the_extension,
    worker::worker_is_restarted_after_kill_9,
    worker::fast_stop_is_not_held_up_by_a_large_prune,
    worker::standby_does_not_prune_until_promoted,
    worker::no_role_can_stop_pruning,
    worker::vacuum_truncation_between_batches,
    worker::drop_database_during_a_pass,
    worker::prune_role_with_the_documented_grants,
    worker::a_database_owners_settings_do_not_change_a_pass,
    worker::a_failing_drop_database_does_not_stop_pruning,
    worker::full_worker_slots_hold_up_pruning_only_while_full,
    worker::a_slow_database_does_not_hold_up_the_others,
    worker::a_visit_cut_short_ends_a_run_of_failures,
    generations::use_generations_refuses_without_preload_for_others_and_twice,
    generations::claims_go_to_the_current_generation,
    generations::a_claim_before_a_rotation_is_a_duplicate_after_it,
    generations::a_copy_in_flight_in_the_old_generation_is_waited_for,
    generations::the_seal_waits_for_an_open_claimer_and_blocks_no_claim,
    generations::the_seal_does_not_wait_for_an_autovacuum,
    generations::a_prepared_transaction_holds_back_the_seal,
    generations::the_drop_never_queues,
    generations::processed_is_truncated_not_dropped_after_its_retention,
    generations::leases_work_across_generations,
    generations::a_running_lease_holds_back_its_generations_retirement,
    generations::a_scope_with_its_own_retention_has_a_series_of_its_own,
    generations::at_most_four_retentions_have_a_series,
    generations::a_route_moves_only_with_a_publication,
    generations::a_retirement_reads_no_more_than_it_needs,
    generations::a_summary_is_not_built_by_a_transaction_that_deleted_from_its_generation,
    generations::a_lease_change_in_flight_across_a_publication,
    generations::no_claim_in_the_transaction_that_publishes,
    generations::leases_and_claims_race_across_rotations,
    generations::forget_removes_a_claim_in_any_generation,
    generations::results_are_stored_and_read_in_every_generation,
    generations::sealed_generations_are_summarised_and_no_summary_hides_a_claim,
    generations::summaries_filled_as_claims_go_in_hold_every_key,
    generations::a_first_summary_holds_a_burst_and_one_too_full_is_read,
    generations::a_generation_past_its_share_opens_the_next_for_more,
    generations::a_generation_with_no_room_to_collect_is_read_at_its_seal,
    generations::an_open_publication_keeps_its_summary_through_the_workers_passes,
    generations::summaries_move_to_join_gaps_too_small_for_a_new_one,
    generations::use_generations_keeps_the_leases_of_processed,
    generations::a_lease_racing_use_generations_is_not_granted_twice,
    generations::dump_and_restore_keep_the_generations,
    generations::a_promoted_standby_claims_across_the_generations_it_replayed,
    generations::the_epoch_is_even_after_a_failed_publication,
    generations::a_crash_restart_keeps_every_claim_across_generations,
    generations::worker_rotates_by_a_quarter_of_the_retention,
    generations::a_prune_role_that_is_not_a_superuser_rotates_with_its_grants,
    generations::isolation_specs_at_the_boundary,
    generations::generations_torture,
    generations::generations_torture_across_series,
    leases::concurrent_leases_of_one_job_have_one_holder,
    leases::crashed_holder_lease_is_taken_over_once,
    leases::crash_between_effect_and_done_marker_repeats_the_effect,
    leases::leases_and_fingerprints_raise_their_own_sqlstates,
    leases::completed_lease_is_kept_for_its_retention_from_completion,
    stats::counts_match_a_known_workload,
    stats::overflow_reset_and_privileges,
    stats::counters_survive_a_clean_restart,
    stats::without_preloading_stats_says_so,
    stats::exporter_query_runs,
    stats::invented_names_cannot_evict_other_counters,
    stats::a_torn_or_altered_counter_file_is_refused,
    stats::counters_of_a_dropped_database_are_forgotten,
    stats::a_full_counter_table_is_never_locked_exclusively,
    expired::copies_after_expiry_are_counted_and_new_jobs_are_not,
    expired::a_full_summary_holds_its_false_positive_rate,
    expired::the_lookback_bound_holds,
    expired::restart_keeps_the_summaries_and_a_crash_or_damage_forgets_them,
    expired::a_dropped_databases_keys_are_forgotten,
    expired::without_memory_nothing_is_remembered_and_the_summaries_say_why,
    expired::the_ring_turns_and_forgets_the_oldest,
    operations::duplicate_ages_late_copies_and_waits,
    operations::table_health_estimate_and_exact,
    operations::forget_removes_done_claims_with_an_audit_row,
    operations::a_forgotten_job_claimed_again_is_a_claim,
    operations::a_counter_file_of_the_previous_format_is_read,
    operations::batches_and_advances_are_counted,
    upgrade::upgrade_from_oldest_version_keeps_claims,
    upgrade::a_fresh_install_creates_each_object_once,
    upgrade::the_newest_upgrade_script_is_what_its_recipe_makes,
    upgrade::pg_upgrade_from_an_older_major_keeps_everything,
    logical::blue_green_switch_keeps_every_claim,
    versions::one_version_everywhere,
    docs::reference_documents_every_object,
    docs::who_may_call_each_function_is_what_the_catalog_grants,
    docs::reference_examples_run_as_shown,
    docs::links_in_the_docs_resolve,
    docs::contributing_names_every_source_file,
    docs::every_hint_is_in_the_errors_reference,
    docs::readme_stays_a_landing_page,
    docs::changelog_dates_every_released_version,
    docs::portable_differences_list_every_test_left_out,
    examples::clients_guide_shows_the_examples_as_they_run,
    examples::rust_tokio_postgres_consumer,
    examples::python_psycopg_consumer,
    examples::python_asyncpg_consumer,
    examples::python_sqlalchemy_consumer,
    examples::node_pg_consumer,
    examples::rust_tokio_postgres_lease_consumer,
    examples::python_psycopg_lease_consumer,
    examples::python_asyncpg_lease_consumer,
    examples::node_pg_lease_consumer,
    isolation_specs::isolation_specs_pass,
    experiment::copies_are_published_gap_messages_apart,
    experiment::short_matrix_shows_the_guides_pattern,
    // Last: on 0.4.0 it crashed the server.
    lifecycle::a_partitioned_claim_table_is_refused,
];

/// Tests that cannot apply to the portable edition (`DEDUP_EDITION=pgtle` or `plain`), each
/// with the reason it prints; docs/portable.md lists every one (docs::portable_differences).
/// A name ending in `::` stands for its whole module.
pub const NATIVE_ONLY: &[(&str, &str)] = &[
    ("stats::counts_match_a_known_workload", COUNTERS),
    ("stats::overflow_reset_and_privileges", COUNTERS),
    ("stats::counters_survive_a_clean_restart", COUNTERS),
    ("stats::exporter_query_runs", COUNTERS),
    ("stats::invented_names_cannot_evict_other_counters", COUNTERS),
    ("stats::a_torn_or_altered_counter_file_is_refused", COUNTERS),
    ("stats::counters_of_a_dropped_database_are_forgotten", COUNTERS),
    ("stats::a_full_counter_table_is_never_locked_exclusively", COUNTERS),
    ("operations::duplicate_ages_late_copies_and_waits", COUNTERS),
    ("operations::a_forgotten_job_claimed_again_is_a_claim", COUNTERS),
    ("operations::a_counter_file_of_the_previous_format_is_read", COUNTERS),
    ("operations::batches_and_advances_are_counted", COUNTERS),
    ("expired::", EXPIRED),
    ("worker::", WORKER),
    (
        "generations::",
        "claims in rotating generations need the native library preloaded (their epoch is in shared memory); the portable edition's dedup.use_generations refuses",
    ),
    (
        "fuzz::",
        "it calls the native library's functions with the counters preloaded; the portable edition's are PL/pgSQL",
    ),
    (
        "logical::",
        "both servers prune with the background worker, which the portable edition has not",
    ),
    (
        "soak::",
        "it needs the background worker pruning and the counters in shared memory",
    ),
    ("security::worker_runs_no_code_a_database_owner_wrote", WORKER),
    ("security::worker_skips_a_schema_a_plain_role_controls", WORKER),
    (
        "security::grants_are_the_documented_ones",
        "the portable edition's objects belong to the role that installed it and it has helper functions of its own (_portable_*): its grants are checked by pg_test/tests/portable.rs after the switch, not against this table",
    ),
    (
        "security::a_look_alike_claim_table_is_refused",
        "the native library looks dedup.processed up by name and checks it is the extension's; the portable edition's SQL names it, and its install refuses a schema it did not make",
    ),
    (
        "errors::warning_outside_a_transaction_block",
        "SQL cannot tell a transaction block from a one-statement transaction, so the portable try_claim never warns",
    ),
    (
        "retention::a_retention_under_a_minute_warns",
        "the warning when ALTER DATABASE or ALTER SYSTEM sets dedup.retention comes from the library's check of the setting; the portable edition warns in set_retention and prune only",
    ),
    (
        "retention::retention_is_the_same_in_every_session",
        "without the library, dedup.retention is a placeholder setting PostgreSQL lets any session SET: the portable edition ignores a session's or a role's value (pg_test/tests/portable.rs) but cannot refuse it with 22023",
    ),
    (
        "lifecycle::altered_table_is_refused",
        "the native library writes rows itself and refuses a claim table whose layout it does not know; the portable edition inserts by column name, so an added nullable column does not matter to it",
    ),
    (
        "lifecycle::a_partitioned_claim_table_is_refused",
        "a claim table replaced by hand gets PostgreSQL's own error (42704, no constraint processed_pkey), not dedup's 55000",
    ),
    (
        "upgrade::",
        "the upgrade test starts from the native 0.1.0; the portable edition starts at 0.6.0",
    ),
    (
        "docs::reference_documents_every_object",
        "it reads the settings the native library registers (SHOW ALL with it preloaded)",
    ),
    (
        "docs::reference_examples_run_as_shown",
        "the reference shows the native extension's output (counters, warnings); the portable edition's differences are this table",
    ),
];
const COUNTERS: &str = "dedup.stats counts in the shared memory of the native library (shared_preload_libraries = 'dedup'), which the portable edition has not";
const EXPIRED: &str = "the summaries of pruned claims live in the shared memory of the native library; the portable edition keeps none and does not count expired duplicates (dedup.expired_summaries() warns and returns no rows)";
const WORKER: &str =
    "the background worker is part of the native library; the portable edition prunes from pg_cron";
/// Tests that need `CREATE EXTENSION dedup` itself: they run through pg_tle, not with the
/// plain script (`DEDUP_EDITION=plain`).
pub const EXTENSION_ONLY: &[(&str, &str)] = &[
    (
        "lifecycle::extension_recreated_under_a_live_session",
        "it drops and creates the extension; the plain script creates no extension",
    ),
    (
        "security::create_extension_refuses_a_schema_it_did_not_make",
        "the plain script refuses every schema dedup it did not make, an empty one too (55000; pg_test/tests/portable.rs)",
    ),
];

/// Why a test cannot apply to the edition under test (None: it runs).
fn not_applicable(name: &str) -> Option<&'static str> {
    let find = |list: &[(&'static str, &'static str)]| {
        list.iter()
            .find(|(n, _)| {
                if n.ends_with("::") {
                    name.starts_with(n)
                } else {
                    name == *n
                }
            })
            .map(|(_, why)| *why)
    };
    match cluster::edition() {
        cluster::Edition::Native => None,
        cluster::Edition::PgTle => find(NATIVE_ONLY),
        cluster::Edition::Plain => find(NATIVE_ONLY).or_else(|| find(EXTENSION_ONLY)),
    }
}

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // DEDUP_SKIP_TESTS: name prefixes to leave out (scripts/test.sh runs the client
    // examples and the experiment on one major only).
    let skip: Vec<String> = std::env::var("DEDUP_SKIP_TESTS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let selected: Vec<_> = TESTS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .filter(|(name, _)| !skip.iter().any(|s| name.starts_with(s.as_str())))
        .collect();
    if !skip.is_empty() {
        println!("leaving out the tests named {}", skip.join(" "));
    }
    cluster::stop_all_on_signal();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let cluster = match Cluster::start(
        Options::named("integration").set("max_prepared_transactions", "10"),
    ) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("could not start the test server: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "running {} integration tests against PostgreSQL on port {} (dedup: {:?} edition)",
        selected.len(),
        cluster.port,
        cluster::edition()
    );
    // DEDUP_TEST_TIMEOUT: seconds each test may take (scripts/soak.sh raises it).
    let timeout = Duration::from_secs(
        std::env::var("DEDUP_TEST_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    let mut failed = Vec::new();
    let mut not_run = 0;
    for (i, (name, test)) in selected.iter().enumerate() {
        if let Some(why) = not_applicable(name) {
            println!("test {name} ... does not apply to the portable edition: {why}");
            not_run += 1;
            continue;
        }
        let db = format!("t{i}");
        let started = Instant::now();
        let result = cluster.create_db_with_extension(&db).and_then(|_| {
            let ctx = Ctx {
                cluster: cluster.clone(),
                db: db.clone(),
            };
            let fut = test(ctx);
            runtime.block_on(async {
                match tokio::time::timeout(timeout, tokio::spawn(fut)).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(join)) => Err(anyhow::anyhow!("panicked: {join}")),
                    Err(_) => Err(anyhow::anyhow!("timed out after {} s", timeout.as_secs())),
                }
            })
        });
        match result {
            Ok(()) => println!(
                "test {name} ... ok ({:.1}s)",
                started.elapsed().as_secs_f64()
            ),
            Err(e) if e.downcast_ref::<dedup_pg_test::NotApplicable>().is_some() => {
                println!("test {name} ... does not apply to this run: {e}");
                not_run += 1;
            }
            Err(e) => {
                println!(
                    "test {name} ... FAILED ({:.1}s)\n{e:#}\n",
                    started.elapsed().as_secs_f64()
                );
                failed.push(*name);
            }
        }
    }
    drop(runtime);
    if !failed.is_empty() {
        println!("server log (last lines):\n{}", cluster.log_tail(40));
    }
    drop(cluster);
    println!(
        "\nintegration: {} passed, {} failed, {} not applicable{}",
        selected.len() - failed.len() - not_run,
        failed.len(),
        not_run,
        if failed.is_empty() {
            String::new()
        } else {
            format!(": {}", failed.join(", "))
        }
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
