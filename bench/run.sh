#!/usr/bin/env bash
# Everything `make bench` measures, inside a server started by `with-server --db bench`:
#   1. alternated throughput runs of (a) effect alone, (b) the guide's hand-written claim,
#      (c) dedup.try_claim(bigint), (d) dedup.try_claim(text, scope)       [pgbench.sh]
#   2. the same four side by side in mixed runs                            [mixed.sh]
#   3. candidate layouts of the claim table, hand-written, side by side    [mixed.sh]
#   4. bytes per claim after 1,000,000 claims
# OUT names the results file.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-/dev/null}
export OUT
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -f "$here/schema.sql" -f "$here/layout/schema.sql"
psql -c "ALTER DATABASE $PGDATABASE SET dedup.warn_outside_transaction = off"
{ echo "# $(date -u +%FT%TZ) commit ${BENCH_COMMIT:-?}, PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $(nproc) cores";
  psql -At -c "SELECT '# settings: ' || string_agg(name || '=' || current_setting(name), ' ') FROM pg_settings WHERE name IN ('shared_buffers', 'max_wal_size', 'fsync', 'wal_level', 'checkpoint_timeout')"; } | tee -a "$OUT"

# RATIO_ONLY: only the side-by-side comparison of the four transactions (the try_claim /
# hand-written ratio `make bench PG="15 16 17 18"` reports per major), then stop.
if [ -n "${RATIO_ONLY:-}" ]; then
    TRUNCATE="effects, my_processed, dedup.processed" \
        bash "$here/mixed.sh" b_handwritten a_effect c_try_claim_bigint d_try_claim_text_scope
    exit 0
fi

# STATS_ONLY: only the counters on/off comparison below, then stop.
if [ -n "${STATS_ONLY:-}" ]; then
    SKIP_ALTERNATED=1 SKIP_MIXED=1
fi

# SKIP_ALTERNATED, SKIP_MIXED: leave out those parts (the sizes run unless STATS_ONLY).
if [ -z "${SKIP_ALTERNATED:-}" ]; then
    bash "$here/pgbench.sh"
fi
if [ -z "${SKIP_MIXED:-}" ]; then
    TRUNCATE="effects, my_processed, dedup.processed" \
        bash "$here/mixed.sh" b_handwritten a_effect c_try_claim_bigint d_try_claim_text_scope
    TRUNCATE="effects, l_chosen, l_scope_first, l_default_collation, l_brin, l_btree" \
        bash "$here/mixed.sh" layout/l_chosen layout/l_scope_first layout/l_default_collation layout/l_brin layout/l_btree
fi

# Counters on and off (needs the server started with shared_preload_libraries = 'dedup'):
# side by side in mixed runs, and alternated runs switching dedup.track_stats per database.
if psql -At -c "SELECT counting FROM dedup.stats_info()" 2>/dev/null | grep -q t; then
    TRUNCATE="effects, dedup.processed" \
        bash "$here/mixed.sh" stats/c_not_counting stats/c_counting
    # In ABBA order (off on, on off, ...): separate runs drift by several percent on a shared
    # machine, and a fixed order would charge the drift to one side.
    echo "# counters: alternated runs, dedup.track_stats off/on per run, ABBA order" | tee -a "$OUT"
    for round in $(seq "${ROUNDS:-4}"); do
        order="off on"; [ $((round % 2)) = 0 ] && order="on off"
        for track in $order; do
            psql -c "ALTER DATABASE $PGDATABASE SET dedup.track_stats = $track" \
                 -c "TRUNCATE effects, dedup.processed" -c "CHECKPOINT"
            tps=$(PGOPTIONS="-c synchronous_commit=off" "$bindir/pgbench" -n -M prepared \
                    -c "${CLIENTS:-8}" -j "${THREADS:-2}" -T "${SECONDS_PER_RUN:-15}" -f "$here/c_try_claim_bigint.sql" 2>&1 \
                  | awk '/^tps = / {print $3}')
            echo "sync=off round=$round stats_$track tps=$tps" | tee -a "$OUT"
        done
    done
    psql -c "ALTER DATABASE $PGDATABASE RESET dedup.track_stats"
fi
[ -z "${STATS_ONLY:-}" ] || exit 0

# Bytes per claim after 1,000,000 claims, as inserted and after REINDEX (which packs the
# btree leaves: what remains is the entries themselves, not the free space of page splits).
echo "# bytes per claim after 1,000,000 claims (heap, primary key, total with FSM/VM)" | tee -a "$OUT"
size() {
    psql -At -c "SELECT 'size $1 heap=' || round(pg_relation_size('$2') / 1e6, 1) \
        || ' pkey=' || round(pg_relation_size('$3') / 1e6, 1) \
        || ' total=' || round(pg_total_relation_size('$2') / 1e6, 1) \
        || ' avg_row=' || (SELECT round(avg(pg_column_size(t.*)), 1) FROM $2 t)" | tee -a "$OUT"
}
for ids in "g::bigint" "gen_random_uuid()"; do
    psql -c "TRUNCATE dedup.processed" \
         -c "SELECT count(*) FILTER (WHERE dedup.try_claim($ids)) FROM generate_series(1, 1000000) g" >/dev/null
    psql -c "VACUUM ANALYZE dedup.processed"
    size "dedup.processed ids=$ids" dedup.processed dedup.processed_pkey
    psql -c "REINDEX TABLE dedup.processed"
    size "dedup.processed ids=$ids after-reindex" dedup.processed dedup.processed_pkey
done
psql -c "TRUNCATE my_processed" -c "INSERT INTO my_processed (job_id) SELECT g FROM generate_series(1, 1000000) g" \
     -c "VACUUM ANALYZE my_processed"
size "my_processed(guide) ids=g::bigint" my_processed my_processed_pkey
