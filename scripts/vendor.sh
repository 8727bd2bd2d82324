# The vendored test dependencies in pg_test/vendor/ (its README says what and why), pinned
# by pg_test/vendor/SHA256SUMS. Source it; do not run it.
VENDOR_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/pg_test/vendor

# vendored_sha256 NAME: the pinned sha256 of a vendored file.
vendored_sha256() {
    local sum
    sum=$(awk -v f="$1" '$2 == f { print $1 }' "$VENDOR_DIR/SHA256SUMS")
    [ -n "$sum" ] || { echo "$1 is not pinned in $VENDOR_DIR/SHA256SUMS" >&2; return 1; }
    echo "$sum"
}

# vendored NAME: the path of a vendored file, once its sha256 matches the pin.
vendored() {
    local want
    want=$(vendored_sha256 "$1")
    [ -f "$VENDOR_DIR/$1" ] || { echo "$VENDOR_DIR/$1 is missing" >&2; return 1; }
    if [ "$(sha256sum "$VENDOR_DIR/$1" | cut -d' ' -f1)" != "$want" ]; then
        echo "checksum mismatch for $VENDOR_DIR/$1: refusing it" >&2
        return 1
    fi
    echo "$VENDOR_DIR/$1"
}
