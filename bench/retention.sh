#!/usr/bin/env bash
# Retention at scale (docs/performance.md, "Retention at scale"; docs/design/generations.md):
# what keeping claims a retention and then removing them costs, against a server where
# nothing expires, measured side by side. Three servers of the same build run at the same
# time, with the same settings and the same load:
#   none    dedup.prune_interval = 0: nothing is ever removed;
#   prune   dedup.retention = R, dedup.prune_interval = PRUNE_INTERVAL: today's worker
#           deletes expired claims in batches (src/prune);
#   generations  the same settings, and dedup.use_generations() before the load: the
#           worker publishes a generation every R/4 and drops one once its retention has
#           passed (src/generations; docs/design/generations.md). Left out with
#           GENERATIONS=0.
# The load is CLIENTS pgbench clients per server, each calling try_claim_many of BATCH new
# bigint jobs as fast as it can (bench/retention/claims.sql, claims only, no effect), and
# one probe client per server claiming one new job PROBE_RATE times a second
# (bench/retention/probe.sql), whose latencies are the claim latencies reported.
# R is LIVE divided by the prune server's claim rate over a first CALIBRATE seconds, so
# that about LIVE claims are live once claims arrive and expire at the same rate; the run
# then lasts PERIODS + 1 retentions. Every SAMPLE seconds each server's WAL position,
# claim table and primary key sizes, live and dead tuples and vacuum counts are recorded;
# autovacuum's own log gives each vacuum's time.
# Reported per retention period and server: claims/s and its ratio prune/none, WAL bytes
# per claim and their ratio (in the periods after the first, every claim counted there
# also has its removal's WAL counted: the steady state), the server's CPU per claim (its
# backends, worker and autovacuum) and the ratio of claims per CPU second (the servers
# share the cores, so claims/s also moves with each one's share of them; CPU per claim
# does not), sizes at the period's end, most
# dead tuples seen, vacuums of the claim tables and their time, and the probe's 99th
# percentile and slowest claim, overall and within a second of a removal (a prune pass
# from its start to its end, a generation's drop or truncation, as each server logged them),
# and how long the claims of each generation dropped in the period were kept (kept_s: from
# its seal to its drop, the newest claim's least, to from its opening, the oldest's most).
# The claim tables are dedup.processed and, on the generations server, every generation
# dedup.processed_<n> that exists at the sample.
#
# Env: DEDUP_PG_BINDIR (a tree with a release build of dedup installed), PORT (55480: it
#      and the next), LIVE (20000000), RETENTION (seconds; skips the calibration),
#      CALIBRATE (30), PERIODS (3), BATCH (1000), CLIENTS (1), RATE (claims/s per
#      server; default as fast as the clients go), PROBE_RATE (20),
#      SAMPLE (10), SHARED_BUFFERS (64MB), PRUNE_INTERVAL (seconds; default R/10, at
#      least 1), GENERATIONS (1: run the third server), SERVER_OPTS (more -c settings
#      for every server, e.g. "-c dedup.generation_memory=64MB"), GENERATIONS_OPTS (more
#      -c settings for the generations server alone), OUT (results file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=${DEDUP_PG_BINDIR:-/usr/lib/postgresql/15/bin}
PORT=${PORT:-55480}
LIVE=${LIVE:-20000000}
CALIBRATE=${CALIBRATE:-30}
PERIODS=${PERIODS:-3}
BATCH=${BATCH:-1000}
CLIENTS=${CLIENTS:-1}
PROBE_RATE=${PROBE_RATE:-20}
SAMPLE=${SAMPLE:-10}
SHARED_BUFFERS=${SHARED_BUFFERS:-64MB}
OUT=${OUT:-/dev/null}
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
dir=$(mktemp -d /tmp/dedup-bench-retention-XXXX)
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"
names=(none prune generations)
servers=(0 1 2)
[ "${GENERATIONS:-1}" = 1 ] || { names=(none prune); servers=(0 1); }
stop() {
    pkill -f "pgbench.*$dir" 2>/dev/null || true
    # How the generations server's summaries were made: filled as the claims went in, or
    # read at the seal, and why not the first.
    [ ! -f "$dir/log2" ] || grep -oE "(summarised generation [0-9]+( as its claims went in)?|did not (open|summarise)[^:]*:[^;(]*|the summary generation [0-9]+ filled as its claims went in[^:]*)" "$dir/log2" \
        | sed -E 's/[0-9]+/N/g; s/^/# generations: /' | sort | uniq -c | sort -rn | head -20 >>"$OUT" || true
    for s in "${servers[@]}"; do as_pg "$bindir/pg_ctl" -D "$dir/data$s" -m immediate stop >/dev/null 2>&1 || true; done
    rm -rf "$dir"
}
trap stop EXIT
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -U postgres "$@"; }
say() { echo "$*" | tee -a "$OUT"; }

