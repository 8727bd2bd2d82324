#!/usr/bin/env bash
# Alternated throughput runs, inside a server started by `with-server` (PGHOST etc. set),
# after bench/run.sh created the tables.
# Variants run alternated (a b c d, a b c d, ...) so drift on a shared machine hits all
# of them alike; every run starts from empty tables after a CHECKPOINT.
#
# Env: CLIENTS (8), THREADS (2), SECONDS_PER_RUN (15), ROUNDS (3), SYNC_MODES ("off on"),
#      VARIANTS ("a_effect b_handwritten c_try_claim_bigint d_try_claim_text_scope"), OUT (results file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
ROUNDS=${ROUNDS:-3}
SYNC_MODES=${SYNC_MODES:-"off on"}
VARIANTS=${VARIANTS:-"a_effect b_handwritten c_try_claim_bigint d_try_claim_text_scope"}
OUT=${OUT:-/dev/null}
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

echo "# pgbench -M prepared -c $CLIENTS -j $THREADS -T $SECONDS_PER_RUN, $ROUNDS rounds, variants alternated" | tee -a "$OUT"
for sync in $SYNC_MODES; do
    for round in $(seq "$ROUNDS"); do
        for v in $VARIANTS; do
            psql -c "TRUNCATE effects, my_processed, dedup.processed" -c "CHECKPOINT"
            tps=$(PGOPTIONS="-c synchronous_commit=$sync" "$bindir/pgbench" -n -M prepared \
                    -c "$CLIENTS" -j "$THREADS" -T "$SECONDS_PER_RUN" -f "$here/$v.sql" 2>&1 \
                  | awk '/^tps = / {print $3}')
            echo "sync=$sync round=$round $v tps=$tps" | tee -a "$OUT"
        done
    done
done

