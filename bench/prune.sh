#!/usr/bin/env bash
# The retention benchmark (docs/retention.md, "How a pass works"), inside a server started by
# `with-server --conf shared_preload_libraries=dedup --conf dedup.prune_interval=0 --db bench`:
#   for each pause between the worker's batches in DELAYS (dedup.prune_batch_delay, ms;
#   default "0 20 50"): load EXPIRED expired claims (default 10M) and LIVE live ones (1M);
#   run a claim workload alone (pgbench, CLIENTS clients) for WINDOW seconds, the baseline;
#   then the worker's batched prune of all expired claims while the same workload runs;
#   then the same data again, a baseline, and the guide's one-statement DELETE while the
#   workload runs; and sizes before the prune, after it, and after VACUUM.
# Per-transaction pgbench logs give throughput and the longest claim in each window.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
EXPIRED=${EXPIRED:-10000000}
LIVE=${LIVE:-1000000}
CLIENTS=${CLIENTS:-8}
WINDOW=${WINDOW:-20}
OUT=${OUT:-/dev/null}
logs=$(mktemp -d /tmp/dedup-prune-bench-XXXX)
trap 'rm -rf "$logs"' EXIT
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
say() { echo "$*" | tee -a "$OUT"; }

load() {
    psql -c "TRUNCATE dedup.processed, effects" \
         -c "INSERT INTO dedup.processed SELECT 'default', 'old-' || g, now() - interval '8 days' FROM generate_series(1, $EXPIRED) g" \
         -c "INSERT INTO dedup.processed SELECT 'default', 'live-' || g, now() FROM generate_series(1, $LIVE) g" \
         -c "VACUUM ANALYZE dedup.processed" -c "CHECKPOINT"
}
size() {
    psql -At -c "SELECT 'size $1 heap_mb=' || round(pg_relation_size('dedup.processed') / 1e6) \
        || ' pkey_mb=' || round(pg_relation_size('dedup.processed_pkey') / 1e6) \
        || ' rows=' || (SELECT count(*) FROM dedup.processed)" | tee -a "$OUT"
}
# pgbench in the background for $1 seconds, per-transaction log in $logs/$2
workload() {
    PGOPTIONS="-c synchronous_commit=off -c dedup.warn_outside_transaction=off" "$bindir/pgbench" -n -M prepared \
        -c "$CLIENTS" -j 2 -T "$1" -f "$here/prune/claims.sql" -l --log-prefix="$logs/$2" >/dev/null 2>&1 &
}
# throughput and longest transaction of the logs $1* between epochs $2 and $3 (seconds)
window() {
    python3 - "$logs/$1" "$2" "$3" <<'PY'
import glob, sys
prefix, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
lat = []
for f in glob.glob(prefix + "*"):
    for line in open(f):
        p = line.split()
        # client_id transaction_no latency_us script_no epoch_s epoch_us; the last line of a
        # log cut by the kill may be partial
        if len(p) < 6:
            continue
        end = int(p[4]) + int(p[5]) / 1e6
        if t0 <= end <= t1:
            lat.append(int(p[2]))
print(f"tps={len(lat) / (t1 - t0):.0f} max_latency_ms={max(lat) / 1000:.1f} transactions={len(lat)}")
PY
}

psql -c "CREATE TABLE IF NOT EXISTS effects (job_id bigint NOT NULL, payload text NOT NULL)"
say "# prune benchmark: $EXPIRED expired + $LIVE live claims, $CLIENTS pgbench clients claiming alongside"

# baseline: the claim workload alone for WINDOW seconds, right after a load
baseline() {
    local t0 t1
    t0=$(date +%s.%N); workload "$WINDOW" "base$1"; wait; t1=$(date +%s.%N)
    say "baseline (no prune): $(window "base$1" "$t0" "$t1")"
}

# 1, 2. for each pause between batches (dedup.prune_batch_delay, ms): a baseline, then the
# worker's batched prune of the same data under the same workload
for delay in ${DELAYS:-0 20 50}; do
    load
    size "loaded"
    baseline "$delay"
    psql -c "DELETE FROM dedup._prune_status" \
         -c "ALTER SYSTEM SET dedup.prune_batch_delay = $delay" -c "SELECT pg_reload_conf()"
    workload 3600 "worker$delay"
    sleep 2
    psql -c "ALTER SYSTEM SET dedup.prune_interval = '1s'" -c "SELECT pg_reload_conf()"
    until [ "$(psql -At -c "SELECT count(*) FROM dedup.prune_status WHERE scope IS NULL AND rows_deleted > 0")" = 1 ]; do sleep 0.5; done
    psql -c "ALTER SYSTEM SET dedup.prune_interval = 0" -c "SELECT pg_reload_conf()"
    read -r p0 p1 rows secs <<<"$(psql -At -F ' ' -c "SELECT extract(epoch FROM last_pass_at - duration), extract(epoch FROM last_pass_at), rows_deleted, extract(epoch FROM duration) FROM dedup.prune_status WHERE scope IS NULL")"
    sleep 2; pkill -f "pgbench.*$logs/worker$delay" || true; wait || true
    say "worker prune, prune_batch_delay=${delay}ms: $rows rows in ${secs} s = $(python3 -c "print(round($rows / $secs))") rows/s; workload during it: $(window "worker$delay" "$p0" "$p1")"
done
psql -c "ALTER SYSTEM RESET dedup.prune_batch_delay" -c "SELECT pg_reload_conf()"
size "after-prune"
psql -c "VACUUM dedup.processed"
size "after-vacuum"

# 3. the guide's one-statement DELETE on the same data, under the same workload
load
baseline delete
workload 3600 delete
sleep 2
d0=$(date +%s.%N)
psql -c "DELETE FROM dedup.processed WHERE processed_at < now() - interval '7 days'"
d1=$(date +%s.%N)
sleep 2; pkill -f "pgbench.*$logs/delete" || true; wait || true
say "one-statement DELETE: $EXPIRED rows in $(python3 -c "print(round($d1 - $d0, 2))") s = $(python3 -c "print(round($EXPIRED / ($d1 - $d0)))") rows/s; workload during it: $(window delete "$d0" "$d1")"
