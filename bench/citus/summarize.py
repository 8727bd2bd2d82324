"""Summarise a bench/citus/run.sh results file: dedup / hand-written per pair and round;
for rls, row-level security on / off."""
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(coordinator|spread|rls) round=(\d+) (\w+) tps=([\d.]+)", line)
    if m:
        runs[(m[1], m[3])].append(float(m[4]))
for where, hand, ours in [("coordinator", "hand_colocated", "dedup_colocated"),
                          ("coordinator", "hand_2pc", "dedup_2pc"),
                          ("spread", "hand_colocated", "dedup_colocated"),
                          ("rls", "rls_off", "rls_on")]:
    h, d = runs.get((where, hand)), runs.get((where, ours))
    if not h or not d:
        continue
    print(f"{where:11} {ours:16} {statistics.mean(d):9.1f} tps  {hand:15} {statistics.mean(h):9.1f} tps"
          f"  ratio {statistics.mean(d) / statistics.mean(h):.3f}")