for s in "${servers[@]}"; do
    as_pg "$bindir/initdb" -D "$dir/data$s" -A trust --no-sync >/dev/null
    # In postgresql.conf, not on the command line, where it would hide the prune server's
    # ALTER SYSTEM below.
    echo "dedup.prune_interval = 0" >>"$dir/data$s/postgresql.conf"
    as_pg "$bindir/pg_ctl" -D "$dir/data$s" -l "$dir/log$s" -w -o "-p $((PORT + s)) -k $dir -c listen_addresses='' \
        -c shared_preload_libraries=dedup -c synchronous_commit=off \
        -c shared_buffers=$SHARED_BUFFERS -c max_wal_size=4GB -c log_autovacuum_min_duration=0 \
        -c log_line_prefix='%m ' ${SERVER_OPTS:-} $([ "$s" = 2 ] && echo "${GENERATIONS_OPTS:-}")" start >/dev/null
    psql -p $((PORT + s)) -d postgres -c "CREATE DATABASE bench"
    psql -p $((PORT + s)) -d bench -c "CREATE EXTENSION dedup" \
         -c "ALTER DATABASE bench SET dedup.warn_outside_transaction = off"
done
# The generations server keeps its claims in generations from the first one on.
[ "${#servers[@]}" = 2 ] || psql -p $((PORT + 2)) -d bench -c "SELECT dedup.use_generations()" >/dev/null

# RATE claims/s per server, or as fast as the clients go.
throttle=()
[ -z "${RATE:-}" ] || throttle=(-R "$(python3 -c "print($RATE / $BATCH)")")
# The load, in the background until killed: CLIENTS batch clients and one probe client per
# server, each transaction logged (client, transaction, latency us, script, epoch s, us).
load() {
    for s in "${servers[@]}"; do
        "$bindir/pgbench" -h "$dir" -U postgres -p $((PORT + s)) -n -M prepared -c "$CLIENTS" -j 1 -T 100000 "${throttle[@]}" \
            -D batch="$BATCH" -f "$here/retention/claims.sql" -l --log-prefix="$dir/$1-load$s" bench >/dev/null 2>&1 &
        "$bindir/pgbench" -h "$dir" -U postgres -p $((PORT + s)) -n -M prepared -c 1 -j 1 -T 100000 -R "$PROBE_RATE" \
            -f "$here/retention/probe.sql" -l --log-prefix="$dir/$1-probe$s" bench >/dev/null 2>&1 &
    done
}
stop_load() { pkill -f "pgbench.*$dir" 2>/dev/null || true; wait 2>/dev/null || true; }
# The CPU server $1 has used so far, in clock ticks (1/100 s): the postmaster's own and
# that of its children, those running (backends, the worker, autovacuum; /proc/<pid>/stat
# utime + stime) and those that have ended (the postmaster's cutime + cstime); then that of
# the load's backends alone (running children connected to the database bench as
# postgres: they last the whole run). The load's pgbench clients are not the server's and
# are not counted.
cpu_ticks() {
    python3 - "$dir/data$1/postmaster.pid" <<'PY'
import os, sys
pm = int(open(sys.argv[1]).readline())
total = backends = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        s = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    f = s[s.rindex(")") + 2:].split()
    # f[1] is the parent's pid; f[11:15] utime, stime, cutime, cstime
    if int(pid) == pm or int(f[1]) == pm:
        total += sum(int(x) for x in f[11:15])
        try:
            title = open(f"/proc/{pid}/cmdline").read()
        except OSError:
            continue
        if title.startswith("postgres: postgres bench "):
            backends += sum(int(x) for x in f[11:13])
print(total, backends)
PY
}
# One sample of server $1: epoch, WAL position (bytes), heap and primary key bytes, live
# and dead tuples, vacuums and autovacuums, summed over the claim tables (dedup.processed
# and the generations that exist; a claim table's only index is its primary key), and the
# server's CPU ticks so far (all, the load's backends).
sample() {
    echo "$(psql -p $((PORT + $1)) -d bench -At -F ' ' -c "SELECT extract(epoch FROM clock_timestamp()),
        pg_current_wal_lsn() - '0/0'::pg_lsn, sum(pg_relation_size(relid)),
        sum(pg_indexes_size(relid)), sum(n_live_tup), sum(n_dead_tup), sum(vacuum_count + autovacuum_count)
        FROM pg_stat_user_tables WHERE schemaname = 'dedup' AND relname ~ '^processed(_[0-9]+)?$'") $(cpu_ticks "$1")"
}

