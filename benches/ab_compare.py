#!/usr/bin/env python3
"""Compares two or more `polyattn bench --json` files of one lease, old against new.

Usage: ab_compare.py --old A.json [A2.json ...] --new B.json [B2.json ...] [--limit 1.03]

Each side's time for a row (id, backend, dtype, kv dtype) is its fastest median over that
side's files (repeated passes alternate old and new, so a slow moment of the card hits both).
Prints one Markdown table row per benchmark row: old and new medians in µs, new / old, and
`over` where new / old exceeds the limit; exits 1 if any row is over.
"""
import argparse
import json
import sys


def rows(paths):
    best = {}
    for p in paths:
        with open(p) as f:
            for r in json.load(f)["rows"]:
                if r.get("status") != "ok" or r.get("us_median") is None:
                    continue
                k = (r["id"], r["backend"], r["dtype"], r["kv_dtype"])
                best[k] = min(best.get(k, float("inf")), r["us_median"])
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", nargs="+", required=True)
    ap.add_argument("--new", nargs="+", required=True)
    ap.add_argument("--limit", type=float, default=1.03)
    a = ap.parse_args()
    old, new = rows(a.old), rows(a.new)
    over = 0
    print("| row | backend | dtype | KV | old µs | new µs | new / old |")
    print("|---|---|---|---|---:|---:|---:|")
    for k in sorted(set(old) | set(new)):
        o, n = old.get(k), new.get(k)
        if o is None or n is None:
            print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {o or '-'} | {n or '-'} | missing |")
            over += 1
            continue
        q = n / o
        flag = " over" if q > a.limit else ""
        over += q > a.limit
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {o:.1f} | {n:.1f} | {q:.3f}{flag} |")
    print(f"\n{len(set(old) & set(new))} rows compared, {over} over {a.limit:.2f} or missing")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
