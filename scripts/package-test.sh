#!/usr/bin/env bash
# The packages of `make package`, tested for one major ($1), by scripts/test.sh after that
# major's other tests (its debug build is packaged: the same files a release has, faster).
#   - every major: the .deb's control fields and file list, and the tarball's;
#   - 15: `dpkg -i` on this machine, a smoke test against the system's PostgreSQL 15
#     (CREATE EXTENSION, claims, the worker with shared_preload_libraries), then `dpkg -r`
#     must leave none of its files behind;
#   - 16 to 18 (Debian 12 has no such server): the package's files installed into a copy
#     of the project's tree of that major, and the same smoke test there.
source "$(dirname "$0")/lib.sh"
major=$1
use_major "$major"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DEDUP_NO_SETUP=1 PG=$major bash scripts/package.sh --debug
deb=$ROOT/target/packages/postgresql-$major-dedup_$version-1_amd64.deb
tarball=$ROOT/target/packages/dedup-$version-pg$major-amd64.tar.gz
fail() { echo "[package-test] PostgreSQL $major: $*" >&2; exit 1; }

# Control fields.
[ "$(dpkg-deb -f "$deb" Package)" = "postgresql-$major-dedup" ] || fail "Package field"
[ "$(dpkg-deb -f "$deb" Version)" = "$version-1" ] || fail "Version field"
[ "$(dpkg-deb -f "$deb" Architecture)" = amd64 ] || fail "Architecture field"
dpkg-deb -f "$deb" Depends | grep -q "^postgresql-$major, libc6 (>= 2\.[0-9]*)$" || fail "Depends field: $(dpkg-deb -f "$deb" Depends)"
# File list: the library, the control file, the install script, every upgrade script.
files=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')
want=("/usr/lib/postgresql/$major/lib/dedup.so"
      "/usr/share/postgresql/$major/extension/dedup.control"
      "/usr/share/postgresql/$major/extension/dedup--$version.sql"
      "/usr/share/doc/postgresql-$major-dedup/copyright")
for f in sql/dedup--*--*.sql; do want+=("/usr/share/postgresql/$major/extension/$(basename "$f")"); done
for f in "${want[@]}"; do
    grep -qx "$f" <<<"$files" || fail "$f is not in the package"
done
if grep -v -e "^/usr/lib/postgresql/$major/lib/" -e "^/usr/share/postgresql/$major/extension/" \
    -e "^/usr/share/doc/postgresql-$major-dedup/" <<<"$files" | grep -v '/$' | grep -q .; then
    fail "files outside the PGDG layout: $(grep -v -e "/$major/" <<<"$files" | grep -v '/$')"
fi
in_tarball=$(tar tzf "$tarball")
grep -qx lib/dedup.so <<<"$in_tarball" || fail "lib/dedup.so is not in the tarball"
grep -qx "extension/dedup--$version.sql" <<<"$in_tarball" || fail "the install script is not in the tarball"

smoke() { # $1: pg_config of the server to run
    DEDUP_PG_CONFIG=$1 target/debug/with-server \
        --conf shared_preload_libraries=dedup --conf dedup.prune_interval=1s --db smoke -- \
        bash scripts/smoke.sh "$version"
}

if [ "$major" = 15 ]; then
    sysconfig=/usr/lib/postgresql/15/bin/pg_config
    dpkg -i "$deb" >/dev/null || fail "dpkg -i"
    smoke "$sysconfig" || { dpkg -r "postgresql-$major-dedup" >/dev/null; fail "smoke test against the system's server"; }
    dpkg -r "postgresql-$major-dedup" >/dev/null || fail "dpkg -r"
    for f in "${want[@]}"; do
        [ ! -e "$f" ] || fail "$f is left behind after dpkg -r"
    done
    echo "[package-test] PostgreSQL 15: dpkg -i, smoke test against the system's server, dpkg -r: ok" >&2
else
    copy=$(mktemp -d /tmp/dedup-pkgtree-XXXXXX)
    trap 'rm -rf "$copy"' EXIT
    cp -a "$(pg_tree "$major")/." "$copy/"
    rm -f "$copy/lib/dedup.so" "$copy"/share/extension/dedup*
    unpacked=$(mktemp -d)
    dpkg-deb -x "$deb" "$unpacked"
    cp "$unpacked/usr/lib/postgresql/$major/lib/"* "$("$copy/bin/pg_config" --pkglibdir)/"
    cp "$unpacked/usr/share/postgresql/$major/extension/"* "$("$copy/bin/pg_config" --sharedir)/extension/"
    rm -rf "$unpacked"
    chmod -R a+rX "$copy"
    smoke "$copy/bin/pg_config" || fail "smoke test with the package's files"
    echo "[package-test] PostgreSQL $major: fields, file list, smoke test with the package's files: ok" >&2
fi
