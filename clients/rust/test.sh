#!/usr/bin/env bash
# The tests of the Rust client against a real server.
#
# Builds a fresh Cargo project in a temporary folder whose dependency is this crate by its
# path (with the drivers, tokio, and uuid, as a user's project would have them), starts a
# PostgreSQL of its own with dedup installed, and runs e2e/main.rs: bad input, claims,
# run_once with injected 40001/40P01 (also at COMMIT), an effect that swallows a failed
# statement, leases, the lease heartbeat against a locked row, and end to end: a table
# queue with every job sent twice, three worker processes, one killed with SIGKILL.
#
# Environment:
#   PG_BINDIR              bin/ of a PostgreSQL with dedup installed (default: pg_config --bindir)
#   DEDUP_CLIENT_PG_PORT   the server's port (default 55434); its socket is in /tmp
#   CARGO_TARGET_DIR       where to build (default target/clients-rust of the repository)
#   DEDUP_CLIENT_TEST      run only the tests whose name contains this
# The last line is "rust client: N passed, M failed"; the exit status is non-zero on failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
port=${DEDUP_CLIENT_PG_PORT:-55434}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(cd "$here/../.." && pwd)/target/clients-rust}
bindir=${PG_BINDIR:-$(pg_config --bindir 2>/dev/null || true)}
passed=0
failed=0
tmp=$(mktemp -d /tmp/dedup-client-test.XXXXXX)
pgdata=$tmp/pgdata
pg_started=0

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

finish() {
    local status=$?
    if [ "$pg_started" = 1 ]; then
        as_pg "$bindir/pg_ctl" -D "$pgdata" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
    echo "rust client: $passed passed, $failed failed"
    if [ "$failed" -gt 0 ] || [ "$passed" = 0 ]; then exit 1; fi
    exit "$status"
}
trap finish EXIT

fail() {
    echo "not ok - $1"
    failed=$((failed + 1))
    exit 1
}

[ -x "$bindir/initdb" ] || fail "setup: no initdb in '$bindir': set PG_BINDIR to the bin/ of a PostgreSQL with dedup installed"

# The crate's version moves with the extension's.
ext_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/../../Cargo.toml" | head -1)
crate_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)
if [ "$ext_version" = "$crate_version" ] && grep -q "^## $crate_version" "$here/CHANGELOG.md"; then
    echo "ok - version $crate_version is the extension's and has a CHANGELOG entry"
    passed=$((passed + 1))
else
    echo "not ok - version: crate $crate_version, extension $ext_version (or no CHANGELOG entry)"
    failed=$((failed + 1))
fi

# A fresh project that depends on the crate by its path.
project=$tmp/project
mkdir -p "$project/src"
cp "$here/e2e/main.rs" "$project/src/main.rs"
cp "$here/Cargo.lock" "$project/Cargo.lock" # the crate's locked versions, for a build that is the same every time
cat >"$project/Cargo.toml" <<TOML
[package]
name = "dedup-client-e2e"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
dedup-client = { path = "$here", features = ["tokio-postgres", "sqlx", "uuid"] }
sqlx = { version = "0.8.6", default-features = false, features = ["postgres", "runtime-tokio"] }
tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
tokio-postgres = "0.7.18"
uuid = "1"

[workspace]
TOML
echo "# building the test project (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
build_start=$SECONDS
if ! (cd "$project" && nice -n 15 cargo build --quiet 2>"$tmp/build.log"); then
    cat "$tmp/build.log" >&2
    fail "build of a project depending on dedup-client by path"
fi
echo "# built in $((SECONDS - build_start)) s"
bin=$CARGO_TARGET_DIR/debug/dedup-client-e2e

# A server of our own.
mkdir -p "$pgdata"
[ "$(id -u)" = 0 ] && chown postgres: "$tmp" "$pgdata"
chmod 700 "$pgdata"
as_pg "$bindir/initdb" -D "$pgdata" -A trust -U postgres >"$tmp/initdb.log" 2>&1 || {
    cat "$tmp/initdb.log" >&2
    fail "setup: initdb"
}
pg_started=1
as_pg "$bindir/pg_ctl" -D "$pgdata" -l "$pgdata/server.log" \
    -o "-p $port -k /tmp -c listen_addresses='' -c fsync=off -c max_connections=60" -w start >/dev/null || {
    pg_started=0
    cat "$pgdata/server.log" >&2 || true
    fail "setup: the server did not start on port $port"
}

logs=$tmp/logs
mkdir -p "$logs"
[ "$(id -u)" = 0 ] && chmod 777 "$logs"
set +e
DEDUP_TEST_HOST=/tmp DEDUP_TEST_PORT=$port DEDUP_TEST_USER=postgres DEDUP_TEST_LOGS=$logs \
    "$bin" suite ${DEDUP_CLIENT_TEST:+"$DEDUP_CLIENT_TEST"} | tee "$tmp/suite.out"
suite_status=${PIPESTATUS[0]}
set -e
passed=$((passed + $(grep -c '^ok - ' "$tmp/suite.out" || true)))
failed=$((failed + $(grep -c '^not ok - ' "$tmp/suite.out" || true)))
if [ "$suite_status" != 0 ] && [ "$(grep -c '^not ok - ' "$tmp/suite.out" || true)" = 0 ]; then
    echo "not ok - the test binary exited with status $suite_status"
    failed=$((failed + 1))
fi
