#!/usr/bin/env bash
# Batches under callgrind: instructions per transaction of a batch of 100 new random job
# ids, claimed one of four ways (or none), then the batch's 100 effect rows, each
# transaction BEGIN; claim; effects; COMMIT through prepared statements (EXECUTE), in a
# single-user server (the method of bench/callgrind.sh: the same set-up and warm-up for
# every variant, then N transactions; the set-up alone is counted and subtracted).
#   a   the effects alone (no claim)
#   b   hand-written INSERT INTO my_processed (job_id bigint PRIMARY KEY) SELECT unnest($1)
#       ON CONFLICT DO NOTHING RETURNING job_id (bench/batch/b_handwritten_unnest.sql)
#   b2  the same into my_processed_text, laid out as dedup.processed (text scope and job
#       id COLLATE "C", PRIMARY KEY (job_id, scope), a timestamptz; bench/batch/run.sh)
#   b3  the same hand-written INSERT into dedup.processed itself (its 7 columns: the
#       layout's cost, without the extension's code)
#   c   SELECT dedup.try_claim_many($1::bigint[])
# Not run unless named in VARIANTS: bn and b2n, b and b2 as plain INSERTs (no ON CONFLICT:
# no conflict check before the insert, no speculative insertion; right for new ids only),
# what the claim would cost without INSERT ... ON CONFLICT's protocol.
# EXTRA_SETUP: more SQL for the set-up (one statement a line); SERVER_OPTS: more -c options.
# N: transactions per variant (300). VARIANTS: which ones ("a b b2 b3 c"). BATCH: ids per
# transaction (100). PRELOAD=1: shared_preload_libraries = 'dedup' (the counters, as
# scripts/bench.sh runs pgbench). KEEP=1 keeps the work directory (callgrind.out files
# cg.<variant>, the SQL, the logs). DIFF="c:b2 c:b3 b3:b2 b2:b" (the default when KEEP=1): the
# functions whose instructions per transaction differ most between two variants,
# exclusive and inclusive (callgrind_annotate), TOP of them (25).
# Needs valgrind and the extension installed in DEDUP_PG_BINDIR's tree; run as root (the
# server runs as postgres through runuser) or as a user that may run postgres.
set -euo pipefail
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
N=${N:-300}
BATCH=${BATCH:-100}
VARIANTS=${VARIANTS:-a b b2 b3 c}
TOP=${TOP:-25}
dir=$(mktemp -d /tmp/dedup-batch-callgrind-XXXX)
if [ -n "${KEEP:-}" ]; then DIFF=${DIFF-c:b2 c:b3 b3:b2 b2:b}; else DIFF=${DIFF-}; trap 'rm -rf "$dir"' EXIT; fi
echo "# work directory $dir" >&2
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"
python3 - "$dir" "$N" "$BATCH" "$VARIANTS" "${EXTRA_SETUP:-}" <<'PY'
import random, sys
d, n, batch, variants, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5]
random.seed(14)
setup = """CREATE EXTENSION dedup;
CREATE TABLE effects (job_id bigint NOT NULL, payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE my_processed (job_id bigint PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE my_processed_text (scope text COLLATE "C" NOT NULL, job_id text COLLATE "C" NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, scope));
SET dedup.warn_outside_transaction = off;
PREPARE e(bigint[]) AS INSERT INTO effects (job_id, payload) SELECT unnest($1), 'receipt';
PREPARE b(bigint[]) AS INSERT INTO my_processed (job_id) SELECT unnest($1) ON CONFLICT DO NOTHING RETURNING job_id;
PREPARE b2(bigint[]) AS INSERT INTO my_processed_text (scope, job_id) SELECT 'default', unnest($1)::text ON CONFLICT DO NOTHING RETURNING job_id;
PREPARE b3(bigint[]) AS INSERT INTO dedup.processed (scope, job_id) SELECT 'default', unnest($1)::text ON CONFLICT DO NOTHING RETURNING job_id;
PREPARE c(bigint[]) AS SELECT dedup.try_claim_many($1);
PREPARE bn(bigint[]) AS INSERT INTO my_processed (job_id) SELECT unnest($1) RETURNING job_id;
PREPARE b2n(bigint[]) AS INSERT INTO my_processed_text (scope, job_id) SELECT 'default', unnest($1)::text RETURNING job_id;
""" + (extra + "\n" if extra else "")
def txn(v, ids):
    arr = "'{" + ",".join(map(str, ids)) + "}'"
    claim = "" if v == "a" else f"EXECUTE {v}({arr});\n"
    return f"BEGIN;\n{claim}EXECUTE e({arr});\nCOMMIT;\n"
