#!/usr/bin/env bash
# `make bench`: the pgbench comparison of docs/performance.md, on a release build in a throwaway
# server of the project's own tree. Settings come from the environment (see
# bench/pgbench.sh); results are appended to bench/results/<commit>.txt (one major) or
# bench/results/<commit>-pg<N>.txt (several) and summarised.
#   make bench                      the whole comparison on PostgreSQL 15 (DEDUP_PG_MAJOR)
#   make bench PG="15 16 17 18"     on each of those majors
#   RATIO_ONLY=1 make bench PG=...  only the side-by-side try_claim / hand-written ratio
#   STATS_ONLY=1 make bench          only the counters on/off comparison
#   BATCH_ONLY=1 make bench          only the batches of 100 (bench/batch/run.sh)
source "$(dirname "$0")/lib.sh"
majors=${PG:-$DEDUP_PG_MAJOR}
SETUP_MAJORS="$majors" bash scripts/setup.sh demo
cargo build --quiet -p dedup-pg-test --bin with-server
# Results are named after the last commit that changed the extension itself.
commit=$(git log -1 --format=%h -- src sql Cargo.toml dedup.control)$(git diff --quiet HEAD -- src sql Cargo.toml || echo "-dirty")
mkdir -p bench/results
for major in $majors; do
    PG=$major pg_majors >/dev/null
    use_major "$major"
    out="bench/results/$commit.txt"
    [ "$(echo $majors | wc -w)" -eq 1 ] || out="bench/results/$commit-pg$major.txt"
    step "PostgreSQL $major: build and install the extension (release)"
    install_extension --release
    step "PostgreSQL $major: pgbench (results in $out)"
    # Preloaded (the counters of dedup.stats count; the worker does not prune: interval 0).
    target/debug/with-server --conf shared_buffers=1GB --conf max_wal_size=8GB \
        --conf checkpoint_timeout=30min --conf shared_preload_libraries=dedup --conf dedup.prune_interval=0 \
        --db bench -- env OUT="$out" BENCH_COMMIT="$commit" bash "bench/${BATCH_ONLY:+batch/}run.sh"
    if [ -z "${RATIO_ONLY:-}${STATS_ONLY:-}${BATCH_ONLY:-}" ]; then
        step "PostgreSQL $major: instructions per transaction (callgrind)"
        bash bench/callgrind.sh | sed 's/^/callgrind /' | tee -a "$out"
    fi
    python3 bench/summarize.py "$out"
done
