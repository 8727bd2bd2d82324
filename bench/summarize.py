#!/usr/bin/env python3
"""Median tps per (sync, variant) from pgbench.sh output lines, and the ratio to (b)."""
import re, statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"sync=(\w+) round=\d+ (\w+) tps=([\d.]+)", line)
    if m:
        runs[(m[1], m[2])].append(float(m[3]))
for sync in sorted({s for s, _ in runs}, reverse=True):
    base = statistics.median(runs.get((sync, "b_handwritten"), [float("nan")]))
    print(f"synchronous_commit={sync}")
    print(f"| variant | runs (tps) | median tps | vs (b) |\n|---|---|---|---|")
    for (s, v), tps in sorted(runs.items()):
        if s != sync:
            continue
        med = statistics.median(tps)
        print(f"| {v} | {', '.join(f'{t:.0f}' for t in tps)} | {med:.0f} | {med / base:.3f}x |")
    print()
