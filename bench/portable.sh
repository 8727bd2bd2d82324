#!/usr/bin/env bash
# The pgbench comparison (docs/performance.md) for the portable edition: the hand-written
# claim against dedup.try_claim(bigint), native and portable, on ONE throwaway server of a
# PostgreSQL tree where the native dedup (a release build) is installed:
#   database nat:   CREATE EXTENSION dedup (dedup.so)
#   database port:  the portable edition's plain script (docs/portable.md), no extension
# The transactions are those of make bench (bench/*.sql: a claim plus its effect, random 63-bit
# job ids, pgbench -M prepared):
#   (b) bench/b_handwritten.sql in port       the guide's hand-written claim
#   (c) bench/c_try_claim_bigint.sql in nat    native try_claim(bigint)
#   (p) bench/c_try_claim_bigint.sql in port   portable try_claim(bigint)
# 1. Alternated runs, each transaction alone, in ABBA order: b c p in odd rounds, p c b in
#    even ones (so drift of a shared machine over a pair of rounds hits all three alike);
#    every run starts from empty tables after a CHECKPOINT. Ratios c/b and p/b of claims
#    per second: the sum of a variant's tps over all rounds over the sum of b's, and per
#    pair of rounds.
# 2. Side by side (bench/mixed.sh, the method of docs/performance.md): b and p in one pgbench run in port,
#    b and c in one run in nat; latency(b) / latency(x) per round, median.
#
# Usage:
#   bash bench/portable.sh [PLAIN_SCRIPT]
# PLAIN_SCRIPT: the portable edition's dedup.plain.sql (make portable, or
#   python3 scripts/portable.py NATIVE_SCRIPT VERSION OUTDIR); default $DEDUP_PORTABLE_PLAIN,
#   else target/portable/dedup.plain.sql. It must be generated from the native script of
#   the version installed in the tree.
# Env:
#   DEDUP_PG_BINDIR  bin directory of the tree (default: the project's PostgreSQL 15 tree,
#                    scripts/pg.sh); its dedup.so is what (c) measures
#   PORT (54329)     the server listens only on a socket in its own directory under /tmp
#   CLIENTS (8), THREADS (2), SECONDS_PER_RUN (15), SYNC_MODES ("off on"): as make bench
#   ROUNDS (4)       alternated rounds per synchronous_commit mode (even: whole ABBA pairs)
#   MIXED_ROUNDS (3) side-by-side rounds per database and mode; 0 leaves them out
#   PRELOAD (1)      shared_preload_libraries = dedup and dedup.prune_interval = 0, as the
#                    runs of docs/performance.md (the native claims count into dedup.stats); 0: not loaded
#                    (nat's backends load dedup.so on first use, port's never)
#   OUT              results file, appended (default bench/results/<commit>-portable.txt,
#                    <commit> being HEAD's; /dev/null keeps nothing); the summary is printed
#   KEEP_DATA (0)    1 keeps the server's directory
# Run as root, the server runs as the user postgres (runuser); else as the caller. Takes
# about (ROUNDS * 3 + 2 * MIXED_ROUNDS) * (SECONDS_PER_RUN + 3) s per mode: 10 min for
# both modes with the defaults. Example, as `make bench` would call it after
# `make portable`:
#   DEDUP_PG_BINDIR=$(pg_config --bindir) bash bench/portable.sh target/portable/dedup.plain.sql
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$root/scripts/pg.sh"
bindir=${DEDUP_PG_BINDIR:-$(pg_tree 15)/bin}
plain=${1:-${DEDUP_PORTABLE_PLAIN:-$root/target/portable/dedup.plain.sql}}
PORT=${PORT:-54329}
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
ROUNDS=${ROUNDS:-4}
MIXED_ROUNDS=${MIXED_ROUNDS:-3}
SYNC_MODES=${SYNC_MODES:-"off on"}
PRELOAD=${PRELOAD:-1}
commit=$(git -C "$root" rev-parse --short HEAD)
OUT=${OUT:-$root/bench/results/$commit-portable.txt}

