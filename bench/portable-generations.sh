#!/usr/bin/env bash
# What the portable edition's claim across generations would cost, measured on a prototype
# before it is built (issue 26, slice 5; docs/design/generations.md, "Everywhere dedup
# runs"; bench/portable-generations/prototype.sql says what each variant does). One
# throwaway server of a PostgreSQL tree, a database with the portable edition's plain
# script and the prototype; each run claims N new jobs in one transaction through one
# variant (SELECT count(*) FILTER (WHERE f(id::text, 'default')) FROM generate_series(...)),
# timed by psql; rounds alternate the variants' order (ABBA). Reported: microseconds per
# claim per variant (the mean over rounds) and its ratio to today's portable try_claim.
#   P         dedup.try_claim(text, text): one table (today's portable edition)
#   ring0     proto.ring_k with no sealed generation: three catalog reads and the INSERT
#   ring4     proto.ring_k with four sealed generations: and a SELECT in each
#   ring_one  proto.ring_one with four sealed: the four looks in one statement
#   dyn4      proto.dyn_k with four sealed: the INSERT and the looks by EXECUTE format()
#   lean1     proto.lean_1: the catalog as one row read twice, one sealed generation looked
#             in by the INSERT itself (three statements)
# Usage: bash bench/portable-generations.sh [PLAIN_SCRIPT]   (default target/portable/dedup.plain.sql,
#        from make portable)
# Env: DEDUP_PG_BINDIR (default: the project's PostgreSQL 15 tree), PORT (54331), N (50000),
#      ROUNDS (6), OUT (results file, appended; default /dev/null)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$root/scripts/pg.sh"
bindir=${DEDUP_PG_BINDIR:-$(pg_tree 15)/bin}
plain=${1:-$root/target/portable/dedup.plain.sql}
PORT=${PORT:-54331}
N=${N:-50000}
ROUNDS=${ROUNDS:-6}
OUT=${OUT:-/dev/null}
[ -f "$plain" ] || { echo "bench/portable-generations.sh: no plain script at $plain (make portable)" >&2; exit 1; }
throwaway_server "$bindir" "$PORT" dedup-portgen-bench "shared_buffers = 1GB" "max_wal_size = 8GB" \
    "synchronous_commit = off"
dir=$THROWAWAY_DIR
export PGHOST=$dir PGPORT=$PORT PGUSER=postgres PGDATABASE=port
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -d postgres -c "CREATE DATABASE port"
psql -c "SET client_min_messages = warning" -f "$plain" -f "$here/portable-generations/prototype.sql"

variants=(P ring0 ring4 ring_one dyn4 lean1)
call() {
    case $1 in
        P) echo "dedup.try_claim(g::text, 'default')" ;;
        ring0|ring4) echo "proto.ring_k(g::text, 'default')" ;;
        ring_one) echo "proto.ring_one(g::text, 'default')" ;;
        dyn4) echo "proto.dyn_k(g::text, 'default')" ;;
        lean1) echo "proto.lean_1(g::text, 'default')" ;;
    esac
}
declare -A total
for v in "${variants[@]}"; do total[$v]=0; done
{
    echo "# $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD), PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $(nproc) cores, N=$N, ROUNDS=$ROUNDS"
    echo "# plain script sha256 $(sha256sum "$plain" | cut -c1-12), prototype sha256 $(sha256sum "$here/portable-generations/prototype.sql" | cut -c1-12)"
} | tee -a "$OUT"
for ((r = 0; r < ROUNDS; r++)); do
    order=("${variants[@]}")
    if ((r % 2 == 1)); then
        order=()
        for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[$i]}"); done
    fi
    line="round $((r + 1)):"
    for v in "${order[@]}"; do
        base=$(( (r * 16 + $(printf '%s\n' "${variants[@]}" | grep -nx "$v" | cut -d: -f1)) * 1000000 ))
        pre= post=
        if [ "$v" = ring0 ]; then
            pre="UPDATE proto.generations SET state = 'retired' WHERE slot BETWEEN 1 AND 4;"
            post="UPDATE proto.generations SET state = 'sealed' WHERE slot BETWEEN 1 AND 4;"
        fi
        [ -z "$pre" ] || psql -c "$pre"
        psql -c "CHECKPOINT"
        ms=$(psql -c '\timing on' -c "SELECT count(*) FILTER (WHERE $(call "$v")) FROM generate_series($base + 1, $base + $N) AS g" \
            | awk '/^Time:/ { print $2 }')
        [ -z "$post" ] || psql -c "$post"
        total[$v]=$(awk -v a="${total[$v]}" -v b="$ms" 'BEGIN { print a + b }')
        line+=" $v=$(awk -v ms="$ms" -v n="$N" 'BEGIN { printf "%.2f", ms * 1000 / n }')us"
    done
    echo "$line" | tee -a "$OUT"
done
p_us=$(awk -v t="${total[P]}" -v n="$N" -v r="$ROUNDS" 'BEGIN { print t * 1000 / n / r }')
for v in "${variants[@]}"; do
    awk -v t="${total[$v]}" -v n="$N" -v r="$ROUNDS" -v p="$p_us" -v v="$v" \
        'BEGIN { us = t * 1000 / n / r; printf "%-9s %.2f us per claim, %.3fx the time of P\n", v, us, us / p }'
done | tee -a "$OUT"
