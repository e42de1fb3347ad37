#!/usr/bin/env python3
"""Per-launch summary of an Nsight Compute report's raw page (ncu --import R --page raw --csv):
duration, DRAM throughput, occupancy, issue activity and the warp stall reasons that cost at
least 0.2 warp cycles per issued instruction, one block per launch.
Usage: ncu --import R.ncu-rep --page raw --csv > raw.csv; ncu_metrics.py raw.csv"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
KEYS = [
    ("gpu__time_duration.sum", "us"),
    ("launch__grid_size", "grid"),
    ("launch__registers_per_thread", "regs"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram %"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy %"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue active %"),
    ("smsp__average_warp_latency_per_inst_issued.ratio", "warp cycles / issue"),
    ("smsp__inst_executed.sum", "warp instructions"),
]
for r in rows[head + 2:]:  # the row after the header holds units
    if len(r) < len(cols):
        continue
    v = dict(zip(cols, r))
    print("==", v["Kernel Name"][:90], "id", v.get("ID", ""))
    print("  " + ", ".join(f"{label} {v[k]}" for k, label in KEYS if k in v))
    stalls = []
    for k, x in v.items():
        if k.startswith("smsp__average_warps_issue_stalled_") and k.endswith("_per_issue_active.ratio"):
            try:
                f = float(x.replace(",", ""))
            except ValueError:
                continue
            if f >= 0.2:
                stalls.append((f, k[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")]))
    print("  stalls (warp cycles per issue): " + ", ".join(f"{n} {f:.2f}" for f, n in sorted(stalls, reverse=True)))
