#!/usr/bin/env bash
# Citus, for the scale-out tests only (a test dependency, AGPL-3.0, never shipped with
# dedup): builds the vendored Citus source once into the project's PostgreSQL tree of each
# major Citus supports (CITUS_MAJORS in scripts/pg.sh: 16, 17, 18) and records what it
# built there, so a re-run takes a second. `scripts/citus.sh 17` builds for one major.
#
# The source is vendored (pg_test/vendor/, with its licence): the project's machines reach no
# download site beyond the package registries. It is checked against its sha256 in
# pg_test/vendor/SHA256SUMS. The build is recorded in each tree, so a new DEDUP_PG_ROOT
# builds it again.
set -euo pipefail
source "$(dirname "$0")/pg.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)

CITUS_VERSION=14.0.1
source "$ROOT/scripts/vendor.sh"
CITUS_SHA256=$(vendored_sha256 "citus-$CITUS_VERSION.tar.gz")

log() { printf '[citus] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

present() {
    local major=$1 tree pg_config stamp
    tree=$(pg_tree "$major")
    pg_config="$tree/bin/pg_config"
    stamp="$tree/.dedup-citus"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$CITUS_VERSION $CITUS_SHA256" ] &&
        [ -f "$("$pg_config" --pkglibdir)/citus.so" ]
}

todo=()
for major in ${1:-${CITUS_MAJORS[*]}}; do
    if present "$major"; then
        log "Citus $CITUS_VERSION present in $(pg_tree "$major")"
    else
        todo+=("$major")
    fi
done
[ ${#todo[@]} -eq 0 ] && exit 0

tarball=$(vendored "citus-$CITUS_VERSION.tar.gz")

pkgs=(libkrb5-dev liblz4-dev libzstd-dev libcurl4-openssl-dev make gcc)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for major in "${todo[@]}"; do
    tree=$(pg_tree "$major")
    pg_config="$tree/bin/pg_config"
    stamp="$tree/.dedup-citus"
    build=$(mktemp -d)
    t0=$(date +%s)
    log "building Citus $CITUS_VERSION against PostgreSQL ${PG_RELEASE[$major]} (about 30 s on 2 cores) ..."
    tar xzf "$tarball" -C "$build"
    (
        cd "$build"/citus-*
        ./configure --quiet PG_CONFIG="$pg_config" >/dev/null
        make -s -j"$(nproc)" >/dev/null 2>"$build/make.log" || { tail -40 "$build/make.log" >&2; exit 1; }
        as_root make -s install >/dev/null
    )
    as_root chmod -R a+rX "$tree"
    rm -rf "$build"
    echo "$CITUS_VERSION $CITUS_SHA256" | as_root tee "$stamp" >/dev/null
    log "Citus $CITUS_VERSION installed into $tree in $(($(date +%s) - t0)) s"
done
