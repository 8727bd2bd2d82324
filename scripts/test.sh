#!/usr/bin/env bash
# `make test`: set up everything (scripts/setup.sh), then pass the tests on every supported
# PostgreSQL major (15, 16, 17, 18), each in the project's own server tree (scripts/pg.sh).
# `make test PG=17` (or PG="16 18") runs those majors only; every test on a major given alone.
#   1. formatting, clippy (-D warnings) for the newest major's build, the unit
#      tests of the project's tools (the doctest parser, the scripts, scripts/test_sql_tools.py), the
#      alerting rules, the SPIN model of the generations' claim protocol (scripts/model.sh)
#   then for each major (the whole integration suite on the oldest and the newest, the
#   clients' examples and experiment on the newest only; the core on the majors between
#   them, so that a new machine's `.ci/run` stays under an hour):
#   2. #[pg_test] unit tests (cargo pgrx test: a server of pgrx's own), on the newest major
#      only, as the client examples: the integration tests run the same claims against
#      real servers of every major
#   3. install the extension into that major's tree, then the integration tests in
#      pg_test/ against throwaway servers of that major: many real connections, crashes,
#      a standby, dump/restore, the worker, the isolation specs, the upgrade from the
#      oldest version. The client examples in examples/ and the short experiment run on
#      one major (DEDUP_FULL_MAJOR, default the newest tested: 18), which is enough: they exercise
#      the clients, not the server; so do the client packages (clients/*/test.sh: each
#      installed from its built artifact into a new project, with its framework and broker).
#   4. on the newest of the majors tested that Citus supports (18; `make test PG=17` runs
#      them on 17: citus_test_major in scripts/pg.sh), the Citus tests in
#      pg_test/tests/citus.rs: a coordinator and two workers, claims from every node,
#      crashes, a shard move, the experiment with a consumer on each node
#   5. on the oldest and the newest major, the package of that major
#      (scripts/package-test.sh)
#   then, with 15 among the majors, the portable edition (scripts/portable-test.sh): the
#   integration suite against the system's PostgreSQL 15 through pg_tle, its core through
#   the plain script, then the switch of each to the native extension (with the package of
#   15 installed)
source "$(dirname "$0")/lib.sh"
bash scripts/setup.sh
# In ascending order, whatever the order PG gives them in.
majors=$(pg_majors | sort -n)
oldest=$(echo $majors | awk '{print $1}')
newest=$(echo $majors | awk '{print $NF}')
full_major=${DEDUP_FULL_MAJOR:-$newest}
citus_major=$(citus_test_major)

step "cargo fmt --check"
cargo fmt --all -- --check

# On the newest major. The others' per-major code of src/compat.rs is compiled when their
# build installs, not linted: `make test PG=15` lints 15's.
step "cargo clippy -D warnings"
cargo clippy -p dedup --no-default-features --features "pg$newest" --all-targets --quiet -- -D warnings
cargo clippy -p dedup-pg-test --all-targets --quiet -- -D warnings
cargo clippy -p dedup-example-consumer --all-targets --quiet -- -D warnings
cargo build --quiet -p dedup-pg-test --bins --tests
cargo test --quiet -p dedup-pg-test --lib   # the doctest parser (pg_test/src/doctest.rs)
cargo test --quiet -p dedup-pg-test --test scripts   # what a new machine runs first (pg_test/tests/scripts.rs)
python3 scripts/test_sql_tools.py   # the SQL reading of scripts/portable.py and scripts/upgrade-script.py
promtool check rules monitoring/alerts.yml >/dev/null   # the alerting rules parse
promtool test rules monitoring/alerts_test.yml >/dev/null   # and the expired-duplicate alert fires with its text
bash scripts/model.sh   # the generations' claim protocol, model-checked (docs/design/generations.md)

started=$(date +%s)
# The majors tested before this one, dedup of this build installed in each: the integration
# tests pg_upgrade from the oldest and the latest of them (upgrade.rs).
earlier=
for major in $majors; do
    use_major "$major"
    if [ "$major" = "$newest" ]; then
        step "PostgreSQL $major: #[pg_test] unit tests"
        # Under /tmp: the postgres user must reach it, and the checkout may be under /root (0700).
        pgdata=$(mktemp -d /tmp/dedup-pgrx-XXXXXX)
        if [ "$(id -u)" -eq 0 ]; then
            chown postgres: "$pgdata"
            cargo pgrx test "pg$major" --runas postgres --pgdata "$pgdata"
        else
            cargo pgrx test "pg$major"
        fi
        rm -rf "$pgdata"
    fi

    step "PostgreSQL $major: install the extension into $(pg_tree "$major")"
    install_extension

    step "PostgreSQL $major: integration tests against real servers"
    export DEDUP_UPGRADE_FROM="${earlier# }"
    # The whole suite on the oldest major and on DEDUP_FULL_MAJOR (the client examples and the
    # experiment there only: they exercise the clients, not the server); on the majors
    # between them the core (DEDUP_CORE_SKIP in scripts/lib.sh), so that a new machine's
    # `.ci/run` stays under an hour (3,626 s with every test on every major, at 0544163).
    if [ "$major" = "$full_major" ] || [ "$(echo $majors | wc -w)" -eq 1 ]; then
        cargo test -p dedup-pg-test --test integration
    elif [ "$major" = "$oldest" ]; then
        DEDUP_SKIP_TESTS="examples:: experiment::" cargo test -p dedup-pg-test --test integration
    else
        DEDUP_SKIP_TESTS=$DEDUP_CORE_SKIP cargo test -p dedup-pg-test --test integration
    fi
    if [ "$major" = "$full_major" ] || [ "$(echo $majors | wc -w)" -eq 1 ]; then
        # The client packages (clients/), each installed from its built artifact into a new
        # project of its own, against a server of this tree and a Redis of its own.
        for client in clients/*/test.sh; do
            step "PostgreSQL $major: the $(basename "$(dirname "$client")") client package"
            PG_BINDIR=$DEDUP_PG_BINDIR bash "$client"
        done
    fi
    if [ "$major" = "$citus_major" ]; then
        step "PostgreSQL $major: the Citus tests (a coordinator and two workers)"
        cargo test -p dedup-pg-test --test citus
    fi
    # The package on the oldest and the newest major (the same script builds each major's).
    if [ "$major" = "$oldest" ] || [ "$major" = "$full_major" ] || [ "$(echo $majors | wc -w)" -eq 1 ]; then
        step "PostgreSQL $major: the package"
        bash scripts/package-test.sh "$major"
    fi
    printf '[test] PostgreSQL %s done, %s s since the first major began\n' "$major" $(($(date +%s) - started)) >&2
    earlier="$earlier $(pg_config_of "$major")"
done

# The portable edition (docs/portable.md), on the system's PostgreSQL 15 where no dedup.so
# is installed (the package test above removes its own): through pg_tle and the plain script.
portable=
if [[ " $(echo $majors) " == *" 15 "* ]]; then
    step "the portable edition (pg_tle and the plain script) on the system's PostgreSQL 15"
    bash scripts/portable-test.sh
    portable=", and the portable edition"
fi

step "all tests passed on PostgreSQL $(echo $majors)$portable"
