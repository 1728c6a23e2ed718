#!/usr/bin/python3
"""Accuracy against bytes per session (issue 31 point 4, "the frontier"): every
(engine, setting, policy, ratio) cell of longctx_eval.py / kvpress_compare.py JSON files
as one point, x = the session's KV bytes as a share of the float32 full cache (log
scale), y = mean score; points of one policy and dtype joined across ratios. Writes an
SVG (no plotting library: the figure is a few dozen shapes) and prints the table.

    python3 bench/eval/frontier_plot.py docs/results/longctx/int8_qaware_1k.json \\
        docs/results/longctx/kvpress_quanto4_1k.json --setting qaware \\
        --svg docs/results/longctx/int8_frontier.svg

x per record:
  echokv-server  retained_kv_bytes / full_kv_bytes as the server reports them (the
                 stored bytes: int8 rows plus their float32 scales).
  kvpress        kept_fraction (entries) x bytes per element of its cache / 4:
                 float32 1; quanto4 0.625 / 4 (4-bit codes plus a float32 scale and
                 shift per group of 64); quanto2 0.375 / 4.
Peers whose accuracy is not measured here are drawn as vertical marks at their bytes:
fp8_e4m3 full cache (vLLM / SGLang: 1 byte per value, 0.25x) and llama.cpp's q8_0 full
cache (34 bytes per 32 values: 0.2656x, the same bytes as our full@int8, whose row of 64
values shares one float32 scale).
"""

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import longctx_eval as ev  # noqa: E402  (records, de-duplication)

# kvpress records' bytes per value by cache (ours carry the server's own bytes).
BYTES_PER_VALUE = {"float32": 4.0, "quanto4": 0.625, "quanto2": 0.375}
PEER_MARKS = (("fp8_e4m3 full (vLLM, SGLang)", 0.25), ("q8_0 full (llama.cpp)", 34.0 / 128))
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def share(r):
    """The record's KV bytes over the float32 full cache's."""
    if r.get("engine", "echokv-server") == "echokv-server":
        return r["kept_fraction"]
    return r["kept_fraction"] * BYTES_PER_VALUE[r.get("cache_dtype", "float32")] / 4.0


def points(records, setting):
    """{(engine, policy): [(ratio, n, mean x, mean score)]} sorted by ratio."""
    cells = {}
    for r in records:
        if r["setting"] != setting and not ev.is_full(r["policy"]):
            continue
        key = (r.get("engine", "echokv-server"), r["policy"])
        cells.setdefault(key, {}).setdefault(r["ratio"], []).append((share(r), r["score"]))
    out = {}
    for key, by_ratio in cells.items():
        out[key] = [(ratio, len(v), sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v))
                    for ratio, v in sorted(by_ratio.items())]
    return out


def svg(series, title, width=760, height=470):
    left, right, top, bottom = 70, 250, 40, 60
    pw, ph = width - left - right, height - top - bottom
    xs = [x for pts in series.values() for _, _, x, _ in pts] + [m for _, m in PEER_MARKS]
    lo = 10 ** math.floor(math.log10(min(xs)))

    def px(x):
        return left + pw * (math.log10(x) - math.log10(lo)) / (0 - math.log10(lo))

    def py(y):
        return top + ph * (1 - y)

    e = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
         'font-size="12">' % (width, height),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="22" font-size="14">%s</text>' % (left, title),
         '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (left, top, pw, ph)]
    decade = lo
    while decade <= 1.0 + 1e-9:
        for m in range(1, 10):
            x = decade * m
            if x > 1.0 + 1e-9:
                break
            e.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (px(x), top, px(x), top + ph))
        e.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (px(decade), top + ph + 16, decade))
        decade *= 10
    for k in range(0, 11, 2):
        y = k / 10
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (left, py(y), left + pw, py(y)))
        e.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (left - 6, py(y) + 4, y))
    e.append('<text x="%d" y="%d" text-anchor="middle">KV bytes per session / float32 full cache (log)</text>'
             % (left + pw // 2, height - 20))
    e.append('<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">mean score</text>'
             % (top + ph // 2, top + ph // 2))
    for name, x in PEER_MARKS:
        e.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888" stroke-dasharray="4 3"/>'
                 % (px(x), top, px(x), top + ph))
    legend_y = top + 8
    for i, ((engine, policy), pts) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="6 3"' if "@" in policy else ""
        if len(pts) > 1:
            e.append('<polyline fill="none" stroke="%s"%s points="%s"/>' % (
                color, dash, " ".join("%.1f,%.1f" % (px(x), py(y)) for _, _, x, y in pts)))
        for ratio, _, x, y in pts:
            shape = ('<rect x="%.1f" y="%.1f" width="8" height="8" fill="%s"/>' % (px(x) - 4, py(y) - 4, color)
                     if "@" in policy else
                     '<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>' % (px(x), py(y), color))
            e.append(shape)
        e.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>' % (left + pw + 12, legend_y - 9, color))
        e.append('<text x="%d" y="%d">%s</text>' % (left + pw + 28, legend_y, policy))
        legend_y += 18
    for name, x in PEER_MARKS:
        e.append('<text x="%d" y="%d" fill="#555">- - %s: %.3fx</text>' % (left + pw + 12, legend_y, name, x))
        legend_y += 18
    e.append('<text x="%d" y="%d" fill="#555">squares, dashed: quantized caches</text>'
             % (left + pw + 12, legend_y))
    e.append("</svg>")
    return "\n".join(e) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--setting", default="qaware")
    parser.add_argument("--svg")
    parser.add_argument("--common-cases", action="store_true",
                        help="only the cases every file holds (e.g. ours on 42 cases, kvpress's on 14)")
    parser.add_argument("--title", default="SmolLM2-135M-Instruct, long-context suite 1K: accuracy against bytes")
    args = parser.parse_args()
    records, _ = ev.load_records(args.json)
    if args.common_cases:
        common = set.intersection(*({r["case_id"] for r in ev.load_records([path])[0]} for path in args.json))
        records = [r for r in records if r["case_id"] in common]
    series = points(records, args.setting)
    print("| engine | policy | ratio | n | bytes / float32 full | mean score |")
    print("|---|---|---|---|---|---|")
    for (engine, policy), pts in sorted(series.items()):
        for ratio, n, x, y in pts:
            print("| %s | %s | %g | %d | %.4f | %.3f |" % (engine, policy, ratio, n, x, y))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(series, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
