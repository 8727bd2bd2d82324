#!/usr/bin/env bash
# The long soak of docs/operations.md ("A soak"): `make soak HOURS=6 PG=17`, or
# `bash scripts/soak.sh HOURS [MAJOR]`
# (default 6 hours on PostgreSQL 17). It runs pg_test's soak::
# steady_load_with_disruptions_keeps_every_effect_once, the test `make test` runs for 55 s,
# for HOURS, with a disruption every DEDUP_SOAK_EVERY seconds (default 60) and a retention
# of DEDUP_SOAK_RETENTION seconds (default 60): a reload, the
# launcher terminated, a backend killed, the launcher killed, then a restart
# -m immediate. It prints a line every 10 minutes and the figures at the end, and keeps
# them in target/soak/. Start it from a clone of its own: it installs the extension into
# MAJOR's tree (DEDUP_PG_ROOT), and no other build may install into that tree while it runs.
source "$(dirname "$0")/lib.sh"
hours=${1:-6}
major=${2:-17}
SETUP_MAJORS=$major bash scripts/setup.sh demo
use_major "$major"
step "build and install the extension into PostgreSQL $major's tree"
install_extension
secs=$(python3 -c "print(int(float('$hours') * 3600))")
mkdir -p target/soak
out="target/soak/$(git rev-parse --short HEAD)-pg$major-${hours}h.txt"
step "the soak: $hours hours on PostgreSQL $major, the figures in $out"
DEDUP_SOAK_SECS=$secs DEDUP_SOAK_EVERY=${DEDUP_SOAK_EVERY:-60} DEDUP_SOAK_RETENTION=${DEDUP_SOAK_RETENTION:-60} \
    DEDUP_TEST_TIMEOUT=${DEDUP_TEST_TIMEOUT:-$((secs + 1800))} \
    cargo test -p dedup-pg-test --test integration -- soak:: 2>&1 | tee "$out"
exit "${PIPESTATUS[0]}"
