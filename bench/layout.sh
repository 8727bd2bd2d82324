#!/usr/bin/env bash
# Physical design of dedup.processed: the same hand-written claim into candidate layouts,
# alternated, inside a `with-server` server; then bytes per claim of each after 1M claims.
# Env as bench/pgbench.sh (ROUNDS, SECONDS_PER_RUN, CLIENTS, THREADS, SYNC_MODES, OUT).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
LAYOUTS="l_c_brin l_default_brin l_c_btree l_c_none"
OUT=${OUT:-/dev/null}
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -f "$here/layout/schema.sql"
echo "# layouts: pgbench -M prepared -c ${CLIENTS:-8} -j ${THREADS:-2} -T ${SECONDS_PER_RUN:-10}, ${ROUNDS:-5} rounds" | tee -a "$OUT"
for sync in ${SYNC_MODES:-off}; do
    for round in $(seq "${ROUNDS:-5}"); do
        for v in $LAYOUTS; do
            psql -c "TRUNCATE effects, $v" -c "CHECKPOINT"
            tps=$(PGOPTIONS="-c synchronous_commit=$sync" "$bindir/pgbench" -n -M prepared \
                    -c "${CLIENTS:-8}" -j "${THREADS:-2}" -T "${SECONDS_PER_RUN:-10}" -f "$here/layout/$v.sql" 2>&1 \
                  | awk '/^tps = / {print $3}')
            echo "sync=$sync round=$round $v tps=$tps" | tee -a "$OUT"
        done
    done
done
echo "# bytes per claim after 1,000,000 claims (sequential bigint ids as text; then random uuids)" | tee -a "$OUT"
for ids in "g::text" "gen_random_uuid()::text"; do
    for v in $LAYOUTS; do
        psql -c "TRUNCATE $v" -c "INSERT INTO $v (scope, job_id) SELECT 'default', $ids FROM generate_series(1, 1000000) g" \
             -c "VACUUM ANALYZE $v"
        psql -At -c "SELECT 'size ids=$ids $v heap=' || pg_relation_size('$v') / 1000000.0 || ' indexes=' || pg_indexes_size('$v') / 1000000.0 || ' total=' || (pg_relation_size('$v') + pg_indexes_size('$v')) / 1000000.0" | tee -a "$OUT"
    done
done
