#!/usr/bin/env bash
# The cost of looking for expired duplicates on the claim path (docs/performance.md): two
# servers of the same build with shared_preload_libraries = 'dedup', each with summaries
# holding the keys of 200,000 pruned claims of the database under test, run pgbench's
# try_claim(bigint) of new jobs (bench/c_try_claim_bigint.sql) at the same time, one with
# the look-up off (dedup.expired_lookback = 0, a reload) and one on (-1, the default); the
# servers swap roles every round, so neither's own luck (placement, cache) is charged to
# one side. The ratio is on / off, per round.
#
# Env: DEDUP_PG_BINDIR (a tree with a release build of dedup installed), PORT (55490: it
#      and the next), CLIENTS (4 per server), THREADS (1), SECONDS_PER_RUN (20),
#      ROUNDS (6), OUT (results file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
PORT=${PORT:-55490}
CLIENTS=${CLIENTS:-4}
THREADS=${THREADS:-1}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-20}
ROUNDS=${ROUNDS:-6}
OUT=${OUT:-/dev/null}
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
dir=$(mktemp -d /tmp/dedup-bench-expired-XXXX)
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"
stop() {
    for s in 0 1; do as_pg "$bindir/pg_ctl" -D "$dir/data$s" -m immediate stop >/dev/null 2>&1 || true; done
    rm -rf "$dir"
}
trap stop EXIT
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -U postgres "$@"; }
for s in 0 1; do
    port=$((PORT + s))
    as_pg "$bindir/initdb" -D "$dir/data$s" -A trust --no-sync >/dev/null
    as_pg "$bindir/pg_ctl" -D "$dir/data$s" -l "$dir/log$s" -w -o "-p $port -k $dir -c listen_addresses='' \
        -c shared_preload_libraries=dedup -c dedup.prune_interval=0 -c synchronous_commit=off \
        -c max_wal_size=4GB" start >/dev/null
    psql -p "$port" -d postgres -c "CREATE DATABASE bench"
    psql -p "$port" -d bench -c "CREATE EXTENSION dedup" -f "$here/schema.sql" \
         -c "ALTER DATABASE bench SET dedup.warn_outside_transaction = off"
    # 200,000 claims pruned (the first prune marks a horizon; a retention later they go).
    psql -p "$port" -d bench -c "SELECT dedup.set_retention('old', '1 second')" 2>/dev/null
    psql -p "$port" -d bench -c "SELECT count(*) FROM (SELECT dedup.try_claim('old-' || g, 'old') FROM generate_series(1, 200000) g) s" >/dev/null
    psql -p "$port" -d bench -c "SELECT dedup.prune('old')" >/dev/null
done
sleep 2.5
for s in 0 1; do
    psql -p $((PORT + s)) -d bench -c "SELECT dedup.prune('old')" >/dev/null
done
keys=$(psql -p "$PORT" -d bench -At -c "SELECT sum(keys) FROM dedup.expired_summaries()")
{ echo "# $(date -u +%FT%TZ) commit ${BENCH_COMMIT:-?}, PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $(nproc) cores"
  echo "# two servers at once, $keys keys in each one's summaries; pgbench -M prepared -c $CLIENTS -j $THREADS -T $SECONDS_PER_RUN each, synchronous_commit=off"; } | tee -a "$OUT"
setting() { psql -p "$1" -d postgres -c "ALTER SYSTEM SET dedup.expired_lookback = $2" -c "SELECT pg_reload_conf()" >/dev/null; }
run() {
    psql -p "$1" -d bench -c "TRUNCATE effects, dedup.processed" -c "CHECKPOINT"
    "$bindir/pgbench" -h "$dir" -U postgres -p "$1" -n -M prepared -c "$CLIENTS" -j "$THREADS" -T "$SECONDS_PER_RUN" \
        -f "$here/c_try_claim_bigint.sql" bench 2>&1 | awk '/^tps = / {print $3}' >"$dir/tps$1"
}
for round in $(seq "$ROUNDS"); do
    on=$((PORT + round % 2)); off=$((PORT + 1 - round % 2))
    setting "$on" -1
    setting "$off" 0
    sleep 0.5
    run "$on" & run "$off" & wait
    tps_on=$(cat "$dir/tps$on"); tps_off=$(cat "$dir/tps$off")
    echo "round=$round on(port $on) tps=$tps_on off(port $off) tps=$tps_off ratio=$(echo "$tps_on / $tps_off" | bc -l | cut -c1-6)" | tee -a "$OUT"
done
counted=0
for s in 0 1; do
    counted=$((counted + $(psql -p $((PORT + s)) -d bench -At -c "SELECT coalesce(sum(expired_duplicates), 0) FROM dedup.stats WHERE datname = 'bench'")))
done
echo "# new jobs counted as expired duplicates (both servers): $counted" | tee -a "$OUT"
