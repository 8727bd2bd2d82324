#!/usr/bin/env bash
# `make demo`: set up what it needs (scripts/setup.sh demo: no Citus, pg_tle, Node or other
# majors), build and install the extension, then run the guide's
# experiment (a throwaway PostgreSQL with dedup, a throwaway redis-server, consumer
# processes, a SIGKILL) and print the table. Arguments go to the experiment
# (`make demo ARGS="--runs 1"`; `--help` lists them).
# `scripts/demo.sh sessions` (`make demo-sessions`): instead, the short demonstration of
# two sessions racing for one job.
# Everything they start is stopped at the end, also on failure and on Ctrl-C.
source "$(dirname "$0")/lib.sh"
bash scripts/setup.sh demo
use_major "$DEDUP_PG_MAJOR"
step "build and install the extension into PostgreSQL $PG_MAJOR's tree (about 3 minutes the first time, seconds after)"
install_extension
if [ "${1:-}" = sessions ]; then
    step "two sessions, one job"
    cargo run --quiet -p dedup-pg-test --bin demo
else
    step "the guide's experiment (about three minutes)"
    cargo run --quiet -p dedup-pg-test --bin experiment -- "$@"
fi
