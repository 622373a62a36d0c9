#!/usr/bin/env python3
"""How much each of the bench's estimators moved over repeated runs.

    python3 bench/steadiness.py run1.json run2.json [run3.json ...]

The runs must be of the same command on the same driver. For every case
(N, tensors, norm, step) in the first run and each ratio the bench gives
three ways, it prints the range over the runs and its spread (largest /
smallest) by medians, by fastest repetitions and paired by repetition
(docs/benchmark.md): the reduce and scale passes against the rooflines,
`tensor_norms(true)`'s step over the plain one, and a p norm's step over
L2's (paired with the L2 step timed beside it, in runs since that). Then, per ratio and
estimator, the median and the largest spread over the cases: the estimator
with the smaller spreads is the one to read on that host. Reads .json and
.json.gz (docs/bench-runs/).
"""

import argparse
import statistics
import sys

from compare import load

REDUCE = ("reduce", "reduce+finalize")
SCALE = ("scale",)
ESTIMATORS = ("medians", "fastest", "paired")


def rows(run, implementation):
    return {
        (r["n"], r["tensors"], r["norm"], r["step"]): r
        for r in run["results"]
        if r["implementation"] == implementation
    }


def fraction(row, key, names):
    fractions = row.get(key) or {}
    return next((fractions[n] for n in names if n in fractions), None)


def pass_values(row, names):
    return (
        fraction(row, "pass_roofline_fractions", names),
        fraction(row, "pass_roofline_fractions_fastest", names),
        fraction(row, "pass_roofline_fractions_paired", names),
    )


def step_ratio_values(a, b, paired_key):
    """Row a's step time over row b's three ways; the paired one is a's field."""
    return (
        a["seconds"] / b["seconds"],
        a["min_seconds"] / b["min_seconds"],
        a.get(paired_key),
    )


def spread(values):
    """(low, high, high / low) of the values present, or None."""
    v = [x for x in values if x is not None]
    if not v or min(v) <= 0:
        return None
    return min(v), max(v), max(v) / min(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="bench JSON (.json or .json.gz), same command")
    args = ap.parse_args()
    if len(args.runs) < 2:
        sys.exit("give at least two runs")
    runs = [load(p) for p in args.runs]
    plain = [rows(r, "gradclip") for r in runs]
    with_norms = [rows(r, "gradclip-tensor-norms") for r in runs]
    spreads = {}
    print("| case | ratio | " + " | ".join(ESTIMATORS) + " |")
    print("|---|---|" + "---|" * len(ESTIMATORS))
    for case in sorted(plain[0]):
        if not all(case in p for p in plain):
            continue
        per_run = {
            "reduce % read": [pass_values(p[case], REDUCE) for p in plain],
            "scale % multiply": [pass_values(p[case], SCALE) for p in plain],
        }
        n, tensors, norm, step = case
        l2_case = (n, tensors, "l2", step)
        if norm not in ("l2", "inf") and all(l2_case in p for p in plain):
            per_run["/ L2"] = [
                step_ratio_values(p[case], p[l2_case], "over_l2_paired") for p in plain
            ]
        if all(case in t for t in with_norms):
            per_run["tensor norms / plain"] = [
                step_ratio_values(t[case], p[case], "over_plain_paired")
                for t, p in zip(with_norms, plain)
            ]
        for ratio, values in per_run.items():
            cells = []
            for k, estimator in enumerate(ESTIMATORS):
                s = spread([v[k] for v in values])
                if s is None:
                    cells.append("–")
                    continue
                spreads.setdefault((ratio, estimator), []).append(s[2])
                cells.append(f"{s[0]:.3f}-{s[1]:.3f} ({s[2]:.2f}x)")
            if any(c != "–" for c in cells):
                print(f"| {n} {tensors} {norm} {step} | {ratio} | " + " | ".join(cells) + " |")
    print(f"\nSpread over the {len(runs)} runs, median and largest over the cases:\n")
    print("| ratio | " + " | ".join(ESTIMATORS) + " |")
    print("|---|" + "---|" * len(ESTIMATORS))
    for ratio in ("reduce % read", "scale % multiply", "tensor norms / plain", "/ L2"):
        cells = []
        for estimator in ESTIMATORS:
            v = spreads.get((ratio, estimator))
            cells.append(f"{statistics.median(v):.2f}x, {max(v):.2f}x" if v else "–")
        if any(c != "–" for c in cells):
            print(f"| {ratio} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
