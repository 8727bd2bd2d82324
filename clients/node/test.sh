#!/usr/bin/env bash
# The Node.js client's tests, on the package as a user gets it:
#   1. npm pack the package into a temporary folder;
#   2. a fresh Node project there: npm ci of the pinned pg, bullmq and ioredis
#      (test/package.json, test/package-lock.json), then npm install of the tarball alone;
#   3. a PostgreSQL of its own (PG_BINDIR, with dedup installed) and a Redis of its own, on
#      DEDUP_CLIENT_PG_PORT (default 55433) and DEDUP_CLIENT_REDIS_PORT (default 56380);
#   4. node --test on test/*.test.js, plus the checks below;
#   5. the last line: "node client: N passed, M failed"; non-zero exit on any failure.
# Both servers are stopped and the temporary folder removed on exit.
#
#   PG_BINDIR=/path/to/pg/bin bash clients/node/test.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

if [ -z "${PG_BINDIR:-}" ] && command -v pg_config >/dev/null; then PG_BINDIR=$(pg_config --bindir); fi
if [ -z "${PG_BINDIR:-}" ] || [ ! -x "$PG_BINDIR/pg_ctl" ]; then
    echo "test.sh: set PG_BINDIR to the bin folder of a PostgreSQL with dedup installed" >&2
    echo "node client: 0 passed, 1 failed"
    exit 1
fi
pg_port=${DEDUP_CLIENT_PG_PORT:-55433}
redis_port=${DEDUP_CLIENT_REDIS_PORT:-56380}
redis_server=${REDIS_SERVER:-redis-server}
started=$(date +%s)

tmp=$(mktemp -d /tmp/dedup-node-client-XXXXXX)
chmod 755 "$tmp"
as_postgres=()
if [ "$(id -u)" -eq 0 ]; then as_postgres=(runuser -u postgres --); fi
finished=0
cleanup() {
    local status=$?
    set +e
    if [ "$finished" -eq 0 ]; then # the harness itself stopped (a server, npm): one failure more
        echo "test.sh: the harness stopped with status $status (see above)" >&2
        echo "node client: $passed passed, $((failed + 1)) failed"
    fi
    if [ -f "$tmp/pg/postmaster.pid" ]; then
        "${as_postgres[@]}" "$PG_BINDIR/pg_ctl" -D "$tmp/pg" -m immediate -w stop >/dev/null 2>&1
    fi
    if [ -f "$tmp/redis.pid" ]; then kill "$(cat "$tmp/redis.pid")" 2>/dev/null; fi
    rm -rf "$tmp"
}
passed=0 failed=0
trap cleanup EXIT
check() { # check NAME COMMAND...: one counted check of the harness
    if "${@:2}"; then
        passed=$((passed + 1)); echo "ok - $1"
    else
        failed=$((failed + 1)); echo "not ok - $1"
    fi
}
finish() {
    finished=1
    echo "[node client] wall time $(($(date +%s) - started)) s"
    echo "node client: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

export npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
export npm_config_loglevel=warn

# 1. The package as it would be published.
mkdir "$tmp/pkg"
(cd "$here" && npm pack --silent --pack-destination "$tmp/pkg" >/dev/null)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -1)
tarball=$tmp/pkg/dedup-client-$version.tgz
check "the tarball is named for the extension's version ($version)" test -f "$tarball"
if [ ! -f "$tarball" ]; then finish; exit 1; fi
expected=$'package/CHANGELOG.md\npackage/LICENSE\npackage/README.md\npackage/bullmq.d.ts\npackage/bullmq.js\npackage/index.d.ts\npackage/index.js\npackage/package.json'
check "the tarball holds the package's files and nothing else" \
    test "$(tar tzf "$tarball" | sort)" = "$expected"
check "LICENSE is the repository's (the PostgreSQL licence)" cmp -s "$here/LICENSE" "$repo/LICENSE"
check "CHANGELOG.md has an entry for $version" grep -q "^## $version" "$here/CHANGELOG.md"

# 2. A fresh project: the pinned dependencies from the lock, then the tarball alone.
mkdir "$tmp/app"
cp "$here"/test/package.json "$here"/test/package-lock.json "$here"/test/*.js "$here"/test/*.ts "$tmp/app/"
(
    cd "$tmp/app"
    nice -n 10 npm ci --no-audit --no-fund
    nice -n 10 npm install --no-save --no-audit --no-fund "$tarball"
) >"$tmp/npm.log" 2>&1 || { cat "$tmp/npm.log" >&2; check "npm ci and npm install of the tarball" false; finish; exit 1; }
check "npm ci and npm install of the tarball" true
pinned() { # the installed versions are the lock's
    local name want got
    for name in pg bullmq ioredis; do
        want=$(node -p "require('$here/test/package.json').dependencies['$name']")
        got=$(node -p "require('$tmp/app/node_modules/$name/package.json').version")
        [ "$want" = "$got" ] || { echo "$name: $got, pinned $want" >&2; return 1; }
    done
}
check "pg, bullmq and ioredis at their pinned versions" pinned

# 3. The servers.
mkdir "$tmp/pg" "$tmp/redis"
chown postgres: "$tmp/pg" 2>/dev/null || true
"${as_postgres[@]}" "$PG_BINDIR/initdb" -D "$tmp/pg" -A trust -U postgres --no-sync >"$tmp/initdb.log" 2>&1 \
    || { cat "$tmp/initdb.log" >&2; exit 1; }
"${as_postgres[@]}" "$PG_BINDIR/pg_ctl" -D "$tmp/pg" -l "$tmp/pg/server.log" -w \
    -o "-p $pg_port -k /tmp -c listen_addresses='' -c fsync=off -c max_connections=60" start >/dev/null
"$redis_server" --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$tmp/redis.pid" --dir "$tmp/redis" --logfile "$tmp/redis/redis.log"
export PGHOST=/tmp PGPORT=$pg_port PGUSER=postgres PGDATABASE=dedup_client_test REDIS_PORT=$redis_port
"$PG_BINDIR/psql" -X -q -d postgres -c 'CREATE DATABASE dedup_client_test'
"$PG_BINDIR/psql" -X -q -c 'CREATE EXTENSION dedup'
for _ in $(seq 50); do
    if redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG; then break; fi
    sleep 0.1
done

# 4. The tests, one file at a time (they share the database).
cd "$tmp/app"
set +e
nice -n 10 node --test --test-concurrency=1 \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tmp/tap.txt" \
    package.test.js types.test.js input.test.js transaction.test.js run-once.test.js lease.test.js bullmq.test.js
status=$?
set -e
node_passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$tmp/tap.txt" | tail -1)
node_failed=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$tmp/tap.txt" | tail -1)
passed=$((passed + ${node_passed:-0}))
failed=$((failed + ${node_failed:-0}))
if [ "$status" -ne 0 ] && [ "${node_failed:-0}" -eq 0 ]; then failed=$((failed + 1)); fi
finish
