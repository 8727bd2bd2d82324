#!/usr/bin/env bash
# pg_tle and pg_cron in the system's PostgreSQL 15 (Debian's), for the tests of the
# portable edition only (scripts/portable-test.sh): a server where dedup.so does not exist,
# as on a managed service. pg_tle 1.5.2 is built from the vendored source (Apache-2.0, a
# test dependency, never shipped); pg_cron is Debian's postgresql-15-cron. Records what it
# built, so a re-run takes a second.
#
# The source cannot be downloaded here: it is read from DEDUP_PGTLE_TARBALL, default
# ../shared/vendor/pg_tle-1.5.2.tar.gz beside the repository, and checked against its sha256.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

PGTLE_VERSION=1.5.2
PGTLE_SHA256=4adfc063109da259a50e294a6010a9db1ca6cc3672fbe422042fc6f315813748
tarball=${DEDUP_PGTLE_TARBALL:-$ROOT/../shared/vendor/pg_tle-$PGTLE_VERSION.tar.gz}
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

stamp=$("$pg_config" --sharedir)/extension/.dedup-pg_tle
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PGTLE_VERSION $PGTLE_SHA256" ] &&
    [ -f "$("$pg_config" --pkglibdir)/pg_tle.so" ]; then
    log "pg_tle $PGTLE_VERSION present in the system's PostgreSQL 15"
    exit 0
fi
if [ ! -f "$tarball" ]; then
    log "the pg_tle $PGTLE_VERSION source is not at $tarball (set DEDUP_PGTLE_TARBALL)"
    exit 1
fi
if [ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$PGTLE_SHA256" ]; then
    log "checksum mismatch for $tarball: refusing it"
    exit 1
fi
build=$(mktemp -d)
log "building pg_tle $PGTLE_VERSION against the system's PostgreSQL 15"
tar xzf "$tarball" -C "$build"
(
    cd "$build"/pg_tle-*
    make -s -j"$(nproc)" PG_CONFIG="$pg_config" >/dev/null 2>"$build/make.log" || { tail -40 "$build/make.log" >&2; exit 1; }
    as_root make -s install PG_CONFIG="$pg_config" >/dev/null
)
rm -rf "$build"
echo "$PGTLE_VERSION $PGTLE_SHA256" | as_root tee "$stamp" >/dev/null
log "pg_tle $PGTLE_VERSION installed"
