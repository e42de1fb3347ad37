#!/usr/bin/env python3
"""The decode step as it runs with its CUDA graphs, from tools/device/kernel_trace.cpp's CSV: the
kernels cut into steps (an embedding gather opens a step, sampling closes it), the steps that
replayed graphs kept (a V4.1 step's attention core runs eagerly between its graph pieces), and for
each kernel its cost in the step, end minus the previous kernel's end (what removing it would
save at most; overlaps from programmatic dependent launch make it smaller than its run time), and
its run time, start to end (under PDL from when its blocks became resident, waiting included).
Medians over the steps. Usage: trace_table.py ktrace.csv [--sequence N] (N: print the first N
kernels of a median step in order)"""
import csv
import statistics as st
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
rows.sort(key=lambda r: int(r["start_ns"]))
steps, cur = [], None
for r in rows:
    k = (int(r["start_ns"]), int(r["end_ns"]), r["name"][:70], r["graph_id"] != "0")
    if k[2].startswith("embed"):
        cur = [k]
    elif cur is not None:
        cur.append(k)
        if k[2].startswith("sample"):
            steps.append(cur)
            cur = None
steps = [s for s in steps if any(k[3] for k in s)]
if not steps:
    sys.exit("no graphed step (embed ... sample) in the trace")
n = st.mode(len(s) for s in steps)
steps = [s for s in steps if len(s) == n]
cost = [[(s[i][1] - (s[i - 1][1] if i else s[0][0])) / 1e3 for i in range(n)] for s in steps]
run = [[(k[1] - k[0]) / 1e3 for k in s] for s in steps]
total = [sum(c) for c in cost]
names = [k[2] for k in steps[0]]
med_cost = [st.median(c[i] for c in cost) for i in range(n)]
med_run = [st.median(r[i] for r in run) for i in range(n)]
print(f"{len(steps)} graphed steps of {n} kernels: median {st.median(total):.1f} us a step "
      f"(min {min(total):.1f}), kernel run times sum to {sum(med_run):.1f} us")
by_cost, by_run, count = defaultdict(float), defaultdict(float), defaultdict(int)
for i, nm in enumerate(names):
    by_cost[nm] += med_cost[i]
    by_run[nm] += med_run[i]
    count[nm] += 1
print(f"{'us cost / step':>14} {'us run':>8} {'calls':>5}  kernel")
for nm in sorted(by_cost, key=lambda x: -by_cost[x]):
    print(f"{by_cost[nm]:14.1f} {by_run[nm]:8.1f} {count[nm]:5d}  {nm}")
if "--sequence" in sys.argv:
    m = int(sys.argv[sys.argv.index("--sequence") + 1])
    print(f"\nfirst {m} kernels of the step (median cost, median run, us; g: in a graph, e: eager):")
    for i in range(min(m, n)):
        print(f"{i:4d} {med_cost[i]:7.2f} {med_run[i]:7.2f} {'ge'[not steps[0][i][3]]}  {names[i]}")
