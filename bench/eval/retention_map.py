#!/usr/bin/python3
"""Retention maps (issue 29 point 6): which positions each layer and KV group of a
session kept, for one case of the long-context suite under one or more policies, with
the answer's evidence marked. One SVG panel per policy: a row per (layer, group), a
column per token position, dark where the entry is kept; red bands where the answer
occurs in the context (the needles), blue the question segment. Through the server's
InspectCache (include_positions), as a user would see it.

    python3 bench/eval/retention_map.py --suite build/longctx_suite.jsonl \\
        --case niah_multivalue-1k-01 --policies echokv,snapkv --ratio 0.9 \\
        --svg docs/results/longctx/retention_niah_multivalue-1k-01.svg

Prints, per policy: the answer generated, its score, the retained attention mass, and
the share of evidence tokens kept, per layer band and over all layers x groups.
Evidence positions come from tokenizing each segment's text up to and through every
occurrence of an answer string (within a token of the true boundary: a BPE merge can
straddle it).
"""

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import longctx_eval as ev  # noqa: E402  (server, sessions, scoring)
from longctx_eval import Tokenizer, score  # noqa: E402

ROW_PX = 4


def evidence_spans(tok, case):
    """[(start, end)] token positions (end exclusive) of every occurrence of an answer
    in the segments before the last (the question's)."""
    queries, where = [], []
    offset = 0
    for s, text in enumerate(case["segments"][:-1]):
        for answer in case["answers"]:
            at = text.find(answer)
            while at >= 0:
                queries += [text[:at], text[:at + len(answer)]]
                where.append(offset)
                at = text.find(answer, at + 1)
        offset += case["segment_tokens"][s]
    if not queries:
        return []
    counts = tok.lengths(queries)
    return sorted((base + counts[2 * k], base + counts[2 * k + 1]) for k, base in enumerate(where))


def runs(positions):
    """Sorted positions as [(first, last)] runs of consecutive values."""
    out = []
    for p in sorted(positions):
        if out and p == out[-1][1] + 1:
            out[-1][1] = p
        else:
            out.append([p, p])
    return out


def panel(e, top, width, left, n_tokens, layers, title, spans, question_start):
    groups = len(layers[0].groups)
    height = len(layers) * groups * ROW_PX

    def px(p):
        return left + width * p / n_tokens

    e.append('<text x="%d" y="%d" font-size="13">%s</text>' % (left, top - 8, title))
    e.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#f4f4f4" stroke="black"/>'
             % (left, top, width, height))
    e.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#1f77b4" fill-opacity="0.18"/>'
             % (px(question_start), top, px(n_tokens) - px(question_start), height))
    for a, b in spans:
        e.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#d62728" fill-opacity="0.35"/>'
                 % (px(a), top, max(1.0, px(b) - px(a)), height))
    e.append('<g fill="#222">')
    for li, layer in enumerate(layers):
        for gi, group in enumerate(layer.groups):
            y = top + (li * groups + gi) * ROW_PX
            e.extend('<rect x="%.1f" y="%d" width="%.1f" height="%d"/>' % (px(a), y, max(0.6, px(b + 1) - px(a)),
                                                                          ROW_PX - 1)
                     for a, b in runs(group.positions))
    e.append('</g>')
    for li in range(len(layers)):
        if li % 5 == 0:
            e.append('<text x="%d" y="%d" text-anchor="end" font-size="10">layer %d</text>'
                     % (left - 4, top + li * groups * ROW_PX + 8, li))
    for k in range(0, n_tokens + 1, 128 if n_tokens <= 2048 else 512):
        e.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%d</text>'
                 % (px(k), top + height + 12, k))
    return height


