#!/usr/bin/env bash
# `make test`: set up everything, then pass every test against a real PostgreSQL 15.
#   1. formatting and clippy (-D warnings)
#   2. #[pg_test] unit tests (cargo pgrx test: a server of pgrx's own)
#   3. install the extension, then the integration tests in pg_test/ (a throwaway server,
#      many real connections, crashes, a standby, dump/restore, the isolation specs,
#      the client examples in examples/)
source "$(dirname "$0")/lib.sh"
bash scripts/setup.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy -p dedup --features pg15 --all-targets --quiet -- -D warnings
cargo clippy -p dedup-pg-test --all-targets --quiet -- -D warnings
cargo clippy -p dedup-example-consumer --all-targets --quiet -- -D warnings

step "#[pg_test] unit tests"
# Under /tmp: the postgres user must reach it, and the checkout may be under /root (0700).
pgdata=$(mktemp -d /tmp/dedup-pgrx-XXXXXX)
trap 'rm -rf "$pgdata"' EXIT
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$pgdata"
    cargo pgrx test pg15 --runas postgres --pgdata "$pgdata"
else
    cargo pgrx test pg15
fi

step "install the extension"
install_extension

step "integration tests against a real server"
cargo test -p dedup-pg-test --test integration

step "all tests passed"