[ -f "$plain" ] || { echo "bench/portable.sh: no plain script at $plain (make portable)" >&2; exit 1; }
plain=$(cd "$(dirname "$plain")" && pwd)/$(basename "$plain")
[ -x "$bindir/pgbench" ] || { echo "bench/portable.sh: no pgbench in $bindir" >&2; exit 1; }
sharedir=$("$bindir/pg_config" --sharedir)
[ -f "$sharedir/extension/dedup.control" ] \
    || { echo "bench/portable.sh: the native dedup is not installed in $sharedir" >&2; exit 1; }

# The throwaway server: its own directory, a socket there and no TCP port.
conf=("# bench/portable.sh" "max_connections = 50" "fsync = on" "shared_buffers = 1GB"
      "max_wal_size = 8GB" "checkpoint_timeout = 30min")
[ "$PRELOAD" != 1 ] || conf+=("shared_preload_libraries = 'dedup'" "dedup.prune_interval = 0")
throwaway_server "$bindir" "$PORT" dedup-portable-bench "${conf[@]}"
dir=$THROWAWAY_DIR

export PGHOST=$dir PGPORT=$PORT PGUSER=postgres
unset PGDATABASE PGSERVICE PGOPTIONS
export DEDUP_PG_BINDIR=$bindir OUT
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -d postgres -c "CREATE DATABASE nat" -c "CREATE DATABASE port"
psql -d nat -c "CREATE EXTENSION dedup" -f "$here/schema.sql" \
    -c "ALTER DATABASE nat SET dedup.warn_outside_transaction = off"
psql -d port -c "SET client_min_messages = warning" -f "$plain" -f "$here/schema.sql"

portable_changed=$(git -C "$root" diff --quiet HEAD -- sql/portable && echo "as committed" \
    || echo "with uncommitted changes")
{
    echo "# $(date -u +%FT%TZ) commit $commit (working tree: sql/portable $portable_changed), PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $(nproc) cores"
    echo "# native: dedup $(psql -At -d nat -c "SELECT extversion FROM pg_extension WHERE extname = 'dedup'") from $bindir/..; portable: $(psql -At -d port -c "SELECT obj_description('dedup'::regnamespace, 'pg_namespace')") from $plain (sha256 $(sha256sum "$plain" | cut -c1-12))"
    psql -At -d nat -c "SELECT '# settings: ' || string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM pg_settings WHERE name IN ('shared_buffers', 'max_wal_size', 'fsync', 'wal_level', 'checkpoint_timeout', 'shared_preload_libraries')"
} | tee -a "$OUT"

# 1. Alternated runs in ABBA order.
lines="$dir/lines"
: >"$lines"
run() {  # run NAME DATABASE SCRIPT SYNC ROUND
    local db
    for db in nat port; do
        psql -d "$db" -c "TRUNCATE effects, my_processed, dedup.processed"
    done
    psql -d postgres -c "CHECKPOINT"
    local report tps
    report=$(PGOPTIONS="-c synchronous_commit=$4" "$bindir/pgbench" -n -M prepared \
        -c "$CLIENTS" -j "$THREADS" -T "$SECONDS_PER_RUN" -f "$here/$3.sql" "$2" 2>&1) \
        || { echo "pgbench failed:" >&2; echo "$report" >&2; exit 1; }
    tps=$(echo "$report" | awk '/^tps = / {print $3}')
    [ -n "$tps" ] || { echo "no tps in pgbench's report:" >&2; echo "$report" >&2; exit 1; }
    echo "sync=$4 round=$5 $1 tps=$tps" | tee -a "$OUT" "$lines"
}
echo "# alternated: pgbench -M prepared -c $CLIENTS -j $THREADS -T $SECONDS_PER_RUN, $ROUNDS rounds, ABBA order (b c p, p c b, ...): b_handwritten in port, c_native_try_claim_bigint in nat, p_portable_try_claim_bigint in port" | tee -a "$OUT"
for sync in $SYNC_MODES; do
    for round in $(seq "$ROUNDS"); do
        order="b c p"
        [ $((round % 2)) = 0 ] && order="p c b"
        for v in $order; do
            case $v in
                b) run b_handwritten port b_handwritten "$sync" "$round" ;;
                c) run c_native_try_claim_bigint nat c_try_claim_bigint "$sync" "$round" ;;
                p) run p_portable_try_claim_bigint port c_try_claim_bigint "$sync" "$round" ;;
            esac
        done
    done
