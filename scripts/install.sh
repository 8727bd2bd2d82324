#!/usr/bin/env bash
# `make install PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config`: a release build of dedup
# installed into the server that pg_config describes (its major, 15 to 18, chooses the
# build). The only command of the project that touches a server it does not own. Needs
# that server's headers (postgresql-server-dev-<N> on Debian and PGDG).
source "$(dirname "$0")/lib.sh"
target=${1:-$(command -v pg_config || true)}
[ -n "$target" ] && [ -x "$target" ] || { echo "make install PG_CONFIG=/path/to/pg_config" >&2; exit 2; }
major=$("$target" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
if [ -z "${PG_RELEASE[$major]:-}" ]; then
    echo "PostgreSQL $major is not supported: dedup supports ${PG_MAJORS_ALL[*]}" >&2
    exit 2
fi
bash scripts/setup.sh
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(--sudo)
step "release build for PostgreSQL $major, installed with $target"
cargo pgrx install --release "${sudo[@]}" --no-default-features --features "pg$major" --pg-config "$target"
