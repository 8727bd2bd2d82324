#!/usr/bin/env bash
# `make package`: for each major (PG=17 for one), a Debian package
# target/packages/postgresql-<N>-dedup_<version>-1_amd64.deb with the PGDG/Debian layout
# (/usr/lib/postgresql/<N>/lib/, /usr/share/postgresql/<N>/extension/, Depends:
# postgresql-<N>), and a tarball of the same files, dedup-<version>-pg<N>-amd64.tar.gz,
# for other distributions (copy lib/ into `pg_config --pkglibdir` and extension/ into
# `pg_config --sharedir`/extension). Built by `cargo pgrx package` against the project's
# tree of that major (scripts/pg.sh). `--debug` packages the debug build instead (what the
# tests do, to reuse the build they already made); releases use the default, a release build.
source "$(dirname "$0")/lib.sh"
profile=()
[ "${1:-}" = --debug ] && profile=(--debug)
[ -n "${DEDUP_NO_SETUP:-}" ] || SETUP_MAJORS="$(pg_majors | xargs)" bash scripts/setup.sh demo
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
outdir=$ROOT/target/packages
mkdir -p "$outdir"
for major in $(pg_majors); do
    use_major "$major"
    step "PostgreSQL $major: cargo pgrx package ${profile[*]}"
    staging=$(mktemp -d)
    cargo pgrx package "${profile[@]}" --no-default-features --features "pg$major" \
        --pg-config "$PG_CONFIG" --out-dir "$staging/pgrx" >/dev/null
    # Lay the files out as PGDG's packages do.
    root=$staging/root
    lib=$root/usr/lib/postgresql/$major/lib
    ext=$root/usr/share/postgresql/$major/extension
    mkdir -p "$lib" "$ext"
    find "$staging/pgrx" -name 'dedup.so' -exec install -m 0644 {} "$lib/" \;
    # A release ships without debug symbols, as distributions' packages do.
    [ ${#profile[@]} -gt 0 ] || strip --strip-unneeded "$lib/dedup.so"
    find "$staging/pgrx" \( -name 'dedup.control' -o -name 'dedup--*.sql' \) -exec install -m 0644 {} "$ext/" \;
    [ -f "$lib/dedup.so" ] && [ -f "$ext/dedup.control" ] && [ -f "$ext/dedup--$version.sql" ] || {
        echo "cargo pgrx package did not produce dedup.so, dedup.control and dedup--$version.sql" >&2
        exit 1
    }
    doc=$root/usr/share/doc/postgresql-$major-dedup
    mkdir -p "$doc"
    install -m 0644 README.md CHANGELOG.md "$doc/"
    install -m 0644 LICENSE "$doc/copyright"
    # The tarball: the same files, relative to the tree's lib and share.
    tarball=$outdir/dedup-$version-pg$major-amd64.tar.gz
    tar czf "$tarball" --owner=0 --group=0 \
        -C "$root/usr/lib/postgresql/$major" lib \
        -C "$root/usr/share/postgresql/$major" extension \
        -C "$doc" README.md CHANGELOG.md copyright
    # The Debian package.
    mkdir -p "$root/DEBIAN"
    size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
    # The newest glibc symbol version the library needs.
    glibc=$(objdump -T "$lib/dedup.so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
    cat >"$root/DEBIAN/control" <<CONTROL
Package: postgresql-$major-dedup
Version: $version-1
Architecture: amd64
Maintainer: dedup developers <dedup@invalid>
Depends: postgresql-$major, libc6 (>= $glibc)
Section: database
Priority: optional
Installed-Size: $size
Description: exactly-once effects over at-least-once delivery for PostgreSQL $major
 dedup claims a job inside the transaction of its effect: the claim and the
 effect commit together or not at all, so a redelivered copy finds the claim
 and skips. Leases, stored results and fingerprints for external effects,
 retention pruned by a background worker, counters of duplicates absorbed.
CONTROL
    deb=$outdir/postgresql-$major-dedup_$version-1_amd64.deb
    dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
    rm -rf "$staging"
    printf '[package] %s\n[package] %s\n' "$deb" "$tarball" >&2
done