if [ -n "${RETENTION:-}" ]; then
    R=$RETENTION
    start=$(date +%s.%N)
    load run
else
    start=$(date +%s.%N)
    load run
    sleep "$CALIBRATE"
    claims=$(psql -p $((PORT + 1)) -d bench -At -c "SELECT count(*) FROM dedup.processed")
    R=$(python3 -c "print(max(60, round($LIVE * $CALIBRATE / $claims)))")
fi
interval=${PRUNE_INTERVAL:-$(( R / 10 > 1 ? R / 10 : 1 ))}
for s in "${servers[@]:1}"; do
    psql -p $((PORT + s)) -d postgres -c "ALTER SYSTEM SET dedup.retention = '$R s'" \
         -c "ALTER SYSTEM SET dedup.prune_interval = '$interval s'" -c "SELECT pg_reload_conf()" >/dev/null
done
sleep 1
for s in "${servers[@]:1}"; do
    [ "$(psql -p $((PORT + s)) -d bench -At -c "SHOW dedup.prune_interval")" != 0 ] || { echo "the ${names[$s]} server did not take dedup.prune_interval" >&2; exit 1; }
done
end=$(python3 -c "print($start + ($PERIODS + 1) * $R)")
{ echo "# $(date -u +%FT%TZ) commit ${BENCH_COMMIT:-?}, PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $(nproc) cores"
  echo "# ${#servers[@]} servers at once (none: nothing removed; prune: retention ${R} s, prune_interval ${interval} s$([ ${#servers[@]} = 3 ] && echo "; generations: the same, with dedup.use_generations()${GENERATIONS_OPTS:+ and $GENERATIONS_OPTS}")), shared_buffers=$SHARED_BUFFERS, synchronous_commit=off, max_wal_size=4GB${SERVER_OPTS:+, $SERVER_OPTS}"
  echo "# each: $CLIENTS client(s) of try_claim_many($BATCH new bigint jobs) $([ -n "${RATE:-}" ] && echo "at $RATE claims/s" || echo "flat out"), 1 probe client of try_claim at $PROBE_RATE/s; $((PERIODS + 1)) periods of ${R} s"
  echo "# sample: server epoch wal_bytes heap_bytes pkey_bytes live_tuples dead_tuples vacuums cpu_ticks backend_cpu_ticks"; } | tee -a "$OUT"
# The generations server's sealed generations, and how many have no summary (a claim then
# probes their index: dedup.generation_memory too small for them, or not built yet), and
# the probes claims made so far in sealed generations (dedup.stats, every scope): for want
# of a summary, and a summary's false positives.
summaries() {
    psql -p $((PORT + 2)) -d bench -At -F ' ' -c "SELECT extract(epoch FROM clock_timestamp()), count(*),
        count(*) FILTER (WHERE NOT summarised), coalesce(sum(bytes), 0),
        (SELECT coalesce(sum(unsummarised_probes), 0) FROM dedup.stats),
        (SELECT coalesce(sum(summary_false_positives), 0) FROM dedup.stats)
        FROM dedup.generation_summaries()"
}
[ "${#servers[@]}" = 2 ] || echo "# summaries: epoch sealed_generations unsummarised summary_bytes unsummarised_probes summary_false_positives" | tee -a "$OUT"
while python3 -c "import sys, time; sys.exit(time.time() >= $end)"; do
    for s in "${servers[@]}"; do echo "sample ${names[$s]} $(sample $s)" | tee -a "$OUT" >>"$dir/samples"; done
    [ "${#servers[@]}" = 2 ] || echo "summaries generations $(summaries)" | tee -a "$OUT" >/dev/null
    sleep "$SAMPLE"
