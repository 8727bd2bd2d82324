#!/usr/bin/env bash
# The tests of the portable edition (docs/portable.md), run by scripts/test.sh: the
# integration suite (with the isolation specs and the short experiment) against the
# system's PostgreSQL 15, where dedup.so does not exist, as on a managed service:
#   1. through pg_tle (`CREATE EXTENSION dedup` after the registration script), without the
#      client examples, the experiment and the soak (the clients' side, which the native
#      runs test; their server side is the claims of the core)
#   2. through the plain script: the core only (DEDUP_CORE_SKIP in scripts/lib.sh), as the
#      majors between the oldest and the newest: the SQL is the same, only its install
#      differs
# A test that cannot apply to the portable edition prints why (and docs/portable.md
# lists it). Then the switch from the portable edition to the native one, keeping every
# claim (pg_test/tests/portable.rs).
source "$(dirname "$0")/lib.sh"
bash scripts/pgtle.sh
DEDUP_NO_SETUP=1 bash scripts/portable.sh
export DEDUP_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
export DEDUP_PG_BINDIR=/usr/lib/postgresql/15/bin
export DEDUP_PORTABLE_DIR=${DEDUP_PORTABLE_DIR:-$ROOT/target/portable}
control=$("$DEDUP_PG_CONFIG" --sharedir)/extension/dedup.control
if [ -e "$control" ]; then
    echo "the system's PostgreSQL 15 has the native dedup installed: the portable edition is tested where it is not" >&2
    exit 1
fi
step "the portable edition (pgtle) against the system's PostgreSQL 15"
DEDUP_EDITION=pgtle DEDUP_SKIP_TESTS="examples:: experiment:: soak::" cargo test -p dedup-pg-test --test integration
step "the portable edition (plain), its core, against the system's PostgreSQL 15"
DEDUP_EDITION=plain DEDUP_SKIP_TESTS=$DEDUP_CORE_SKIP cargo test -p dedup-pg-test --test integration

# The switch to the native extension installs the native files of this version into the
# system's PostgreSQL 15 (the package of scripts/package.sh, which scripts/test.sh has built
# and tested by now; built here if missing, or older than the sources it is made of) and
# removes them after each case.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
deb=$ROOT/target/packages/postgresql-15-dedup_$version-1_amd64.deb
if [ -z "${DEDUP_NATIVE_INSTALL:-}" ] && { [ ! -f "$deb" ] ||
    [ -n "$(find "$ROOT/src" "$ROOT/sql" "$ROOT/Cargo.toml" "$ROOT/dedup.control" -newer "$deb" -print -quit 2>/dev/null)" ]; }; then
    step "the package of PostgreSQL 15, for the switch to the native extension"
    DEDUP_NO_SETUP=1 PG=15 bash scripts/package.sh --debug
fi
sudo=
[ "$(id -u)" -eq 0 ] || sudo="sudo "
export DEDUP_NATIVE_INSTALL=${DEDUP_NATIVE_INSTALL:-${sudo}dpkg -i $deb}
export DEDUP_NATIVE_REMOVE=${DEDUP_NATIVE_REMOVE:-${sudo}dpkg -r postgresql-15-dedup}
# Should the test be killed with the files installed, they go anyway (they were not there).
trap '[ ! -e "$control" ] || sh -c "$DEDUP_NATIVE_REMOVE" >/dev/null' EXIT
step "from the portable edition (pg_tle, plain script) to the native extension, every row kept"
cargo test -p dedup-pg-test --test portable
