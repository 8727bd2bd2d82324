#!/usr/bin/env bash
# One idempotent setup path, used by every Makefile target and by .ci/run.
#
# Installs what building and testing dedup needs on Debian 12 and does nothing
# that is already done, so a re-run on a ready machine takes seconds:
#   - Debian packages: PostgreSQL 15 server and headers, libclang/clang (bindgen),
#     sudo (cargo pgrx test --runas uses it), redis-server (the experiment starts a
#     throwaway one; the package's own service is never started); extra packages via
#     DEDUP_EXTRA_PKGS
#   - cargo-pgrx, exactly the version Cargo.toml pins
#   - `cargo pgrx init` against Debian's PostgreSQL 15 (downloads nothing)
set -euo pipefail

PG_MAJOR=15
PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- Debian packages ---------------------------------------------------------
pkgs=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-contrib libclang-dev clang sudo redis-server)
# shellcheck disable=SC2206
pkgs+=(${DEDUP_EXTRA_PKGS:-})
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    # Never let a package start a service of its own (a PostgreSQL cluster on 5432, a
    # Redis on 6379): where no policy-rc.d forbids it already, one does for the install.
    policy=/usr/sbin/policy-rc.d
    own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# dedup setup.sh: no service starts during this install\nexit 101\n' |
            as_root tee "$policy" >/dev/null
        as_root chmod 755 "$policy"
        own_policy=1
        trap 'as_root rm -f "$policy"' EXIT
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ -n "$own_policy" ]; then
        as_root rm -f "$policy"
        trap - EXIT
    fi
else
    log "Debian packages present"
fi

# --- cargo-pgrx ----------------------------------------------------------------
export PATH="$HOME/.cargo/bin:$PATH"
if cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    log "cargo-pgrx $PGRX_VERSION present"
else
    log "installing cargo-pgrx $PGRX_VERSION (about 6.5 minutes on 2 cores)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

# --- cargo pgrx init -----------------------------------------------------------
cfg="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
if [ -f "$cfg" ] && grep -q "^pg$PG_MAJOR = \"$PG_CONFIG\"" "$cfg"; then
    log "pgrx already initialised for pg$PG_MAJOR"
else
    log "cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"
    cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG" >/dev/null
fi

log "ready"