batches = lambda k: [[random.randrange(1, 9 * 10**18) for _ in range(batch)] for _ in range(k)]
# Warm-up, the same in every run: 200 transactions of each variant (b3 and c 100 each,
# into the same dedup.processed): every table holds 20,000 claims, every plan is cached.
warm = [("a", 200), ("b", 200), ("b2", 200), ("b3", 100), ("c", 100)]
open(f"{d}/setup.sql", "w").write(setup + "".join(txn(v, ids) for v, k in warm for ids in batches(k)))
for v in variants:
    open(f"{d}/{v}.sql", "w").write("".join(txn(v, ids) for ids in batches(n)))
open(f"{d}/none.sql", "w").write("")
PY
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"/*.sql
as_pg "$bindir/initdb" -D "$dir/pristine" -A trust --no-sync >/dev/null
count() {
    rm -rf "$dir/data" && as_pg cp -a "$dir/pristine" "$dir/data"
    cat "$dir/setup.sql" "$dir/$1.sql" | as_pg valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$1" \
        "$bindir/postgres" --single -D "$dir/data" -c synchronous_commit=off ${PRELOAD:+-c shared_preload_libraries=dedup} ${SERVER_OPTS:-} postgres >"$dir/$1.log" 2>&1
    if grep -q "ERROR" "$dir/$1.log"; then echo "# $1: errors, see $dir/$1.log" >&2; grep -m3 ERROR "$dir/$1.log" >&2; fi
    sed -n 's/^totals: //p' "$dir/cg.$1"
}
base=$(count none)
echo "# $(date -u +%FT%TZ) commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo ?), PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), N=$N batches of $BATCH, preload=${PRELOAD:-0}"
for v in $VARIANTS; do
    total=$(count "$v")
    echo "$v $(( (total - base) / N )) instructions per transaction"
done
rm -rf "$dir/data" "$dir/pristine"
# Per function, instructions per transaction: each variant's run less the set-up's (the
# same set-up and warm-up in every run), divided by N.
[ -n "$DIFF" ] || exit 0
for v in none $VARIANTS; do
    for inclusive in no yes; do
        callgrind_annotate --threshold=100 --inclusive=$inclusive "$dir/cg.$v" >"$dir/annotate.$v.incl-$inclusive.txt"
    done
done
python3 - "$dir" "$N" "$TOP" "$VARIANTS" "$DIFF" <<'PY'
import re, sys
d, n, top, variants, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()
line = re.compile(r"^\s*([\d,]+)\s+(?:\([\s\d.]+%\)\s+)?(\S.*?)(?:\s+\[(.*)\])?\s*$")
def read(f):
    out, started = {}, False
    for l in open(f):
        if "file:function" in l:
            started = True
            continue
        if not started or not l.strip() or l.startswith("-"):
            continue
        m = line.match(l)
        if m:
            name = m.group(2)
            if name.startswith("???:"):
                name = name[4:]
            elif re.match(r"^[./][^:]*:", name):
                name = name.split(":", 1)[1]
            obj = (m.group(3) or "").rsplit("/", 1)[-1]
            key = f"{name} [{obj}]" if obj else name
            out[key] = out.get(key, 0) + int(m.group(1).replace(",", ""))
    return out
for incl in ("no", "yes"):
    kind = "inclusive" if incl == "yes" else "exclusive"
    base = read(f"{d}/annotate.none.incl-{incl}.txt")
    per = {}
    for v in variants:
        raw = read(f"{d}/annotate.{v}.incl-{incl}.txt")
        per[v] = {k: (raw.get(k, 0) - base.get(k, 0)) / n for k in set(raw) | set(base)}
        with open(f"{d}/per-txn.{v}.{kind}.txt", "w") as f:
            for k, c in sorted(per[v].items(), key=lambda t: -t[1]):
                if abs(c) >= 1:
                    f.write(f"{c:12.0f}  {k}\n")
    for pair in pairs:
        x, y = pair.split(":")
        if x not in per or y not in per:
            continue
        rows = [(per[x].get(k, 0) - per[y].get(k, 0), per[x].get(k, 0), per[y].get(k, 0), k)
                for k in set(per[x]) | set(per[y])]
        print(f"\n# {x} - {y}, {kind} instructions per transaction (the {top} largest differences each way)")
        print(f"{'diff':>10} {x:>10} {y:>10}  function")
        for r in sorted(rows, key=lambda t: -t[0])[:top]:
            print("%10.0f %10.0f %10.0f  %s" % r)
        print("   ...")
        for r in sorted(rows, key=lambda t: t[0])[:top][::-1]:
            print("%10.0f %10.0f %10.0f  %s" % r)
PY
