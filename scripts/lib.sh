# Shared by the scripts in this directory. Source it; do not run it. Sourcing it runs no
# PostgreSQL binary (a new machine has none before scripts/setup.sh): a script calls
# use_major after its setup (pg_test/tests/scripts.rs holds every script to that).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
source "$ROOT/scripts/pg.sh"
# The major the demo and the benchmark use (the tests run every major: scripts/test.sh).
DEDUP_PG_MAJOR=${DEDUP_PG_MAJOR:-15}
export DEDUP_PG_MAJOR

# The integration tests left out where a run covers the core only (the majors between the
# oldest and the newest, and the portable edition's plain script): the client examples and
# the experiment, and the tests of the worker, the soak, the fuzzing, the counters, the
# copies counted after expiry, the docs, logical replication, operations, the lifecycle,
# retention, leases, security and generations (all of them run on the oldest and the
# newest major). What stays is the core: claims, batches, concurrency, crashes, isolation,
# the upgrade.
DEDUP_CORE_SKIP="examples:: experiment:: worker:: soak:: fuzz:: stats:: expired:: docs:: logical:: operations:: lifecycle:: retention:: leases:: security:: generations::"

# Each step says when it began, in seconds since the first script of the run sourced this
# file (DEDUP_RUN_STARTED, inherited by the scripts it runs): where a slow run's time went.
DEDUP_RUN_STARTED=${DEDUP_RUN_STARTED:-$(date +%s)}
export DEDUP_RUN_STARTED
step() { printf '\n==> %s  [at %s s]\n' "$*" $(($(date +%s) - DEDUP_RUN_STARTED)) >&2; }

# Point the build and the tests at one major's tree (scripts/pg.sh), once setup installed it.
use_major() {
    PG_MAJOR=$1
    PG_CONFIG=$(pg_config_of "$1")
    export DEDUP_PG_CONFIG=$PG_CONFIG
    export DEDUP_PG_BINDIR
    DEDUP_PG_BINDIR=$("$PG_CONFIG" --bindir)
}

# Build the extension for the current major and install it into that major's tree
# ($1: --release or empty). Never into a tree whose server is running (tests stop theirs).
install_extension() {
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(--sudo)
    cargo pgrx install "$@" "${sudo[@]}" --no-default-features --features "pg$PG_MAJOR" \
        --pg-config "$PG_CONFIG"
    # Full install scripts of released versions other than the current one, for the
    # upgrade test (pg_test/fixtures holds the oldest one).
    local extdir version
    extdir="$("$PG_CONFIG" --sharedir)/extension"
    version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
    local f
    for f in pg_test/fixtures/dedup--*.sql; do
        [ -e "$f" ] || continue
        [ "$(basename "$f")" = "dedup--$version.sql" ] && continue
        if [ "$(id -u)" -eq 0 ]; then cp "$f" "$extdir/"; else sudo cp "$f" "$extdir/"; fi
    done
}
