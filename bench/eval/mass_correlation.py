#!/usr/bin/python3
"""How well the fidelity signal predicts the accuracy drop (issue 29 point 4): every
compressed record of longctx_eval.py JSON files beside its case's full-cache record.

    python3 bench/eval/mass_correlation.py docs/results/longctx/mass_1k.json \\
        --svg docs/results/longctx/mass_vs_drop.svg

Per record: x = retained_mass_mean (or --signal min: retained_mass_min), the share of
the compression's own probe queries' attention mass that the kept entries hold,
averaged over layers x KV groups, as the server reports it (CompressionReport);
drop = score(full cache) - score(record), the full cache of the same case, weights and
cache dtype ("full", "full@native", ...). "lost" = drop > 0.

Tables (markdown, stdout):
  per policy and ratio, and per policy over all ratios: n, mean x, mean drop, share
  lost, Pearson r(x, drop) and Spearman rho(x, drop) with 95 % bootstrap intervals
  (2,000 resamples of cases, seed 0; a case's records move together), and the AUC of
  x for "lost" (the probability that a lost record has a lower x than a kept one, ties
  1/2; 0.5 = no information, 1 = x separates them). Within one ratio the budget is the
  same share of every case, so the per-ratio rows ask the operator's question: at this
  budget, does the signal tell which sessions lost their answer? The pooled rows mix
  ratios (lower budgets lower both x and the score).
  per bin of x (all policies): n, mean drop, share lost.
The SVG (no plotting library) draws x against drop, a colour per policy, with the
bins' mean drop as a line.
"""

import argparse
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import longctx_eval as ev  # noqa: E402  (records, de-duplication)

BINS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0 + 1e-9)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
RESAMPLES = 2000


def full_label(policy):
    """The reference of a record's label: its policy replaced by full, suffixes kept."""
    return "@".join(["full"] + policy.split("@")[1:])


def pairs(records, signal):
    """[(policy, ratio, case_id, x, drop)] for every compressed record with a signal and
    a full-cache record of its case."""
    full = {(r["case_id"], r["policy"]): r for r in records if ev.is_full(r["policy"])}
    out = []
    for r in records:
        x = r.get("retained_mass_" + signal)
        ref = full.get((r["case_id"], full_label(r["policy"])))
        if ev.is_full(r["policy"]) or x is None or ref is None:
            continue
        out.append((r["policy"], r["ratio"], r["case_id"], x, ref["score"] - r["score"]))
    return out


