#!/usr/bin/env bash
# `make install PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config`: a release build of dedup
# installed into the server that pg_config describes (its major, 15 to 18, chooses the
# build). The only command of the project that touches a server it does not own.
# It needs what it says and nothing else: Rust, cargo-pgrx with its clang (scripts/setup.sh
# build installs the two when missing) and that server's headers (postgresql-server-dev-<N>
# on Debian and PGDG). No test tree, Redis, Node, Citus or other PostgreSQL is installed,
# and pgrx's own configuration (PGRX_HOME) is neither needed nor written: the build reads
# the server from PGRX_PG_CONFIG_PATH.
source "$(dirname "$0")/lib.sh"
target=${1:-$(command -v pg_config || true)}
[ -n "$target" ] && [ -x "$target" ] || { echo "make install PG_CONFIG=/path/to/pg_config" >&2; exit 2; }
major=$("$target" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
if [ -z "${PG_RELEASE[$major]:-}" ]; then
    echo "PostgreSQL $major is not supported: dedup supports ${PG_MAJORS_ALL[*]}" >&2
    exit 2
fi
if [ ! -f "$("$target" --includedir-server)/postgres.h" ]; then
    echo "$target has no server headers ($("$target" --includedir-server)/postgres.h is missing)." >&2
    echo "Install them first: on Debian and PGDG, apt-get install postgresql-server-dev-$major" >&2
    exit 2
fi
bash scripts/setup.sh build
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(--sudo)
step "release build for PostgreSQL $major, installed with $target (about 2 minutes on 2 cores)"
PGRX_PG_CONFIG_PATH=$target cargo pgrx install --release "${sudo[@]}" --no-default-features \
    --features "pg$major" --pg-config "$target"
