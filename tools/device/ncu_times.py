#!/usr/bin/env python3
# Median kernel times per (kernel, grid) from an ncu CSV, in the order the kernels first ran, so
# one ncu pass over a test that times several shapes gives each shape's kernels apart (for one
# decode step's kernels by name, kernel_table.py):
#   ncu --csv --clock-control none --metrics gpu__time_duration.sum -k 'regex:gemm_kernel|x_image' \
#       ds41rt_cuda_tests --gtest_filter='CudaGemmFp8.v41_prefill_shapes' > ncu.csv
#   python3 tools/device/ncu_times.py ncu.csv
import collections
import csv
import statistics
import sys

rows = [r for r in csv.reader(line for line in open(sys.argv[1]) if line.startswith('"'))]
head = rows[0]
name, value, unit, grid = (head.index(c) for c in ("Kernel Name", "Metric Value", "Metric Unit", "Grid Size"))
to_us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
times = collections.OrderedDict()
for r in rows[1:]:
    us = float(r[value].replace(",", "")) * to_us[r[unit]]
    times.setdefault((r[name].split("(")[0][-40:], r[grid]), []).append(us)
for (k, g), v in times.items():
    print(f"{k:40s} {g:16s} n={len(v):3d} median {statistics.median(v):9.1f} us  min {min(v):9.1f}")
