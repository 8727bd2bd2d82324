#!/usr/bin/env bash
# pg_tle and pg_cron in the system's PostgreSQL 15 (Debian's), for the tests of the
# portable edition only (scripts/portable-test.sh): a server where dedup.so does not exist,
# as on a managed service. pg_tle 1.5.2 is built from the vendored source (Apache-2.0, a
# test dependency, never shipped); pg_cron is Debian's postgresql-15-cron. Records what it
# built in DEDUP_PG_ROOT (with the project's trees), so a re-run takes a second and a new
# root (CI's, every run) builds it again.
#
# The source is vendored (pg_test/vendor/, with its licence), checked against its sha256 in
# pg_test/vendor/SHA256SUMS.
set -euo pipefail
source "$(dirname "$0")/pg.sh"
source "$(dirname "$0")/vendor.sh"

PGTLE_VERSION=1.5.2
PGTLE_SHA256=$(vendored_sha256 "pg_tle-$PGTLE_VERSION.tar.gz")
pg_config=/usr/lib/postgresql/15/bin/pg_config

log() { printf '[pg_tle] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian's PostgreSQL 15 with its headers, pg_cron and flex: scripts/setup.sh installs them.
for p in postgresql-15 postgresql-server-dev-15 postgresql-15-cron flex make gcc; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        log "the Debian package $p is missing: run scripts/setup.sh"
        exit 1
    fi
done

stamp=$PG_ROOT/.dedup-pg_tle-system-15
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PGTLE_VERSION $PGTLE_SHA256" ] &&
    [ -f "$("$pg_config" --pkglibdir)/pg_tle.so" ]; then
    log "pg_tle $PGTLE_VERSION present in the system's PostgreSQL 15"
    exit 0
fi
tarball=$(vendored "pg_tle-$PGTLE_VERSION.tar.gz")
build=$(mktemp -d)
t0=$(date +%s)
log "building pg_tle $PGTLE_VERSION against the system's PostgreSQL 15 (seconds) ..."
tar xzf "$tarball" -C "$build"
(
    cd "$build"/pg_tle-*
    make -s -j"$(nproc)" PG_CONFIG="$pg_config" >/dev/null 2>"$build/make.log" || { tail -40 "$build/make.log" >&2; exit 1; }
    as_root make -s install PG_CONFIG="$pg_config" >/dev/null
)
rm -rf "$build"
as_root mkdir -p "$PG_ROOT"
echo "$PGTLE_VERSION $PGTLE_SHA256" | as_root tee "$stamp" >/dev/null
log "pg_tle $PGTLE_VERSION installed in $(($(date +%s) - t0)) s"