done
for s in "${servers[@]}"; do echo "sample ${names[$s]} $(sample $s)" | tee -a "$OUT" >>"$dir/samples"; done
stop_load

# Each autovacuum or vacuum of a claim table the server logged: the time of its log line
# (when it ended) and its elapsed time, read from the whole message (its continuation lines
# start with a tab; a vacuum with index passes writes many). And each removal: a prune
# pass (its log line's time is its end; it says its seconds) or a generation's drop or
# truncation (logged as it commits; counted as 0 s).
for s in "${servers[@]}"; do
    python3 - "$dir/log$s" "${names[$s]}" <<'PY' | tee -a "$OUT" >>"$dir/vacuums"
import re, sys
lines = open(sys.argv[1], errors="replace").read().split("\n")
for i, line in enumerate(lines):
    when = " ".join(line.split()[:2])
    if re.search(r'vacuum of table "bench\.dedup\.processed(_[0-9]+)?"', line):
        k = i + 1
        while k < len(lines) and lines[k].startswith("\t"):
            if "elapsed:" in lines[k]:
                print("vacuum", sys.argv[2], when, lines[k].split("elapsed:")[1].split()[0])
            k += 1
    m = re.search(r'dedup: pruned [0-9]+ claims in database "bench" in ([0-9.]+) s', line)
    if m:
        print("removal", sys.argv[2], when, m.group(1))
    m = re.search(r'dedup: database "bench": (dropped|truncated) dedup\.processed(_[0-9]+)?(: its claims were kept (at least )?([0-9]+)( to ([0-9]+))? s)?', line)
    if m:
        # and how long its claims were kept, as the drop says it (least, most; -1: not said)
        print("removal", sys.argv[2], when, "0", m.group(5) or -1, m.group(7) or -1)
PY
done

python3 - "$dir" "$start" "$R" "$PERIODS" "$BATCH" "$CLIENTS" <<'PY' | tee -a "$OUT"
import glob, sys, datetime
d, start, R, periods, batch, clients = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
names = ["none", "prune", "generations"][:len(glob.glob(f"{d}/data*"))]
def txns(prefix):
    out = []
    for f in glob.glob(prefix + "*"):
        for line in open(f):
            p = line.split()
            if len(p) >= 6:
                out.append((int(p[4]) + int(p[5]) / 1e6, int(p[2]) / 1000))
    return out
load = {n: txns(f"{d}/run-load{s}") for s, n in enumerate(names)}
probe = {n: txns(f"{d}/run-probe{s}") for s, n in enumerate(names)}
samples = {n: [] for n in names}
for line in open(f"{d}/samples"):
    p = line.split()
    if len(p) >= 9:
        # runs before the CPU was sampled have no CPU ticks: None
        cpu = [float(x) for x in p[9:11]]
        samples[p[1]].append([float(x) for x in p[2:9]] + cpu + [None] * (2 - len(cpu)))
