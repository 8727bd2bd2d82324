#!/usr/bin/env bash
# `make demo` as a new user runs it, from nothing: a plain `git clone` of this repository's
# HEAD into a temporary folder with nothing beside it, DEDUP_PG_ROOT and PGRX_HOME pointing
# at new empty folders, then `make demo` there. It must print the experiment's table with
# dedup.try_claim at 0 duplicates, 0 missing after a crash, 0 duplicates after a crash.
# .ci/run runs it first, on every run. Arguments go to the experiment (.ci/run: --runs 1,
# one run of each strategy with and without the crash; the order of setup is what is
# tested, and `make demo` itself runs two). Uncommitted changes are not in the clone.
# cargo-pgrx stays where it is installed (one `cargo install` line that a new machine runs
# the same way) and Debian's packages are the machine's; everything else starts empty.
source "$(dirname "$0")/lib.sh"
started=$(date +%s)
dir=$(mktemp -d /tmp/dedup-fresh-XXXXXX)
# The postgres system user runs the demo's servers from the tree under $dir/pg.
chmod 755 "$dir"
# The trees under it belong to root (setup unpacks them as root, or with sudo).
trap 'if [ "$(id -u)" -eq 0 ]; then rm -rf "$dir"; else sudo rm -rf "$dir"; fi' EXIT
step "make demo from a plain clone in $dir (empty DEDUP_PG_ROOT and PGRX_HOME)"
git clone --quiet "$ROOT" "$dir/main"
out=$dir/demo.out
(
    cd "$dir/main"
    # The caches are the new folders, and none of the variables that point the scripts at
    # a tree, a major or a build folder comes from this checkout's environment.
    env -u DEDUP_PG_CONFIG -u DEDUP_PG_BINDIR -u DEDUP_PG_MAJOR -u SETUP_MAJORS -u PG \
        -u CITUS_MAJORS -u CARGO_TARGET_DIR \
        DEDUP_PG_ROOT="$dir/pg" PGRX_HOME="$dir/pgrx" \
        make demo ARGS="$*"
) 2>&1 | tee "$out"
# The table's row for dedup.try_claim: | title | duplicates | guide | missing after a crash |
# guide | duplicates after a crash | guide | missing, no crash | seconds |
row=$(grep '^| dedup.try_claim + effect in one transaction ' "$out" | tail -1 || true)
[ -n "$row" ] || { echo "[fresh-demo] make demo printed no row for dedup.try_claim" >&2; exit 1; }
counts=$(echo "$row" | awk -F'|' '{ gsub(/ /, ""); print $3 "/" $5 "/" $7 "/" $9 }')
if [ "$counts" != "0/0/0/0" ]; then
    echo "[fresh-demo] dedup.try_claim: duplicates/missing after a crash/duplicates after a crash/missing = $counts, not 0/0/0/0" >&2
    exit 1
fi
printf '[fresh-demo] make demo from a plain clone passed in %s s: dedup.try_claim at 0/0/0\n' \
    $(($(date +%s) - started)) >&2
