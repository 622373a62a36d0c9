#!/usr/bin/env python3
"""Ratio table of two benchmark runs in the "gradclip-bench" JSON schemas.

    python3 bench/compare.py ours.json torch.json
    python3 bench/compare.py ours.json torch.json --ours naive --theirs torch

For each case (N, tensors, norm, step) present in both files it prints the
median time of each side, ours / theirs (below 1: ours is faster), and each
side's fraction of its own copy bandwidth measured in the same run (the
ratio that survives noisy or different machines). Times are compared on
each file's basis ("gpu": GPU timestamps or CUDA events; "wall"): a
mismatch is flagged. The bench writes schema "gradclip-bench/2" and
torch_peer.py "gradclip-bench/1", the fields of /2 that this reads.
"""

import argparse
import gzip
import json
import sys

SCHEMAS = ("gradclip-bench/1", "gradclip-bench/2")


def load(path):
    # docs/bench-runs/ keeps its runs gzipped (docs/benchmark.md).
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        run = json.load(f)
    if run.get("schema") not in SCHEMAS:
        sys.exit(f"{path}: schema {run.get('schema')!r}, expected one of {SCHEMAS!r}")
    return run


def pick(run, implementation, path):
    impls = sorted({r["implementation"] for r in run["results"]})
    if implementation is None:
        # The file's own tool if it has rows, else its only implementation.
        implementation = run.get("tool") if run.get("tool") in impls else (impls[0] if len(impls) == 1 else None)
        if implementation is None:
            sys.exit(f"{path} holds {impls}: choose one with --ours / --theirs")
    rows = {}
    for r in run["results"]:
        if r["implementation"] == implementation:
            rows[(r["n"], r["tensors"], r["norm"], r["step"])] = r
    if not rows:
        sys.exit(f"{path}: no results for implementation {implementation!r} (it has {impls})")
    return implementation, rows


def us(s):
    v = s * 1e6
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def describe(run):
    a = run["adapter"]
    return f"{a['name']} ({a['backend']}, {a['driver']}), {run['date_utc']}, basis {run['basis']}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ours")
    p.add_argument("theirs")
    p.add_argument("--ours-impl", dest="ours_impl", help="implementation in the first file (default: its tool, gradclip)")
    p.add_argument("--theirs-impl", dest="theirs_impl", help="implementation in the second file (default: its tool)")
    args = p.parse_args()

    a, b = load(args.ours), load(args.theirs)
    name_a, rows_a = pick(a, args.ours_impl, args.ours)
    name_b, rows_b = pick(b, args.theirs_impl, args.theirs)
    keys = sorted(set(rows_a) & set(rows_b), key=lambda k: (k[0], k[1], k[2] != "l2", k[3] != "clip"))
    if not keys:
        sys.exit("no case in common (N, tensors, norm, step)")

    print(f"## {name_a} / {name_b}\n")
    print(f"- {name_a}: {describe(a)}")
    print(f"- {name_b}: {describe(b)}")
    if a["adapter"]["name"] != b["adapter"]["name"]:
        print("- note: different adapters; the time ratio compares machines, the % copy columns compare implementations")
    print()
    print(f"| N | tensors | norm | step | {name_a} µs | {name_b} µs | {name_a} / {name_b} time | "
          f"{name_a} % copy | {name_b} % copy |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    mixed = False
    for k in keys:
        ra, rb = rows_a[k], rows_b[k]
        flag = ""
        if ra["basis"] != rb["basis"]:
            mixed = True
            flag = " (basis " + ra["basis"] + " vs " + rb["basis"] + ")"
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {us(ra['seconds'])} | {us(rb['seconds'])} | "
              f"{ra['seconds'] / rb['seconds']:.3g}{flag} | {100 * ra['copy_fraction']:.3g}% | "
              f"{100 * rb['copy_fraction']:.3g}% |")
    only = sorted(set(rows_a) ^ set(rows_b))
    if only:
        print(f"\n{len(only)} case(s) in only one file were left out.")
    if mixed:
        print("\nSome rows compare different time bases (GPU time vs wall time).")


if __name__ == "__main__":
    main()
