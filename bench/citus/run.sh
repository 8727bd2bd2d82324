#!/usr/bin/env bash
# The Citus comparison, inside `with-server --citus` (PGHOST etc. point at the coordinator,
# DEDUP_CITUS_PORTS lists every node). Claims per second through dedup against the
# hand-written INSERT ... ON CONFLICT DO NOTHING on a distributed table, the same
# transaction shape, with the effect colocated and not. Pairs run in ABBA order per round
# so drift on a shared machine hits both alike; every run starts from empty tables. Then
# the same with the clients spread over every node (one pgbench per node).
#
# Env: CLIENTS (8), THREADS (2), SECONDS_PER_RUN (15), ROUNDS (2), OUT (results file),
# ONLY=rls (only the row-level security runs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=$DEDUP_PG_BINDIR
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
ROUNDS=${ROUNDS:-2}
ONLY=${ONLY:-}
OUT=${OUT:-/dev/null}
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -f "$here/schema.sql" >/dev/null
reset() {
    psql -c "TRUNCATE my_processed, effects_c, effects_n, dedup.processed" \
         -c "SELECT run_command_on_all_nodes('CHECKPOINT')" >/dev/null
}
bench() { # script, port, clients -> tps
    PGPORT=$2 "$bindir/pgbench" -n -M prepared -c "$3" -j "$THREADS" -T "$SECONDS_PER_RUN" \
        -f "$here/$1.sql" 2>&1 | awk '/^tps = / {print $3}'
}
if [ "$ONLY" != rls ]; then
    echo "# Citus 3 nodes; pgbench -M prepared -c $CLIENTS -j $THREADS -T $SECONDS_PER_RUN through the coordinator, $ROUNDS rounds ABBA" | tee -a "$OUT"
    for pair in "hand_colocated dedup_colocated" "hand_2pc dedup_2pc"; do
        read -r a b <<<"$pair"
        for round in $(seq "$ROUNDS"); do
            for v in $a $b $b $a; do
                reset
                echo "coordinator round=$round $v tps=$(bench "$v" "$PGPORT" "$CLIENTS")" | tee -a "$OUT"
            done
        done
    done
    # Spread: one pgbench per node at once, CLIENTS/3 clients each (at least 2); their sum.
    per=$(( CLIENTS / 3 > 2 ? CLIENTS / 3 : 2 ))
    echo "# spread: one pgbench per node ($DEDUP_CITUS_PORTS), -c $per each, summed" | tee -a "$OUT"
    for round in $(seq "$ROUNDS"); do
        for v in hand_colocated dedup_colocated dedup_colocated hand_colocated; do
            reset
            tmp=$(mktemp -d)
            for port in $DEDUP_CITUS_PORTS; do
                bench "$v" "$port" "$per" >"$tmp/$port" &
            done
            wait
            total=0
            parts=""
            for port in $DEDUP_CITUS_PORTS; do
                t=$(cat "$tmp/$port")
                parts="$parts $t"
                total=$(python3 -c "print(round($total + $t, 1))")
            done
            rm -rf "$tmp"
            echo "spread round=$round $v tps=$total per-node=${parts# }" | tee -a "$OUT"
        done
    done
fi

# Row-level security (docs/citus.md, Setup): the same dedup claim as the consumer role
# bench_app, which holds the column grants of docs/citus.md, with the policies
# dedup.distribute() enabled against the same table with row-level security disabled
# (on every shard: Citus passes the ALTER TABLE on). ABBA per round.
rls() { psql -c "ALTER TABLE dedup.processed $1 ROW LEVEL SECURITY" >/dev/null; }
echo "# rls: dedup_colocated as bench_app through the coordinator, row-level security on and off" | tee -a "$OUT"
for round in $(seq "$ROUNDS"); do
    for v in rls_on rls_off rls_off rls_on; do
        reset
        if [ "$v" = rls_on ]; then rls ENABLE; else rls DISABLE; fi
        echo "rls round=$round $v tps=$(PGUSER=bench_app bench dedup_colocated "$PGPORT" "$CLIENTS")" | tee -a "$OUT"
    done
done
rls ENABLE
