#!/usr/bin/env bash
# The tests of the portable edition (docs/portable.md), run by scripts/test.sh: the
# integration suite (with the isolation specs and the short experiment) against the
# system's PostgreSQL 15, where dedup.so does not exist, as on a managed service:
#   1. through pg_tle (`CREATE EXTENSION dedup` after the registration script)
#   2. through the plain script
# A test that cannot apply to the portable edition prints why (and docs/portable.md
# lists it). Then the switch from the portable edition to the native one, keeping every
# claim (pg_test/tests/portable.rs).
source "$(dirname "$0")/lib.sh"
bash scripts/pgtle.sh
bash scripts/portable.sh
export DEDUP_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
export DEDUP_PG_BINDIR=/usr/lib/postgresql/15/bin
export DEDUP_PORTABLE_DIR=${DEDUP_PORTABLE_DIR:-$ROOT/target/portable}
if [ -e "$("$DEDUP_PG_CONFIG" --sharedir)/extension/dedup.control" ]; then
    echo "the system's PostgreSQL 15 has the native dedup installed: the portable edition is tested where it is not" >&2
    exit 1
fi
for edition in pgtle plain; do
    step "the portable edition ($edition) against the system's PostgreSQL 15"
    DEDUP_EDITION=$edition cargo test -p dedup-pg-test --test integration
done
