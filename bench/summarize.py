#!/usr/bin/env python3
"""Summarise bench output: alternated runs (median tps, ratio to b_handwritten) and mixed
runs (per round latency(reference) / latency(variant), median over rounds)."""
import re, statistics, sys
from collections import defaultdict

REF = {"alternated": "b_handwritten"}
tps = defaultdict(list)            # (sync, variant) -> [tps]
lat = defaultdict(dict)            # (run, sync, round) -> {variant: latency}
mixed_ref = {}                     # run -> reference variant (the run's first script)
run = 0
for line in open(sys.argv[1]):
    if line.startswith("# mixed:"):
        run += 1
    elif m := re.match(r"sync=(\w+) round=\d+ (\w+) tps=([\d.]+)", line):
        tps[(m[1], m[2])].append(float(m[3]))
    elif m := re.match(r"mixed sync=(\w+) round=(\d+) (\w+) latency_ms=([\d.]+)", line):
        lat[(run, m[1], int(m[2]))][m[3]] = float(m[4])
        mixed_ref.setdefault(run, m[3])

def fmt(xs):
    return ", ".join(f"{x:.0f}" if x > 50 else f"{x:.3f}" for x in xs)

for sync in sorted({s for s, _ in tps}, reverse=True):
    base = statistics.median(tps.get((sync, REF["alternated"]), [float("nan")]))
    print(f"\nalternated runs, synchronous_commit={sync}")
    print("| variant | tps per run | median tps | vs b_handwritten |\n|---|---|---|---|")
    for (s, v), xs in sorted(tps.items()):
        if s == sync:
            print(f"| {v} | {fmt(xs)} | {statistics.median(xs):.0f} | {statistics.median(xs) / base:.3f}x |")

for run, sync in sorted({(r, s) for r, s, _ in lat}, key=lambda k: (k[0], k[1] != "off")):
    ref = mixed_ref[run]
    ratios = defaultdict(list)
    for (r, s, _), per in sorted(lat.items()):
        if (r, s) == (run, sync) and ref in per:
            for v, l in per.items():
                ratios[v].append(per[ref] / l)
    print(f"\nmixed runs, synchronous_commit={sync}: latency({ref}) / latency(variant) per round")
    print("| variant | per round | median |\n|---|---|---|")
    for v, rs in ratios.items():
        print(f"| {v} | {', '.join(f'{r:.3f}' for r in rs)} | {statistics.median(rs):.3f}x |")

on, off = tps.get(("off", "stats_on")), tps.get(("off", "stats_off"))
if on and off:
    print(f"\ncounters, alternated runs (synchronous_commit=off): on {statistics.median(on):.0f} tps, "
          f"off {statistics.median(off):.0f} tps: {statistics.median(on) / statistics.median(off):.3f}x")
