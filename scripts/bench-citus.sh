#!/usr/bin/env bash
# `make bench-citus`: the Citus comparison of docs/citus.md on a release build, in a
# throwaway Citus cluster (a coordinator and two workers) of the project's tree of
# CITUS_BENCH_MAJOR (default 17). Results are appended to bench/results/<commit>-citus.txt.
source "$(dirname "$0")/lib.sh"
major=${CITUS_BENCH_MAJOR:-17}
PG=$major bash scripts/setup.sh   # Citus into this major's tree (citus_test_major)
use_major "$major"
cargo build --quiet -p dedup-pg-test --bin with-server
commit=$(git log -1 --format=%h -- src sql Cargo.toml dedup.control)$(git diff --quiet HEAD -- src sql Cargo.toml || echo "-dirty")
mkdir -p bench/results
out="bench/results/$commit-citus.txt"
step "PostgreSQL $major: build and install the extension (release)"
install_extension --release
step "PostgreSQL $major + Citus: pgbench (results in $out)"
echo "# commit $commit, PostgreSQL $major, $(nproc) cores, synchronous_commit off, shared_buffers 512MB" | tee -a "$out"
target/debug/with-server --citus --conf shared_buffers=512MB --conf synchronous_commit=off \
    --conf max_wal_size=4GB --conf dedup.prune_interval=0 \
    -- env OUT="$out" bash bench/citus/run.sh
python3 bench/citus/summarize.py "$out"
