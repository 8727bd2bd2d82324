#!/usr/bin/env bash
# `make bench`: the pgbench comparison of the README, on a release build in a throwaway
# server. Settings come from the environment (see bench/pgbench.sh); results are appended
# to bench/results/<commit>.txt and summarised.
source "$(dirname "$0")/lib.sh"
bash scripts/setup.sh
step "build and install the extension (release)"
install_extension --release
cargo build --quiet -p dedup-pg-test --bin with-server
# Results are named after the last commit that changed the extension itself.
commit=$(git log -1 --format=%h -- src sql Cargo.toml dedup.control)$(git diff --quiet HEAD -- src sql Cargo.toml || echo "-dirty")
mkdir -p bench/results
out="bench/results/$commit.txt"
step "pgbench (results in $out)"
# Preloaded (the counters of dedup.stats count; the worker does not prune: interval 0).
target/debug/with-server --conf shared_buffers=1GB --conf max_wal_size=8GB \
    --conf checkpoint_timeout=30min --conf shared_preload_libraries=dedup --conf dedup.prune_interval=0 \
    --db bench -- env OUT="$out" BENCH_COMMIT="$commit" bash bench/run.sh
step "instructions per transaction (callgrind)"
bash bench/callgrind.sh | sed 's/^/callgrind /' | tee -a "$out"
python3 bench/summarize.py "$out"
