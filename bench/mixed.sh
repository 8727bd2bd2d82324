#!/usr/bin/env bash
# Side-by-side comparison on a noisy machine: every round is ONE pgbench run in which each
# client picks one of the scripts at random for every transaction, so all variants share
# the same seconds of the same machine. pgbench reports each script's average latency;
# with the server saturated (more clients than cores), latency is proportional to a
# transaction's cost, so latency(reference) / latency(variant) estimates the throughput
# ratio the variant would reach alone.
#
# Usage (inside a `with-server` server): mixed.sh REFERENCE VARIANT... ; scripts are
# DIR/NAME.sql with DIR=${SCRIPTS:-bench}.
# Env: CLIENTS (8), THREADS (2), SECONDS_PER_RUN (20), ROUNDS (5), SYNC_MODES ("off on"),
#      TRUNCATE (tables emptied before each round), OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
dir=${SCRIPTS:-$here}
OUT=${OUT:-/dev/null}
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
ref=$1
names=("$@")
files=()
for n in "${names[@]}"; do files+=(-f "$dir/$n.sql"); done
echo "# mixed: pgbench -M prepared -c ${CLIENTS:-8} -j ${THREADS:-2} -T ${SECONDS_PER_RUN:-20} ${names[*]}, ${ROUNDS:-5} rounds" | tee -a "$OUT"
for sync in ${SYNC_MODES:-off on}; do
    for round in $(seq "${ROUNDS:-5}"); do
        [ -n "${TRUNCATE:-}" ] && psql -c "TRUNCATE $TRUNCATE" -c "CHECKPOINT"
        report=$(PGOPTIONS="-c synchronous_commit=$sync" "$bindir/pgbench" -n -M prepared \
            -c "${CLIENTS:-8}" -j "${THREADS:-2}" -T "${SECONDS_PER_RUN:-20}" "${files[@]}" 2>&1) \
            || { echo "pgbench failed:" >&2; echo "$report" | grep -iv "^ -" >&2; exit 1; }
        # per script: "SQL script N: path" ... " - latency average = X ms"
        echo "$report" | awk -v sync="$sync" -v round="$round" '
            /^SQL script [0-9]+:/ { n = $NF; sub(".*/", "", n); sub("\\.sql$", "", n) }
            /- latency average = / { print "mixed sync=" sync " round=" round " " n " latency_ms=" $5 }
            /^tps = / { print "mixed sync=" sync " round=" round " total_tps=" $3 }' | tee -a "$OUT"
    done
done
