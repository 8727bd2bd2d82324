#!/usr/bin/env bash
# The behaviours of PostgreSQL the portable edition's protocol across generations relies on
# (docs/design/generations.md, "Everywhere dedup runs"), checked on a throwaway server of
# a tree; exits 1 if any differs:
#   1. In REPEATABLE READ, SELECT ... FOR SHARE of a row that a transaction committed
#      after the snapshot updated (no key changed) raises 40001; FOR KEY SHARE returns the
#      old row without error.
#   2. A prepared transaction holds no virtualxid lock (its backend's is released at
#      PREPARE TRANSACTION), and an insertion of its key waits for it.
#   3. A row a transaction inserted and then deleted is still waited for by another
#      insertion of its key until that transaction ends.
# Usage: DEDUP_PG_BINDIR=... bash bench/portable-generations/facts.sh   (PORT: 54332)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/scripts/pg.sh"
bindir=${DEDUP_PG_BINDIR:-$(pg_tree 15)/bin}
PORT=${PORT:-54332}
throwaway_server "$bindir" "$PORT" dedup-facts "max_prepared_transactions = 5"
dir=$THROWAWAY_DIR
export PGHOST=$dir PGPORT=$PORT PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -At "$@"; }
failed=0
check() {   # check WHAT GOT WANT
    if [ "$2" = "$3" ]; then echo "ok: $1: $2"; else echo "FAILED: $1: got '$2', want '$3'"; failed=1; fi
}
# The SQLSTATE of STATEMENT run with a lock_timeout of 500 ms, "none" if it succeeded.
timed_out() {
    local out
    out=$(psql -v VERBOSITY=sqlstate -c "SET lock_timeout = '500ms'" -c "$1" 2>&1 || true)
    grep -oE '^(ERROR: +)?[0-9A-Z]{5}$' <<<"$out" | grep -oE '[0-9A-Z]{5}$' | head -1 | grep . || echo none
}
psql -c "CREATE TABLE g (n int PRIMARY KEY, state text)" -c "CREATE TABLE t (k text PRIMARY KEY)"

# 1. FOR SHARE and FOR KEY SHARE in REPEATABLE READ after a committed update
for mode in "KEY SHARE" "SHARE"; do
    psql -c "TRUNCATE g" -c "INSERT INTO g VALUES (1, 'current')"
    out=$( { printf "BEGIN ISOLATION LEVEL REPEATABLE READ;\nSELECT state FROM g;\nSELECT pg_sleep(1);\nSELECT state FROM g WHERE n = 1 FOR %s;\nCOMMIT;\n" "$mode" | psql -v VERBOSITY=sqlstate 2>&1 || true; } &
             sleep 0.3; psql -c "UPDATE g SET state = 'sealing' WHERE n = 1"; wait)
    case $mode in
        "KEY SHARE") check "FOR KEY SHARE after a committed update" "$(echo "$out" | sed -n 3p)" "current" ;;
        SHARE) check "FOR SHARE after a committed update" "$(echo "$out" | grep -o '40001' | head -1)" "40001" ;;
    esac
done

# 2. a prepared transaction: no virtualxid lock, and its key is waited for
printf "BEGIN;\nINSERT INTO t VALUES ('a');\nPREPARE TRANSACTION 'p1';\n" | psql
# (pg_locks shows a prepared transaction's locks with no pid: its transactionid lock is
# there, its virtualxid is not)
check "locks of no backend after PREPARE TRANSACTION, by type" \
    "$(psql -c "SELECT string_agg(locktype, ',' ORDER BY locktype) FROM pg_locks WHERE pid IS NULL AND locktype IN ('virtualxid', 'transactionid')")" "transactionid"
check "an insertion of a prepared transaction's key waits for it" \
    "$(timed_out "INSERT INTO t VALUES ('a') ON CONFLICT DO NOTHING")" "55P03"
psql -c "ROLLBACK PREPARED 'p1'"

# 3. a row inserted and deleted by a transaction still in progress is waited for
{ printf "BEGIN;\nINSERT INTO t VALUES ('b');\nDELETE FROM t WHERE k = 'b';\nSELECT pg_sleep(1.5);\nCOMMIT;\n" | psql >/dev/null; } &
sleep 0.3
check "an insertion of a key inserted and deleted by a transaction in progress waits" \
    "$(timed_out "INSERT INTO t VALUES ('b') ON CONFLICT DO NOTHING")" "55P03"
wait
echo "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}')"
exit "$failed"
