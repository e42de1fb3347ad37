#!/usr/bin/env python3
"""The decode step as it runs with its CUDA graphs, from tools/device/kernel_trace.cpp's CSV: the
kernels cut into steps (an embedding gather opens a step, sampling closes it), the steps that
replayed graphs kept (a V4.1 step's attention core runs eagerly between its graph pieces), and for
each kernel its cost in the step, end minus the previous kernel's end (what removing it would
save at most; overlaps from programmatic dependent launch make it smaller than its run time), and
its run time, start to end (under PDL from when its blocks became resident, waiting included).
Medians over the steps; also the time inside a step when the GPU runs none of it, its largest
gaps, and, for a trace made with KTRACE_API, the host's runtime calls up to the largest one.
Usage: trace_table.py ktrace.csv [--sequence N] (N: print the first N kernels of a median step in
order)"""
import csv
import statistics as st
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
api = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"][4:]) for r in rows if r["grid"] == "-1")
rows = [r for r in rows if r["grid"] != "-1"]
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
# Idle: time inside the step when nothing of it runs on the GPU (the host behind, launch gaps).
def idle_gaps(s):
    gaps, reach = [], s[0][1]
    for i, k in enumerate(s[1:], 1):
        if k[0] > reach:
            gaps.append((i, (k[0] - reach) / 1e3))
        reach = max(reach, k[1])
    return gaps
idle = [sum(g for _, g in idle_gaps(s)) for s in steps]
print(f"{len(steps)} graphed steps of {n} kernels: median {st.median(total):.1f} us a step "
      f"(min {min(total):.1f}), kernel run times sum to {sum(med_run):.1f} us, GPU idle "
      f"{st.median(idle):.1f} us a step (median)")
mid = steps[sorted(range(len(steps)), key=lambda i: total[i])[len(steps) // 2]]
big = sorted(idle_gaps(mid), key=lambda x: -x[1])[:8]
print("largest idle gaps of the median step (before kernel #, us): " + ", ".join(f"#{i} {mid[i][2][:28]} {g:.1f}" for i, g in big))
if api:  # what the host did from the step's start to the end of its largest gap
    t0, t1 = mid[0][0], mid[big[0][0]][0]
    print(f"host runtime calls from the median step's start to its largest gap's end ({(t1 - t0) / 1e3:.1f} us; "
          "us after the step's start, duration):")
    for a in api:
        if t0 - 200e3 <= a[0] <= t1:
            print(f"  {(a[0] - t0) / 1e3:8.1f} {(a[1] - a[0]) / 1e3:7.1f}  {a[2]}")
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
