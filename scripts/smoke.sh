#!/usr/bin/env bash
# A smoke test of an installed dedup, run by scripts/package-test.sh inside `with-server`
# (PGHOST, PGPORT, PGUSER, PGDATABASE and DEDUP_PG_BINDIR set; the server preloads dedup
# and prunes every second). $1: the version that must be installed.
set -euo pipefail
want=$1
q() { "$DEDUP_PG_BINDIR/psql" -X -v ON_ERROR_STOP=1 -At -c "$1"; }
got=$(q "SELECT extversion FROM pg_extension WHERE extname = 'dedup'")
[ "$got" = "$want" ] || { echo "[smoke] version $got, not $want" >&2; exit 1; }
[ "$(q "SET dedup.warn_outside_transaction = off; SELECT dedup.try_claim('a')" | tail -1)" = t ] ||
    { echo "[smoke] the first claim was not true" >&2; exit 1; }
[ "$(q "SET dedup.warn_outside_transaction = off; SELECT dedup.try_claim('a')" | tail -1)" = f ] ||
    { echo "[smoke] the second claim was not false" >&2; exit 1; }
q "INSERT INTO dedup.processed VALUES ('default', 'old', now() - interval '8 days')" >/dev/null
for _ in $(seq 100); do
    if [ "$(q "SELECT count(*) FROM dedup.processed WHERE job_id = 'old'")" = 0 ]; then
        echo "[smoke] dedup $want: claims, and the worker pruned an expired claim" >&2
        exit 0
    fi
    sleep 0.2
done
echo "[smoke] the worker did not prune within 20 s" >&2
exit 1
