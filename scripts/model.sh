#!/usr/bin/env bash
# The SPIN model of the claim protocol across generations (pg_test/model/generations.pml):
# an exhaustive search of the protocol (no bitstate hashing), which must find no error,
# then of each mutation, which must find the error it is meant to find. Needs spin
# (apt-get install spin) and gcc only; builds and runs in a temporary directory.
#   bash scripts/model.sh           the protocol (3 claimers), its progress check, aborts at
#                                   any step (any number with 2 claimers, one with 3); the
#                                   same with the epoch and a deleter (-DEPOCH -DDELETER;
#                                   aborts with 2 claimers only); two series' current
#                                   generations with a deleter (-DSERIES -DDELETER: its
#                                   progress, one abort with 3 claimers); the portable
#                                   edition's protocol (-DPORTABLE -DDELETER -DRR
#                                   -DPREPARE: aborts with 2 claimers; its progress without
#                                   the deleter); and the mutations: about 330 s of CPU
#                                   time on two cores (about 190 s of wall time) and 8 GB
#                                   of memory at most (two searches at once)
#   bash scripts/model.sh --full    also any number of aborts with 3 claimers, and one
#                                   abort with 3 in the portable edition: about 4 more
#                                   minutes and 6 GB of memory
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL="$ROOT/pg_test/model/generations.pml"

full=
case "${1:-}" in
    "") ;;
    --full) full=1 ;;
    *) echo "usage: $0 [--full]" >&2; exit 2 ;;
esac
if ! command -v spin >/dev/null; then
    echo "[model] spin is not installed: apt-get install spin (the SPIN model checker)" >&2
    exit 1
fi
if ! command -v gcc >/dev/null; then
    echo "[model] gcc is not installed: apt-get install gcc" >&2
    exit 1
fi

