#!/usr/bin/env bash
# `make demo`: set up everything, build and install the extension, then run the
# demonstration in a throwaway server of its own (stopped at the end, also on Ctrl-C).
source "$(dirname "$0")/lib.sh"
bash scripts/setup.sh
step "build and install the extension"
install_extension
step "demo"
cargo run --quiet -p dedup-pg-test --bin demo