def evidence_kept(layers, spans):
    """Share of evidence positions kept: per layer, and over all layers x groups."""
    wanted = {p for a, b in spans for p in range(a, b)}
    if not wanted:
        return [], None
    per_layer = []
    for layer in layers:
        per_layer.append(sum(len(wanted & set(g.positions)) for g in layer.groups) / (len(wanted) * len(layer.groups)))
    return per_layer, sum(per_layer) / len(per_layer)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=os.path.join(ev.ROOT, "build", "longctx_suite.jsonl"))
    parser.add_argument("--case", required=True, help="a case id, e.g. niah_multivalue-1k-01")
    parser.add_argument("--policies", default="echokv,snapkv")
    parser.add_argument("--ratio", type=float, default=0.9)
    parser.add_argument("--setting", default="qaware", choices=("qaware", "qagnostic", "agent_tiered", "agent_evict"))
    parser.add_argument("--server-binary", default=os.path.join(ev.ROOT, "build", "bin", "echokv-server"))
    parser.add_argument("--tokenize-binary", default=os.path.join(ev.ROOT, "build", "bin", "echokv-tokenize"))
    parser.add_argument("--client", default=os.path.join(ev.ROOT, "client", "python"))
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--svg", required=True)
    args = parser.parse_args()
    with open(args.suite) as f:
        cases = [c for c in (json.loads(line) for line in f if line.strip()) if c["id"] == args.case]
    if not cases:
        raise SystemExit("no case %r in %s" % (args.case, args.suite))
    case = cases[0]
    model = args.model or os.path.join(os.environ.get("ECHOKV_MODELS") or os.path.join(ev.ROOT, ".cache", "models"),
                                       ev.GGUF_NAME)
    ev.tokenize_cases(args.tokenize_binary, model, [case])
    spans = evidence_spans(Tokenizer(args.tokenize_binary, model), case)
    question_start = sum(case["segment_tokens"][:-1])
    sys.path.insert(0, args.client)
    import echokv
    tmp = tempfile.TemporaryDirectory(prefix="echokv-retention-")
    server = ev.Server(args.server_binary, model, args.threads, tmp.name)
    panels = []
    try:
        client = echokv.Client(server.address)
        for policy in args.policies.split(","):
            session, budget, _ = ev.open_session(client, case, args.setting, policy, args.ratio)
            try:
                inspection = client.inspect(session.id, positions=True)
                answer = client.generate(session.id, max_tokens=case["max_tokens"], temperature=0).collect().text
            finally:
                client.delete(session.id)
            report = session.last_report
            panels.append((policy, budget, inspection.layers, answer, score(answer, case["answers"], case["scoring"]),
                           report.retained_mass_mean if report is not None else -1.0))
        client.close()
    finally:
        server.stop()
    left, width, top = 70, 1000, 50
    e = []
    y = top
    print("case %s (%s, %d tokens), evidence at %s, question from %d" % (
        case["id"], args.setting, case["n_tokens"], spans, question_start))
    for policy, budget, layers, answer, s, mass in panels:
        per_layer, overall = evidence_kept(layers, spans)
        title = "%s, r = %g (B = %s): score %.2f, evidence kept %s, retained mass %.3f — %r" % (
            policy, args.ratio, budget, s, "n/a" if overall is None else "%.2f" % overall, mass, answer.strip()[:60])
        print("  " + title)
        if per_layer:
            bands = [sum(per_layer[i:i + 5]) / len(per_layer[i:i + 5]) for i in range(0, len(per_layer), 5)]
            print("    evidence kept per 5 layers: " + " ".join("%.2f" % b for b in bands))
        y += panel(e, y, width, left, case["n_tokens"], layers, title.replace("&", "&amp;").replace("<", "&lt;"),
                   spans, question_start) + 50
    head = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
            'font-size="12">' % (left + width + 20, y),
            '<rect width="100%" height="100%" fill="white"/>',
            '<text x="%d" y="20" font-size="14">%s: kept entries per layer x KV group (rows) and position '
            '(columns); red: the answer in the context, blue: the question</text>' % (left, case["id"])]
    with open(args.svg, "w") as f:
        f.write("\n".join(head + e + ["</svg>"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