work=$(mktemp -d /tmp/dedup-model-XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$MODEL" "$work/generations.pml"
cd "$work"
start=$SECONDS
failed=0

# verify CFLAGS PANFLAGS DEFINES...: generate, compile and run pan; its output is in pan.out.
verify() {
    local cflags=$1 panflags=$2
    shift 2
    rm -f pan pan.* ./*.trail
    if ! spin "$@" -a generations.pml >spin.out 2>&1; then
        cat spin.out >&2
        echo "[model] spin -a $* failed" >&2
        exit 1
    fi
    # -w: pan.c's generated code draws warnings from recent gcc that say nothing about
    # the model.
    gcc -w -O2 $cflags -o pan pan.c
    ./pan $panflags -m100000 >pan.out 2>&1 || true
}

# The number of states stored, as an integer (pan writes large counts as 1.2e+07).
states() {
    awk '/states, stored/ { printf "%d", $1; exit }' pan.out
}

# What pan found: the first error line, or nothing.
found() {
    grep -m1 -E '^pan:[0-9]+: ' pan.out | sed -E 's/^pan:[0-9]+: //; s/ \(at depth [0-9]+\)$//' || true
}

# A search that ran to its end: exhaustive, not cut short by the depth bound or memory.
complete() {
    grep -q 'Full statespace search' pan.out &&
        ! grep -qE 'max search depth too small|out of memory|hash table is full' pan.out
}

# protocol NAME CFLAGS PANFLAGS DEFINES...: must run to its end with no error.
protocol() {
    local name=$1 t0=$SECONDS
    shift
    verify "$@"
    local err
    err=$(found)
    if [ -n "$err" ] || ! grep -q 'errors: 0' pan.out; then
        echo "[model] $name: FAILED: ${err:-see the output of pan below}" >&2
        cat pan.out >&2
        if ls ./*.trail >/dev/null 2>&1; then
            echo "[model] the counterexample (spin -t -p):" >&2
            shift 2
            spin "$@" -t -p -g generations.pml >&2 || true
        fi
        failed=1
    elif ! complete; then
        echo "[model] $name: FAILED: the search did not run to its end" >&2
        cat pan.out >&2
        failed=1
    else
        echo "[model] $name: $(states) states, no error ($((SECONDS - t0)) s)"
    fi
}

# mutation NAME WANT CFLAGS PANFLAGS DEFINES...: pan must report WANT (a pattern of its
# error line).
mutation() {
    local name=$1 want=$2
    shift 2
    verify "$@"
    local err
    err=$(found)
    if [ -z "$err" ]; then
        echo "[model] mutation $name: no error found, but it must fail ($(states) states)" >&2
        failed=1
    elif ! grep -qE "$want" <<<"$err"; then
        echo "[model] mutation $name: found \"$err\", not the error it must cause ($want)" >&2
        failed=1
    else
        echo "[model] mutation $name: $err, as it must be"
    fi
}

# The two longest searches (about 100 s and 35 s) run beside the others, in a directory of
# their own, so that the two cores of a CI machine share the work; their lines are printed
# at the end.
mkdir longest
cp generations.pml longest/
(
    cd longest
    failed=0
    protocol "protocol, epoch and deleter, progress" "-DNP" "-l" -DEPOCH -DDELETER
    protocol "portable edition, repeatable read, prepared, progress" "-DNP" "-l" \
        -DPORTABLE -DRR -DPREPARE
    exit "$failed"
) >longest.log 2>&1 &
longest=$!

# The protocol: assertions and invalid end states (deadlocks), then non-progress cycles.
protocol "protocol" "-DSAFETY" ""
protocol "protocol, progress" "-DNP" "-l"
# Aborts at any step: any number of them with 2 claimers, one with 3 (--full: any number
# with 3).
protocol "protocol, aborts at any step, 2 claimers" "-DSAFETY" "" -DKILL -DNC=2
protocol "protocol, one abort at any step, 3 claimers" "-DSAFETY" "" -DKILL -DKILL_ONE
if [ -n "$full" ]; then
    protocol "protocol, aborts at any step, 3 claimers" "-DSAFETY" "" -DKILL
fi
# With the epoch (a stale generation list) and a deleter (forget, a lease moving).
protocol "protocol, epoch and deleter" "-DSAFETY" "" -DEPOCH -DDELETER
protocol "protocol, epoch and deleter, aborts at any step, 2 claimers" "-DSAFETY" "" \
    -DEPOCH -DDELETER -DKILL -DNC=2
# Two series' current generations, a scope moved between them at any time (a retention
# changed), with a deleter; its progress; one abort at any step.
protocol "two series and deleter" "-DSAFETY" "" -DSERIES -DDELETER
protocol "two series and deleter, progress" "-DNP" "-l" -DSERIES -DDELETER
protocol "two series and deleter, one abort at any step" "-DSAFETY" "" \
    -DSERIES -DDELETER -DKILL -DKILL_ONE
# The portable edition's protocol (SQL only: no epoch, the catalog read again after the
# insertion, a generation not sealed cross-checked by an INSERT ... ON CONFLICT DO NOTHING
# that is rolled back, PostgreSQL's deadlock detector), with a deleter, each claimer in
# READ COMMITTED or REPEATABLE READ and maybe prepared; aborts at any step (its progress
# runs beside, above; --full: one abort with 3 claimers).
protocol "portable edition, deleter, repeatable read, prepared" "-DSAFETY" "" \
    -DPORTABLE -DDELETER -DRR -DPREPARE
protocol "portable edition, deleter, repeatable read, prepared, aborts at any step, 2 claimers" \
    "-DSAFETY" "" -DPORTABLE -DDELETER -DRR -DPREPARE -DKILL -DNC=2
if [ -n "$full" ]; then
    protocol "portable edition, repeatable read, prepared, one abort at any step, 3 claimers" \
        "-DSAFETY" "" -DPORTABLE -DRR -DPREPARE -DKILL -DKILL_ONE
fi

# The mutations. -E (ignore invalid end states) when the error must be an assertion
# violation, -A (ignore assertions) when it must be an invalid end state, so that pan's
# first error is of the kind looked for.
mutation NO_RECHECK 'assertion violated .*sealed' "-DSAFETY" "-E" -DNO_RECHECK
mutation CHECK_BEFORE_INSERT 'assertion violated .*wins' "-DSAFETY" "-E" -DCHECK_BEFORE_INSERT
mutation BOTH_WAIT 'invalid end state' "-DSAFETY" "-A" -DBOTH_WAIT
mutation WAIT_END_AFTER_TOKEN 'invalid end state' "-DSAFETY" "-A" -DWAIT_END_AFTER_TOKEN
mutation NO_WAIT 'non-progress cycle' "-DNP" "-l -A -E" -DNO_WAIT
mutation "NO_RECHECK (epoch)" 'assertion violated .*sealed' "-DSAFETY" "-E" -DEPOCH -DNO_RECHECK
mutation NO_EPOCH_AFTER_INSERT 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DEPOCH -DDELETER -DNO_EPOCH_AFTER_INSERT
mutation CACHE_ODD_EPOCH 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DEPOCH -DDELETER -DCACHE_ODD_EPOCH
mutation ONE_INCREMENT 'invalid end state' "-DSAFETY" "-A" -DEPOCH -DDELETER -DONE_INCREMENT
mutation NO_INCREMENT_BEFORE 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DEPOCH -DDELETER -DNO_INCREMENT_BEFORE
mutation SKIP_UNCHECKED 'assertion violated .*wins' "-DSAFETY" "-E" -DEPOCH -DSKIP_UNCHECKED
mutation OWN_SERIES_ONLY 'assertion violated .*wins' "-DSAFETY" "-E" -DSERIES -DOWN_SERIES_ONLY
mutation OLDER_SKIPS 'assertion violated .*wins' "-DSAFETY" "-E" -DSERIES -DOLDER_SKIPS
mutation NO_WAIT_DELETER 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DEPOCH -DDELETER -DNO_WAIT_DELETER
mutation P_NO_REREAD 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DPORTABLE -DDELETER -DRR -DPREPARE -DP_NO_REREAD
mutation P_WAITS_IN_PUBLICATION 'assertion violated .*sealed' "-DSAFETY" "-E" \
    -DPORTABLE -DDELETER -DRR -DPREPARE -DP_WAITS_IN_PUBLICATION
mutation P_NO_PREPARED_LIST 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DPORTABLE -DDELETER -DRR -DPREPARE -DP_NO_PREPARED_LIST
mutation P_RR_SNAPSHOT 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DPORTABLE -DDELETER -DRR -DPREPARE -DP_RR_SNAPSHOT
mutation P_SELECT_UNSEALED 'assertion violated .*wins' "-DSAFETY" "-E" \
    -DPORTABLE -DDELETER -DRR -DPREPARE -DP_SELECT_UNSEALED
mutation P_NO_DETECTOR 'invalid end state' "-DSAFETY" "-A" -DPORTABLE -DP_NO_DETECTOR

wait "$longest" || failed=1
cat longest.log
if [ "$failed" -ne 0 ]; then
    echo "[model] FAILED ($((SECONDS - start)) s)" >&2
    exit 1
fi
echo "[model] all passed ($((SECONDS - start)) s)"
