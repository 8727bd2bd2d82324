# Shared by the scripts in this directory. Source it; do not run it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
PG_CONFIG=${DEDUP_PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export DEDUP_PG_CONFIG=$PG_CONFIG

step() { printf '\n==> %s\n' "$*" >&2; }

# Build the extension and install it into the server's directories ($1: --release or empty).
install_extension() {
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(--sudo)
    cargo pgrx install "$@" "${sudo[@]}" --pg-config "$PG_CONFIG"
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
