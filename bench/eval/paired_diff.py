#!/usr/bin/env python3
"""Paired comparison of two row sets of an echokv-eval results.csv (docs/RESULTS.md).

For every budget and metric that both rows have: the mean of the per-case difference
A - B, its 95 % percentile bootstrap interval over cases (2000 resamples, seed 0, the
same resampling of cases for both), and the wins / ties / losses of A (for kl lower is
better). A difference counts as significant when its interval excludes 0.

  bench/eval/paired_diff.py /tmp/eval_turns4/results.csv echokv/tiered echokv/evict
"""
import csv
import random
import sys
from collections import defaultdict

LOWER_IS_BETTER = {"kl"}


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    path, a, b = argv[1:]
    rows = defaultdict(dict)  # (budget, metric) -> {(policy, case): value}
    for r in csv.DictReader(open(path)):
        if r["policy"] in (a, b):
            rows[(int(r["budget"]), r["metric"])][(r["policy"], r["case_id"])] = float(r["value"])
    print(f"| B | metric | n | mean {a} | mean {b} | mean diff [95% paired bootstrap] | {a} better / tie / worse |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (budget, metric) in sorted(rows):
        v = rows[(budget, metric)]
        cases = sorted({c for (p, c) in v if (a, c) in v and (b, c) in v})
        if not cases:
            continue
        d = [v[(a, c)] - v[(b, c)] for c in cases]
        rng = random.Random(0)
        means = sorted(sum(d[rng.randrange(len(d))] for _ in d) / len(d) for _ in range(2000))
        lo, hi = means[int(0.025 * 2000)], means[int(0.975 * 2000) - 1]
        sign = -1 if metric in LOWER_IS_BETTER else 1
        better = sum(1 for x in d if sign * x > 0)
        worse = sum(1 for x in d if sign * x < 0)
        mean_a = sum(v[(a, c)] for c in cases) / len(cases)
        mean_b = sum(v[(b, c)] for c in cases) / len(cases)
        sig = " *" if lo > 0 or hi < 0 else ""
        print(f"| {budget} | {metric} | {len(cases)} | {mean_a:.4g} | {mean_b:.4g} | "
              f"{sum(d) / len(d):+.4g} [{lo:+.4g}, {hi:+.4g}]{sig} | {better} / {len(d) - better - worse} / {worse} |")


if __name__ == "__main__":
    main(sys.argv)