vacuums = {n: [] for n in names}
removals = {n: [] for n in names}
try:
    for line in open(f"{d}/vacuums"):
        p = line.split()
        t = datetime.datetime.strptime(p[2] + " " + p[3], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()
        if p[0] == "vacuum":
            vacuums[p[1]].append((t, float(p[4])))
        else:
            removals[p[1]].append((t, float(p[4])) + tuple(float(x) for x in p[5:7]))
except FileNotFoundError:
    pass
def near_removal(n, t):
    # within a second of a removal: from a second before its start to a second after its end
    return any(r[0] - r[1] - 1 <= t <= r[0] + 1 for r in removals[n])
def at(n, t):
    # the last sample at or before t (the first one if none)
    best = samples[n][0]
    for x in samples[n]:
        if x[0] <= t:
            best = x
    return best
print(f"# period: seconds from the start; claims/s (probe claims not counted); WAL bytes per claim; the server's CPU seconds in the sampled span and per claim (us), and the load's backends' alone per claim; sizes at the period's end (MB); most dead tuples sampled; vacuums ended in the period and their seconds; probe p99 and slowest claim (ms), and the slowest of the claims in flight within a second of a removal, with the removals ended in the period")
for k in range(periods + 1):
    t0, t1 = start + k * R, start + (k + 1) * R
    row = {}
    for n in names:
        done = [x for x in load[n] if t0 <= x[0] < t1]
        claims = len(done) * batch
        a, b = at(n, t0), at(n, t1)
        span = b[0] - a[0]
        wal = (b[1] - a[1]) if span > 0 else 0
        cpu = (b[7] - a[7]) / 100 if span > 0 and a[7] is not None and b[7] is not None else 0
        cpu_backends = (b[8] - a[8]) / 100 if span > 0 and a[8] is not None and b[8] is not None else 0
        # claims in the sampled span, for WAL per claim
        in_span = len([x for x in load[n] if a[0] <= x[0] < b[0]]) * batch + len([x for x in probe[n] if a[0] <= x[0] < b[0]])
        lat = sorted(x[1] for x in probe[n] if t0 <= x[0] < t1)
        p99 = lat[int(len(lat) * 0.99)] if lat else 0
        dead = max([x[5] for x in samples[n] if t0 <= x[0] <= t1] or [0])
        vac = [v for v in vacuums[n] if t0 <= v[0] < t1]
        # a probe claim's log time is its end; it was in flight from its end less its latency
        near = [x[1] for x in probe[n] if t0 <= x[0] < t1 and (near_removal(n, x[0]) or near_removal(n, x[0] - x[1] / 1000))]
        rem = [r for r in removals[n] if t0 <= r[0] < t1]
        row[n] = dict(cps=claims / R, wpc=wal / in_span if in_span else 0, heap=b[2] / 1e6, pkey=b[3] / 1e6,
                      cpu=cpu, cpc=cpu * 1e6 / in_span if in_span and cpu else 0,
                      bcpc=cpu_backends * 1e6 / in_span if in_span and cpu_backends else 0,
                      live=b[4], dead=dead, vac=len(vac), vac_s=sum(v[1] for v in vac), p99=p99, worst=lat[-1] if lat else 0,
                      near=max(near or [0]), removals=len(rem),
                      kept=" ".join(f"{r[2]:.0f}-{r[3]:.0f}" if r[3] >= 0 else f">={r[2]:.0f}" for r in rem if len(r) > 3 and r[2] >= 0))
    for n in names:
        r = row[n]
        print(f"period {k + 1} {n:11}: claims/s={r['cps']:.0f} wal/claim={r['wpc']:.1f} cpu_s={r['cpu']:.1f} cpu_us/claim={r['cpc']:.2f} backend_cpu_us/claim={r['bcpc']:.2f} heap_mb={r['heap']:.0f} pkey_mb={r['pkey']:.0f} "
              f"live_tuples={r['live']:.0f} dead_tuples_max={r['dead']:.0f} vacuums={r['vac']} vacuum_s={r['vac_s']:.1f} "
              f"probe_p99_ms={r['p99']:.1f} probe_max_ms={r['worst']:.1f} removals={r['removals']} probe_max_near_removal_ms={r['near']:.1f}"
              + (f" kept_s={r['kept']}" if r['kept'] else ""))
    for n in names[1:]:
        if row["none"]["cps"] and row["none"]["wpc"]:
            print(f"period {k + 1} ratio {n}/none: claims/s {row[n]['cps'] / row['none']['cps']:.3f}, WAL per claim {row[n]['wpc'] / row['none']['wpc']:.3f}"
                  + (f", claims per CPU second {row['none']['cpc'] / row[n]['cpc']:.3f}" if row[n]['cpc'] and row['none']['cpc'] else ""))
PY
