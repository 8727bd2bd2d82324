#!/usr/bin/env bash
# The pgbench comparison, run inside a server started by `with-server` (PGHOST etc. set).
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

psql -f "$here/schema.sql"
[ -n "${LAYOUT_SQL:-}" ] && psql -c "$LAYOUT_SQL"
psql -c "ALTER DATABASE $PGDATABASE SET dedup.warn_outside_transaction = off"

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

echo "# bytes per claim in dedup.processed after 1,000,000 claims by dedup.try_claim" | tee -a "$OUT"
for ids in "g::bigint" "gen_random_uuid()"; do
    psql -c "TRUNCATE dedup.processed" \
         -c "SELECT count(*) FILTER (WHERE dedup.try_claim($ids)) FROM generate_series(1, 1000000) g" >/dev/null
    psql -c "VACUUM ANALYZE dedup.processed"
    psql -At -c "SELECT 'size ids=$ids heap=' || round(pg_relation_size('dedup.processed') / 1e6, 1) \
        || ' pkey=' || round(pg_relation_size('dedup.processed_pkey') / 1e6, 1) \
        || ' brin=' || round(pg_relation_size('dedup.processed_processed_at_idx') / 1e6, 3) \
        || ' total=' || round(pg_total_relation_size('dedup.processed') / 1e6, 1) \
        || ' avg_row=' || (SELECT round(avg(pg_column_size(p.*)), 1) FROM dedup.processed p)" | tee -a "$OUT"
done
