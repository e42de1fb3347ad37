#!/usr/bin/env python3
"""One decode step's kernels from an Nsight Compute CSV (ncu --csv --metrics
gpu__time_duration.sum over `ds41rt bench`): the launches from the last embedding gather (a
step's first kernel) to the end, summed by kernel name, largest first. Kernel time only: the
gaps between launches are not in it. Usage: kernel_table.py ncu.csv [N] [--sequence]
(--sequence: also every launch of the step in issue order, with its time)"""
import csv
import sys
from collections import defaultdict

rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
k_name, k_val, k_unit = cols.index("Kernel Name"), cols.index("Metric Value"), cols.index("Metric Unit")
scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "nsecond": 1e-3, "msecond": 1e3}
launches = [(r[k_name].split("(")[0].replace("unnamed>::", "")[:64], float(r[k_val].replace(",", "")) * scale[r[k_unit]])
            for r in rows[head + 1:] if len(r) > k_val and r[k_val]]
start = max(i for i, (n, _) in enumerate(launches) if "embed_bf16" in n)
tot, cnt = defaultdict(float), defaultdict(int)
for n, us in launches[start:]:
    tot[n] += us
    cnt[n] += 1
allt = sum(tot.values())
print(f"{'kernel':64} {'total us':>9} {'launches':>8} {'mean us':>8} {'share':>6}")
for n in sorted(tot, key=tot.get, reverse=True)[: int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 40]:
    print(f"{n:64} {tot[n]:9.1f} {cnt[n]:8d} {tot[n] / cnt[n]:8.2f} {100 * tot[n] / allt:5.1f}%")
print(f"one step: {allt:.1f} us of kernels in {sum(cnt.values())} launches")
if "--sequence" in sys.argv:
    for i, (n, us) in enumerate(launches[start:]):
        print(f"{i:4d} {n:64} {us:8.2f}")