def ranks(values):
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(xs, ys):
    """None when either side is constant (no correlation is defined)."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy)


def spearman(xs, ys):
    return pearson(ranks(xs), ranks(ys))


def auc(xs, ys):
    """P(x of a lost record < x of a kept one), ties 1/2; None without both kinds."""
    lost = [x for x, y in zip(xs, ys) if y > 0]
    kept = [x for x, y in zip(xs, ys) if y <= 0]
    if not lost or not kept:
        return None
    wins = sum(1.0 if a < b else 0.5 if a == b else 0.0 for a in lost for b in kept)
    return wins / (len(lost) * len(kept))


def bootstrap(rows, stat):
    """stat over rows [(case_id, x, drop)] and its 95 % interval, resampling cases."""
    point = stat([x for _, x, _ in rows], [d for _, _, d in rows])
    by_case = {}
    for case, x, d in rows:
        by_case.setdefault(case, []).append((x, d))
    cases = sorted(by_case)
    rng = random.Random(0)
    values = []
    for _ in range(RESAMPLES):
        sample = [xd for _ in cases for xd in by_case[cases[rng.randrange(len(cases))]]]
        v = stat([x for x, _ in sample], [d for _, d in sample])
        if v is not None:
            values.append(v)
    if point is None or len(values) < RESAMPLES // 2:
        return point, None, None
    values.sort()
    return point, values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def fmt(triple):
    point, lo, hi = triple
    if point is None:
        return "n/a"
    if lo is None:
        return "%+.2f" % point
    return "%+.2f [%+.2f, %+.2f]" % (point, lo, hi)


def table(rows):
    groups = {}
    for policy, ratio, case, x, d in rows:
        groups.setdefault((policy, "%g" % ratio), []).append((case, x, d))
        groups.setdefault((policy, "all"), []).append((case, x, d))
        groups.setdefault(("all", "all"), []).append((case, x, d))
    lines = ["| policy | ratio | n | mean signal | mean drop | lost | Pearson r [95 %] | Spearman rho [95 %] "
             "| AUC for lost [95 %] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (policy, ratio), g in sorted(groups.items(), key=lambda k: (k[0][0] == "all", k[0][0], k[0][1] == "all",
                                                                     k[0][1])):
        n = len(g)
        lost = sum(1 for _, _, d in g if d > 0)
        a = bootstrap(g, auc)
        lines.append("| %s | %s | %d | %.3f | %+.3f | %d | %s | %s | %s |" % (
            policy, ratio, n, sum(x for _, x, _ in g) / n, sum(d for _, _, d in g) / n, lost,
            fmt(bootstrap(g, pearson)), fmt(bootstrap(g, spearman)),
            "n/a" if a[0] is None else ("%.2f" % a[0] if a[1] is None else "%.2f [%.2f, %.2f]" % a)))
    return "\n".join(lines)


def bins(rows):
    out = []
    for lo, hi in zip(BINS, BINS[1:]):
        g = [d for _, _, _, x, d in rows if lo <= x < hi]
        if g:
            out.append((lo, min(hi, 1.0), len(g), sum(g) / len(g), sum(1 for d in g if d > 0) / len(g)))
    return out


def bin_table(rows):
    lines = ["| signal in | n | mean drop | share lost |", "|---|---|---|---|"]
    for lo, hi, n, mean, lost in bins(rows):
        lines.append("| [%.2f, %.2f%s | %d | %+.3f | %.2f |" % (lo, hi, "]" if hi >= 1.0 else ")", n, mean, lost))
    return "\n".join(lines)


def svg(rows, title, width=760, height=470):
    left, right, top, bottom = 70, 180, 40, 60
    pw, ph = width - left - right, height - top - bottom
    x_lo = min(0.5, math.floor(min(x for _, _, _, x, _ in rows) * 10) / 10)

    def px(x):
        return left + pw * (x - x_lo) / (1.0 - x_lo)

    def py(d):
        return top + ph * (1 - (d + 1) / 2)

    e = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
         'font-size="12">' % (width, height),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="22" font-size="14">%s</text>' % (left, title),
         '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (left, top, pw, ph)]
    steps = int(round((1.0 - x_lo) / 0.1))
    for k in range(steps + 1):
        x = x_lo + k * 0.1
        e.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (px(x), top, px(x), top + ph))
        e.append('<text x="%.1f" y="%d" text-anchor="middle">%.1f</text>' % (px(x), top + ph + 16, x))
    for k in range(-4, 5):
        d = k / 4
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>'
                 % (left, py(d), left + pw, py(d), "#999" if k == 0 else "#ddd"))
        e.append('<text x="%d" y="%.1f" text-anchor="end">%+.2f</text>' % (left - 6, py(d) + 4, d))
    e.append('<text x="%d" y="%d" text-anchor="middle">retained attention mass (mean over layers x groups)</text>'
             % (left + pw // 2, height - 20))
    e.append('<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">score(full) - score '
             '(accuracy drop)</text>' % (top + ph // 2, top + ph // 2))
    policies = sorted({p for p, _, _, _, _ in rows})
    # A deterministic vertical jitter (drops take few values) so stacked points show.
    for i, policy in enumerate(policies):
        color = COLORS[i % len(COLORS)]
        for j, (_, _, _, x, d) in enumerate(sorted(r for r in rows if r[0] == policy)):
            jitter = ((j * 37) % 11 - 5) * 0.004
            e.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s" fill-opacity="0.55"/>'
                     % (px(x), py(d + jitter), color))
        e.append('<circle cx="%d" cy="%d" r="5" fill="%s"/>' % (left + pw + 17, top + 4 + 18 * i, color))
        e.append('<text x="%d" y="%d">%s</text>' % (left + pw + 28, top + 8 + 18 * i, policy))
    centres = [((lo + hi) / 2, mean) for lo, hi, _, mean, _ in bins(rows)]
    if len(centres) > 1:
        e.append('<polyline fill="none" stroke="black" stroke-width="2" points="%s"/>'
                 % " ".join("%.1f,%.1f" % (px(max(x, x_lo)), py(m)) for x, m in centres))
    e.append('<text x="%d" y="%d">— mean drop per bin</text>' % (left + pw + 12, top + 8 + 18 * len(policies)))
    e.append("</svg>")
    return "\n".join(e) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--setting", default="qaware")
    parser.add_argument("--signal", choices=("mean", "min"), default="mean")
    parser.add_argument("--svg")
    parser.add_argument("--title", default="SmolLM2-135M-Instruct, suite 1K: retained attention mass vs accuracy drop")
    args = parser.parse_args()
    records, _ = ev.load_records(args.json)
    records = [r for r in records if r["setting"] == args.setting or ev.is_full(r["policy"])]
    rows = pairs(records, args.signal)
    if not rows:
        raise SystemExit("no record with retained_mass_%s and a full-cache record of its case in %s"
                         % (args.signal, " ".join(args.json)))
    print(table(rows))
    print()
    print(bin_table(rows))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(rows, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
