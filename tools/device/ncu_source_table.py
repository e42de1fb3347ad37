#!/usr/bin/env python3
"""One kernel's warp samples from Nsight Compute's source page (`ncu -i REP --page source --csv
--print-source sass > src.csv`): the stall reasons over the whole kernel, the samples before the
first HMMA / between the first and last HMMA / after the last (prologue, main loop, epilogue in
code order), the instructions with most samples and their two largest stall reasons, and the
global loads with most excess L2 sectors (uncoalesced) and shared accesses with most excess
wavefronts (bank conflicts).
Usage: ncu_source_table.py src.csv [--kernel N] [--top N]"""
import argparse
import csv

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--kernel", type=int, default=0, help="which profiled launch (0: the first)")
ap.add_argument("--top", type=int, default=20)
a = ap.parse_args()

kernels, names, hdr = [], [], None
for row in csv.reader(open(a.csv)):
    if not row:
        continue
    if row[0] == "Kernel Name":
        kernels.append([]), names.append(row[1])
    elif row[0] == "Address":
        hdr = row
    elif kernels:
        kernels[-1].append(row)
H = {h: i for i, h in enumerate(hdr)}
k = kernels[a.kernel]
num = lambda r, col: int(r[H[col]] or 0) if r[H[col]] not in ("-", "") else 0
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
total = sum(num(r, "# Samples") for r in k)
print(f"{names[a.kernel][:150]}\n{len(k)} SASS instructions, {total} warp samples")
print("stall reasons: " + ", ".join(f"{s[6:]} {v / total:.1%}" for s, v in
      sorted(((s, sum(num(r, s) for r in k)) for s in stalls), key=lambda x: -x[1])[:10]))
mma = [i for i, r in enumerate(k) if "MMA" in r[1]]
if mma:
    seg = lambda lo, hi: sum(num(r, "# Samples") for r in k[lo:hi]) / total
    print(f"samples before the first MMA {seg(0, mma[0]):.1%}, first to last MMA {seg(mma[0], mma[-1] + 1):.1%}, "
          f"after the last {seg(mma[-1] + 1, len(k)):.1%} (code order)")
print(f"\ninstructions with most samples (index, samples, executed, SASS, largest stalls):")
for i, r in sorted(enumerate(k), key=lambda x: -num(x[1], "# Samples"))[:a.top]:
    top = sorted(((num(r, s), s[6:]) for s in stalls), reverse=True)[:2]
    print(f"{i:5d} {num(r, '# Samples'):6d} {num(r, 'Instructions Executed'):8d}  {r[1].strip()[:60]:60s} "
          + ", ".join(f"{s} {v}" for v, s in top if v))
for col, ideal, what in (("L2 Theoretical Sectors Global Excessive", "L2 Theoretical Sectors Global", "global sectors"),
                         ("L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared", "shared wavefronts")):
    rows = sorted(k, key=lambda r: -num(r, col))[:6]
    tot_ex, tot = sum(num(r, col) for r in k), sum(num(r, ideal) for r in k)
    print(f"\n{what}: {tot_ex} excess of {tot} ({tot_ex / max(tot, 1):.0%}); largest:")
    for r in rows:
        if num(r, col):
            print(f"  {num(r, col):8d} of {num(r, ideal):8d}  {r[1].strip()[:70]}")