done

# 2. Side by side, one database at a time (pgbench connects to one database).
if [ "$MIXED_ROUNDS" -gt 0 ]; then
    mkdir -p "$dir/scripts"
    cp "$here/b_handwritten.sql" "$dir/scripts/b_handwritten.sql"
    cp "$here/c_try_claim_bigint.sql" "$dir/scripts/c_native_try_claim_bigint.sql"
    cp "$here/c_try_claim_bigint.sql" "$dir/scripts/p_portable_try_claim_bigint.sql"
    for db in port nat; do
        variant=p_portable_try_claim_bigint
        [ "$db" = nat ] && variant=c_native_try_claim_bigint
        echo "# side by side in database $db" | tee -a "$OUT"
        PGDATABASE=$db SCRIPTS="$dir/scripts" ROUNDS=$MIXED_ROUNDS CLIENTS=$CLIENTS THREADS=$THREADS \
            SECONDS_PER_RUN=$SECONDS_PER_RUN SYNC_MODES=$SYNC_MODES \
            TRUNCATE="effects, my_processed, dedup.processed" \
            bash "$here/mixed.sh" b_handwritten "$variant" | tee -a "$lines"
    done
fi

# The summary, from this run's lines only.
python3 - "$lines" <<'PY' | tee -a "$OUT"
import re, statistics, sys
from collections import defaultdict

B, C, P = "b_handwritten", "c_native_try_claim_bigint", "p_portable_try_claim_bigint"
tps = defaultdict(dict)    # (sync, round) -> {variant: tps}
side = defaultdict(list)   # (sync, variant) -> [latency(b) / latency(variant)] per round
mixed = {}                 # the latencies of the current side-by-side round
for line in open(sys.argv[1]):
    if m := re.match(r"sync=(\w+) round=(\d+) (\w+) tps=([\d.]+)", line):
        tps[(m[1], int(m[2]))][m[3]] = float(m[4])
    elif m := re.match(r"mixed sync=(\w+) round=\d+ (\w+) latency_ms=([\d.]+)", line):
        # a round is two lines: b_handwritten and the claim variant, in either order
        mixed[m[2]] = float(m[3])
        if len(mixed) == 2:
            v = next(k for k in mixed if k != B)
            side[(m[1], v)].append(mixed[B] / mixed[v])
            mixed = {}

print("# summary: ratios of claims per second to b_handwritten (1.000 = as fast as the hand-written claim)")
for sync in dict.fromkeys(s for s, _ in sorted(tps, key=lambda k: (k[0] != "off", k[1]))):
    rounds = sorted(r for s, r in tps if s == sync)
    per = [tps[(sync, r)] for r in rounds]
    total = {v: sum(x[v] for x in per) for v in (B, C, P)}
    pairs = [(per[i], per[i + 1]) for i in range(0, len(per) - 1, 2)]
    def pair_ratios(v):
        return [(a[v] + b[v]) / (a[B] + b[B]) for a, b in pairs]
    med = {v: statistics.median(x[v] for x in per) for v in (B, C, P)}
    print(f"summary alternated sync={sync} rounds={len(rounds)} median tps: b {med[B]:.0f}, c {med[C]:.0f}, p {med[P]:.0f}")
    for name, v in (("c/b", C), ("p/b", P)):
        pr = pair_ratios(v)
        rng = f" (ABBA pairs {', '.join(f'{x:.3f}' for x in pr)})" if pr else ""
        print(f"summary alternated sync={sync} {name} = {total[v] / total[B]:.3f}{rng}")
    print(f"summary alternated sync={sync} p/c = {total[P] / total[C]:.3f}")
for (sync, v), rs in sorted(side.items(), key=lambda k: (k[0][0] != "off", k[0][1])):
    name = "c/b (nat)" if v == C else "p/b (port)"
    print(f"summary side-by-side sync={sync} {name} = {statistics.median(rs):.3f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in rs)})")
PY
