#!/usr/bin/env bash
# What the worker's own reads of a generation cost (docs/performance.md, "Generations by
# CPU"), timed by hand on a throwaway server of a tree where a release build of dedup is
# installed: N claims (a generation's worth) inserted straight into generation 1, which is
# then published away from, sealed with its summary built (one call of
# dedup.rotate_generations()), retired once dedup.retention (2 s here) has passed, and
# dropped; each call's message and time, and the time per claim of each. The worker makes
# the same calls (src/generations/rotate.rs); here nothing else runs beside them. With
# dedup.summaries_as_claimed off: the rows inserted here by hand bypass the claims that fill
# a summary as they go in, so with it on generation 1's summary would be adopted without
# their keys and nothing read (the seal's read is what this measures).
# Env: DEDUP_PG_BINDIR (default: the project's PostgreSQL 15 tree), PORT (54390),
#      N (3600000: a generation at the flat-out rate of docs/performance.md),
#      SHARED_BUFFERS (64MB), OUT (results file, appended; default /dev/null)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/pg.sh"
bindir=${DEDUP_PG_BINDIR:-$(pg_tree 15)/bin}
PORT=${PORT:-54390}
N=${N:-3600000}
OUT=${OUT:-/dev/null}
throwaway_server "$bindir" "$PORT" dedup-summary-build "shared_preload_libraries = 'dedup'" \
    "dedup.prune_interval = 0" "dedup.summaries_as_claimed = off" "dedup.retention = '2 s'" "shared_buffers = ${SHARED_BUFFERS:-64MB}" \
    "synchronous_commit = off" "max_wal_size = 4GB"
export PGHOST=$THROWAWAY_DIR PGPORT=$PORT PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
say() { echo "$*" | tee -a "$OUT"; }
say "# bench/summary-build.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), commit $(git -C "$root" rev-parse --short HEAD), N=$N, shared_buffers=${SHARED_BUFFERS:-64MB}"
psql -c "CREATE EXTENSION dedup" -c "SELECT dedup.use_generations()" >/dev/null
psql -c "INSERT INTO dedup.processed_1 (scope, job_id) \
         SELECT 'default', (g::bigint * 7919)::text FROM pg_catalog.generate_series(1, $N) AS g" \
     -c "VACUUM (ANALYZE) dedup.generations" -c "CHECKPOINT"
psql -c "SELECT dedup.rotate_generations(publish => true)" >/dev/null
# Each call of the rotation until generation 1 is gone, a second apart: its message and time.
for _ in $(seq 1 20); do
    out=$(psql -c "\timing on" -c "SELECT dedup.rotate_generations()" 2>&1 | tr '\n' ' ')
    ms=$(echo "$out" | sed -n 's/.*Time: \([0-9.]*\) ms.*/\1/p')
    message=${out%% Time:*}
    [[ "$message" == "nothing due"* ]] || say "$(printf '%9.1f ms  %6.3f us a claim  %s' "$ms" "$(python3 -c "print($ms * 1000 / $N)")" "$message")"
    [ -n "$(psql -c "SELECT 1 FROM dedup.generations WHERE n = 1")" ] || break
    sleep 1
done
