#!/usr/bin/env bash
# Instructions per transaction, counted by callgrind in a single-user server: repeatable
# for the same build whatever else the machine is doing. Each variant runs 3,000
# transactions of claim + effect through prepared statements (EXECUTE), after the same
# set-up and warm-up; the set-up alone is subtracted.
# EXTRA_SETUP: one more line of SQL for the set-up (e.g. an index to compare).
# PRELOAD=1: start the server with shared_preload_libraries = 'dedup' (the counters).
# SERVER_OPTS: more -c options for the server (e.g. "-c dedup.expired_memory=0").
# Needs valgrind and the extension installed (scripts/bench.sh does that); run as root
# (the server runs as postgres) or as a user that may run postgres.
set -euo pipefail
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
N=${N:-3000}
dir=$(mktemp -d /tmp/dedup-callgrind-XXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$dir"' EXIT
echo "# work directory $dir" >&2
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"
python3 - "$dir" "$N" "${EXTRA_SETUP:-}" <<'PY'
import random, sys
d, n, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3]
random.seed(1)
setup = """CREATE EXTENSION dedup;
CREATE TABLE effects (job_id bigint NOT NULL, payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE my_processed (job_id bigint PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
SET dedup.warn_outside_transaction = off;
PREPARE e(bigint) AS INSERT INTO effects (job_id, payload) VALUES ($1, 'receipt');
PREPARE b(bigint) AS INSERT INTO my_processed (job_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING job_id;
PREPARE c(bigint) AS SELECT dedup.try_claim($1::bigint);
PREPARE d(text) AS SELECT dedup.try_claim($1::text, 'bench');
""" + (extra + "\n" if extra else "")
def txn(v, i):
    claim = {"a": "", "b": f"EXECUTE b({i});\n", "c": f"EXECUTE c({i});\n", "d": f"EXECUTE d('{i}');\n"}[v]
    return f"BEGIN;\n{claim}EXECUTE e({i});\nCOMMIT;\n"
ids = lambda k: [random.randrange(1, 9 * 10**18) for _ in range(k)]
open(f"{d}/setup.sql", "w").write(setup + "".join(txn(v, i) for v in "abcd" for i in ids(200)))
for v in "abcd":
    open(f"{d}/{v}.sql", "w").write("".join(txn(v, i) for i in ids(n)))
open(f"{d}/none.sql", "w").write("")
PY
as_pg "$bindir/initdb" -D "$dir/pristine" -A trust --no-sync >/dev/null
count() {
    rm -rf "$dir/data" && as_pg cp -a "$dir/pristine" "$dir/data"
    cat "$dir/setup.sql" "$dir/$1.sql" | as_pg valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$1" \
        "$bindir/postgres" --single -D "$dir/data" -c synchronous_commit=off ${PRELOAD:+-c shared_preload_libraries=dedup} ${SERVER_OPTS:-} postgres >"$dir/$1.log" 2>&1
    sed -n 's/^totals: //p' "$dir/cg.$1"
}
base=$(count none)
for v in a b c d; do
    total=$(count "$v")
    echo "$v $(( (total - base) / N )) instructions per transaction"
done
