#!/usr/bin/env python3
"""Splits an ncu CSV of a short `generate --eager` run into model steps and sums each step's
kernel time by kernel name.

Usage: benches/ncu_steps.py FILE.csv [--step N]

The CSV comes from `ncu --metrics gpu__time_duration.sum --csv --print-units base` (see
benches/h200_model.sh, phase `profile`). A step starts at each embedding gather
(`model_gather` as the first kernel, or right after the previous step's `model_argmax`:
the logits rows' gather inside a step follows a linear layer). Prints, per step, the kernel
count and the summed kernel time, then the chosen step (default: the last, a decode step)
by kernel: launches, total µs, mean µs.
"""
import csv
import sys
from collections import OrderedDict


def read(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0]
        rows.append((name, float(r["Metric Value"].replace(",", "")) / 1e3, r.get("Grid Size", ""), r.get("Block Size", "")))
    return rows


def steps(rows):
    out = []
    prev = None
    for row in rows:
        if not out or (row[0] == "model_gather" and prev == "model_argmax"):
            out.append([])
        out[-1].append(row)
        prev = row[0]
    return out


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    pick = -1
    if "--step" in args:
        i = args.index("--step")
        pick = int(args[i + 1])
        del args[i : i + 2]
    all_steps = steps(read(args[0]))
    for i, s in enumerate(all_steps):
        print(f"step {i}: {len(s)} kernels, {sum(r[1] for r in s):.1f} µs of kernel time")
    s = all_steps[pick]
    by = OrderedDict()
    for name, us, grid, block in s:
        e = by.setdefault((name, grid, block), [0, 0.0])
        e[0] += 1
        e[1] += us
    print(f"\nstep {pick % len(all_steps)} by kernel (launches, total µs, mean µs, grid, block):")
    for (name, grid, block), (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:40s} {n:5d} {us:9.1f} {us / n:8.2f}  {grid} {block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
