#!/usr/bin/env bash
# `make portable`: the portable edition (docs/portable.md), generated from the native
# extension's own install script, never kept by hand:
#   1. `cargo pgrx schema`: the install script pgrx generates from src/ and sql/ (the one
#      `CREATE EXTENSION dedup` runs), for PostgreSQL 15 (the SQL is the same for every major)
#   2. scripts/portable.py replaces each of its `LANGUAGE c` functions by the function of the
#      same signature in sql/portable/, and fails when one is missing, extra or different
# Writes target/portable/: dedup--VERSION.sql, dedup.pgtle.sql (pg_tle registration),
# dedup.plain.sql (a plain script, re-runnable), dedup.to-native.sql (the switch to the
# native extension, every row kept).
source "$(dirname "$0")/lib.sh"
[ -n "${DEDUP_NO_SETUP:-}" ] || bash scripts/setup.sh demo
use_major "$DEDUP_PG_MAJOR"
out=${DEDUP_PORTABLE_DIR:-$ROOT/target/portable}
mkdir -p "$out"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
step "the native install script of dedup $version (cargo pgrx schema)"
cargo pgrx schema "pg$PG_MAJOR" --no-default-features --features "pg$PG_MAJOR" \
    --pg-config "$PG_CONFIG" --out "$out/native.sql"
step "the portable edition of dedup $version in $out"
python3 scripts/portable.py "$out/native.sql" "$version" "$out"
ls -l "$out" >&2
