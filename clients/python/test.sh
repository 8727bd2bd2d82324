#!/usr/bin/env bash
# The Python client's tests, as a user gets the package: build the wheel, install it with
# the pinned test dependencies (test-requirements.txt) into a fresh venv, start a
# PostgreSQL with dedup and a Redis of our own, run tests/ against them (the Celery
# end-to-end test starts its own workers), stop everything and remove what it made.
#
#   PG_BINDIR=/path/to/postgresql/bin bash clients/python/test.sh
#
# Environment: PG_BINDIR (a PostgreSQL tree where CREATE EXTENSION dedup works; default:
# pg_config --bindir), DEDUP_CLIENT_PG_PORT (55432), DEDUP_CLIENT_REDIS_PORT (56379),
# PYTHON (python3), REDIS_SERVER (redis-server), PYTEST_ARGS (extra pytest arguments,
# e.g. "-k celery"). The last line printed (stdout) is "python client: N passed, M failed",
# after everything is stopped and removed; the exit status is non-zero on any failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
PG_PORT=${DEDUP_CLIENT_PG_PORT:-55432}
REDIS_PORT=${DEDUP_CLIENT_REDIS_PORT:-56379}
if [ -z "${PG_BINDIR:-}" ]; then
    PG_BINDIR=$(pg_config --bindir 2>/dev/null) || {
        echo "test.sh: set PG_BINDIR to the bin folder of a PostgreSQL with dedup installed" >&2
        echo "python client: 0 passed, 1 failed"
        exit 1
    }
fi
command -v "$REDIS_SERVER" >/dev/null || {
    echo "test.sh: $REDIS_SERVER not found (Debian: apt-get install redis-server)" >&2
    echo "python client: 0 passed, 1 failed"
    exit 1
}

started=$(date +%s)
work=$(mktemp -d /tmp/dedup-py-XXXXXX)
chmod 755 "$work"
pgdata=$work/pg/data
redis_pid=""
as_postgres=()
if [ "$(id -u)" -eq 0 ]; then
    as_postgres=(runuser -u postgres --)
fi

# What the last line says; a failure before the tests ran (a build, an install, a server
# that did not start) counts as one failed test.
passed=0
failed=1

cleanup() {
    status=$?
    set +e
    # Celery workers the end-to-end test started, if it could not stop them (each is a
    # process group of its own).
    if [ -f "$work/worker.pids" ]; then
        while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null; done <"$work/worker.pids"
    fi
    if [ -f "$pgdata/postmaster.pid" ]; then
        "${as_postgres[@]}" "$PG_BINDIR/pg_ctl" -D "$pgdata" -m immediate -w stop >/dev/null 2>&1
    fi
    printf '[test.sh] PostgreSQL stopped (%s s)\n' $(($(date +%s) - started)) >&2
    if [ -n "$redis_pid" ]; then
        kill "$redis_pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -rf "$work"
    printf '[test.sh] stopped and removed (%s s)\n' $(($(date +%s) - started)) >&2
    echo "python client: $passed passed, $failed failed"
    if [ "$failed" -ne 0 ] && [ "$status" -eq 0 ]; then status=1; fi
    exit $status
}
trap cleanup EXIT

phase() { printf '[test.sh] %s (%s s)\n' "$1" $(($(date +%s) - started)) >&2; }

# 1. The wheel, built from a copy of the sources (setuptools writes build/ and *.egg-info
#    beside them) with the build backend pinned in pyproject.toml.
mkdir "$work/source"
cp -R "$here/pyproject.toml" "$here/MANIFEST.in" "$here/README.md" "$here/CHANGELOG.md" "$here/LICENSE" \
    "$here/src" "$work/source/"
rm -rf "$work/source/src/"*.egg-info
find "$work/source" -name __pycache__ -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/source" >&2
wheel=$(ls "$work"/dist/dedup_client-*.whl)
phase "built $(basename "$wheel")"

# 2. A fresh venv with the wheel and the pinned test dependencies, nothing else.
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    -r "$here/test-requirements.txt" "$wheel" >&2
phase "venv ready"

# 3. PostgreSQL (as the postgres system user when run as root) and Redis, ours alone.
mkdir -p "$work/pg"
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$work/pg"; fi
"${as_postgres[@]}" "$PG_BINDIR/initdb" -D "$pgdata" -A trust -U postgres -E UTF8 --locale=C \
    --no-sync >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log" >&2; exit 1; }
"${as_postgres[@]}" "$PG_BINDIR/pg_ctl" -D "$pgdata" -l "$work/pg/log" -w \
    -o "-p $PG_PORT -k $work/pg -c listen_addresses='' -c fsync=off -c max_connections=100" \
    start >/dev/null || { cat "$work/pg/log" >&2; exit 1; }
"$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" --logfile "$work/redis.log" --daemonize yes --pidfile "$work/redis.pid" >/dev/null
for _ in $(seq 50); do [ -s "$work/redis.pid" ] && break; sleep 0.1; done
redis_pid=$(cat "$work/redis.pid")
phase "PostgreSQL on $work/pg:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT"

# 4. The tests, from a folder that holds no copy of the package: `import dedup` is the wheel's
#    (-s: the end-to-end runs print one line each).
set +e
(
    cd "$work"
    export DEDUP_TEST_PGHOST=$work/pg DEDUP_TEST_PGPORT=$PG_PORT \
        DEDUP_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0 DEDUP_TEST_REPO=$root \
        DEDUP_TEST_WHEEL=$wheel DEDUP_TEST_WORK=$work PYTHONPATH=$here/tests \
        PYTHONDONTWRITEBYTECODE=1
    # shellcheck disable=SC2086
    "$work/venv/bin/python" -m pytest -p no:cacheprovider -q -s -rfE --junitxml="$work/junit.xml" \
        ${PYTEST_ARGS:-} "$here/tests"
)
rc=$?
set -e
phase "tests done (pytest exit $rc)"

read -r passed failed < <("$work/venv/bin/python" - "$work/junit.xml" "$rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    passed, failed = total - bad - skipped, bad + skipped  # a skip is a test that did not run
except Exception:
    passed, failed = 0, 1
if sys.argv[2] != "0" and failed == 0:
    failed = 1  # pytest failed without a failing test (a crash, no test collected)
print(passed, failed)
EOF
)
# The exit trap stops the servers, removes $work and prints the last line.
[ "$failed" -eq 0 ]
