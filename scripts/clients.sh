#!/usr/bin/env bash
# `make clients`: the client packages as their registries take them, in target/clients/:
#   - clients/python: the wheel and the sdist (python -m build, in a venv of its own)
#   - clients/node:   the npm tarball (npm pack)
#   - clients/rust:   the crate (cargo package, which builds it from the packed files)
# Their tests are clients/*/test.sh (make test runs them). Publishing is a maintainer's step
# per registry: each package's README says how ("Releasing").
source "$(dirname "$0")/lib.sh"
out=${DEDUP_CLIENTS_DIR:-$ROOT/target/clients}
mkdir -p "$out"
build_venv=$(mktemp -d /tmp/dedup-clients-build-XXXXXX)
trap 'rm -rf "$build_venv"' EXIT

step "Python: the wheel and the sdist of clients/python"
python3 -m venv "$build_venv"
"$build_venv/bin/pip" install --quiet --disable-pip-version-check build==1.6.1
# From a copy: setuptools leaves build/ and an egg-info beside the sources it builds.
cp -r clients/python "$build_venv/src"
"$build_venv/bin/python" -m build --sdist --wheel --outdir "$out" "$build_venv/src" >/dev/null

step "Node.js: the npm tarball of clients/node"
(cd clients/node && npm pack --silent --pack-destination "$out" >/dev/null)

step "Rust: the crate of clients/rust"
# A target folder of its own: cargo package builds the packed copy under the same
# fingerprints as the crate itself, which a later build there could take for its own.
(cd clients/rust && CARGO_TARGET_DIR="$ROOT/target/clients-package" cargo package --quiet --allow-dirty)
cp "$ROOT/target/clients-package/package/"dedup-client-*.crate "$out/"

ls -l "$out" >&2
