#!/usr/bin/python3
"""The long-context suite (tools/longctx_suite.py) through echokv-server's gRPC door
(issue 29 point 2): every case, setting, policy and compression ratio as a session of
our server, a greedy answer, RULER's score; per-cell means with 95 % bootstrap intervals.

    python3 bench/eval/longctx_eval.py --suite build/longctx_suite.jsonl \\
        --server-binary build/bin/echokv-server --client client/python --out results.json [--quick | --smoke]
    python3 bench/eval/longctx_eval.py --summarize results.json [more.json ...]   # markdown tables

Settings (the budget B of a case comes from its token counts; ratio r = the share of the
cache removed, kvpress's compression_ratio; both are recorded):
  qaware     question-aware: CreateSession on the whole prompt (context + question +
             generation prompt + answer prefix), compressed to B = int(L (1 - r)).
  qagnostic  question-agnostic (kvpress's default): CreateSession on the context alone,
             then AppendToSession of the question; memory `evict`. B = int(L_ctx (1 - r))
             + L_question, so the cache at answer time is as large as kvpress's
             (compressed context + the question in full). Our append re-compresses
             "retained + question" to B (docs/ALGORITHM.md §6), where kvpress keeps the
             question whole: the difference of definitions is in docs/RESULTS.md.
  agent_tiered, agent_evict
             agent flow: CreateSession on segment 0 (template head, instruction, first
             quarter of the context), three AppendToSession of the other quarters, one of
             the question; memory `tiered` / `evict`. B = int(L (1 - r)).
Policy `full` runs once per case (qaware, no compression): the reference.

The server offers no way to compress one prefilled cache several ways (ForkSession keeps
the source's policy; Compress returns positions, not a session), so every run prefills
its case again; the JSON records the seconds of each run, from which the time of a whole
run is extrapolated (docs/RESULTS.md).

Output JSON: {"schema": "echokv.longctx.v1", "meta": {...}, "records": [...],
"summary": [...]}; each record: case_id, task, length, n_tokens, setting, policy, ratio,
budget, compressed_tokens (L of the last compression), retained_entries, cache_dtype,
weights, target_mass (None: a fixed budget), retained_mass_mean / retained_mass_min (the
fidelity signal of the last compression), retained_per_layer, prediction, answers, score, seconds. Records are appended to OUT.partial.jsonl as they finish;
--resume skips the ones already there.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCHEMA = "echokv.longctx.v1"
POLICIES = ("echokv", "laq", "snapkv", "pyramidkv", "streamingllm", "h2o")
RATIOS = (0.5, 0.75, 0.9, 0.95)
SETTINGS = ("qaware", "qagnostic", "agent_tiered", "agent_evict")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# --quick: the 1K cases, index 0 of every task (7 cases), EchoKV, SnapKV and StreamingLLM
# at ratio 0.9, question-aware, plus EchoKV in the tiered agent flow (7 x 5 = 35 runs).
QUICK = {"lengths": [1024], "indices": [0], "policies": ["echokv", "snapkv", "streamingllm"],
         "ratios": [0.9], "settings": ["qaware", "agent_tiered"], "agent_policies": ["echokv"]}
# --smoke (the ctest, < 60 s): one 1K case, full + SnapKV at 0.5, question-aware and
# tiered agent flow (3 runs).
SMOKE = {"lengths": [1024], "indices": [0], "tasks": ["niah_single"], "policies": ["snapkv"],
         "ratios": [0.5], "settings": ["qaware", "agent_tiered"]}


sys.path.insert(0, os.path.join(ROOT, "tools"))
from longctx_suite import Tokenizer, score  # noqa: E402  (RULER's scoring, one definition)


def tokenize_cases(binary, model, cases):
    """Every segment's ids (one echokv-tokenize call; text input to the server would not
    parse the template's special tokens, so sessions get ids); checks the suite's counts."""
    tok = Tokenizer(binary, model)
    flat = [seg for c in cases for seg in c["segments"]]
    ids = tok._run(Tokenizer.SEP.join(flat))
    pieces, current = [], []
    for i in ids:
        if i == tok.sep_id:
            pieces.append(current)
            current = []
        else:
            current.append(i)
    pieces.append(current)
    assert len(pieces) == len(flat)
    at = 0
    for c in cases:
        c["segment_ids"] = pieces[at:at + len(c["segments"])]
        at += len(c["segments"])
        got = [len(p) for p in c["segment_ids"]]
        if got != c["segment_tokens"]:
            raise SystemExit("%s: segments tokenize to %s ids, the suite says %s" % (c["id"], got, c["segment_tokens"]))


def bootstrap(values, resamples=2000, seed=0):
    """Mean and 95 % percentile bootstrap interval over cases."""
    n = len(values)
    if n == 0:
        return None, None, None
    mean = sum(values) / n
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return mean, means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def budget_for(case, setting, ratio):
    if setting == "qagnostic":
        return max(1, int(case["context_tokens"] * (1 - ratio))) + case["question_tokens"]
    return max(1, int(case["n_tokens"] * (1 - ratio)))


class Server:
    def __init__(self, binary, model, threads, log_dir, weights="float32"):
        self.log_path = os.path.join(log_dir, "server.log")
        self.log = open(self.log_path, "w")
        ports = os.path.join(log_dir, "ports")
        cmd = [binary, "--insecure", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
               "--port-file", ports, "--max-sessions", "16"]
        if model:
            cmd += ["--model", model]
        if threads:
            cmd += ["--threads", str(threads)]
        if weights != "float32":
            cmd += ["--weights", weights]
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit("echokv-server exited:\n" + self.tail())
            if os.path.exists(ports):
                with open(ports) as f:
                    values = f.read().split()
                if len(values) == 3:
                    self.address = "127.0.0.1:%s" % values[0]
                    return
            time.sleep(0.05)
        raise SystemExit("echokv-server wrote no --port-file")

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        self.log.close()
        return code


def open_session(client, case, setting, policy, ratio, cache_dtype="float32", target_mass=None):
    """The case's session as `setting` builds it (module docstring), compressed by
    `policy` at `ratio`: (session, budget, seconds the session took to build); the
    caller deletes it. `target_mass` (echokv, snapkv): the quality-targeted budget,
    the ratio's budget its ceiling (docs/ALGORITHM.md §9)."""
    segs = case["segment_ids"]
    if policy == "full":
        comp, budget = {"policy": "full", "memory": "evict", "cache_dtype": cache_dtype}, None
    else:
        budget = budget_for(case, setting, ratio)
        memory = "tiered" if setting == "agent_tiered" else "evict"
        comp = {"policy": policy, "budget": budget, "memory": memory, "cache_dtype": cache_dtype}
        if policy == "echokv":
            comp["workspace"] = max(1024, budget)
        if target_mass is not None:
            comp["target_mass"] = target_mass
    t0 = time.monotonic()
    if setting == "qaware" or policy == "full":
        session = client.create(ids=[i for seg in segs for i in seg], **comp)
    elif setting == "qagnostic":
        session = client.create(ids=[i for seg in segs[:-1] for i in seg], **comp)
        session = client.append(session.id, ids=segs[-1])
    else:
        session = client.create(ids=segs[0], **comp)
        for seg in segs[1:]:
            session = client.append(session.id, ids=seg)
    return session, budget, time.monotonic() - t0


def run_one(client, case, setting, policy, ratio, cache_dtype="float32", weights="float32", max_tokens=None,
            target_mass=None):
    """One session of the case: its answer and figures. `cache_dtype` int8 (issue 31)
    stores the retained tier in int8; the record's policy is then "<policy>@int8". The
    reference (policy full, float32) is in every run; "full@int8" is the whole cache in
    int8 (llama.cpp's q8_0-cache choice: no eviction, only quantization). `weights` is
    the server's --weights (native: the GGUF's blocks as stored, issue 30): "@native" in
    the label. The record carries the last compression's fidelity signal (the share of
    its probes' attention mass the kept entries hold, mean and min over layers x groups;
    None for the full cache). `max_tokens` replaces the case's answer cap (the suite's
    per task) when given. `target_mass`: the quality-targeted budget at the ratio's
    budget as its ceiling ("<policy>@mass<t>"; the record's kept_fraction is what it
    kept)."""
    t0 = time.monotonic()
    session, budget, _ = open_session(client, case, setting, policy, ratio, cache_dtype, target_mass)
    try:
        if session.tokens_seen != case["n_tokens"]:
            raise SystemExit("%s: the session holds %d tokens, the suite measured %d"
                             % (case["id"], session.tokens_seen, case["n_tokens"]))
        result = client.generate(session.id, max_tokens=max_tokens or case["max_tokens"], temperature=0).collect()
    finally:
        client.delete(session.id)
    seconds = time.monotonic() - t0
    report = session.last_report
    mass_mean = report.retained_mass_mean if report is not None and policy != "full" else -1.0
    mass_min = report.retained_mass_min if report is not None and policy != "full" else -1.0
    return {
        "case_id": case["id"], "task": case["task"], "length": case["length"], "n_tokens": case["n_tokens"],
        "context_tokens": case["context_tokens"], "question_tokens": case["question_tokens"],
        "setting": setting, "ratio": 0.0 if policy == "full" else ratio, "budget": budget,
        "policy": label(policy, cache_dtype, weights, target_mass), "cache_dtype": cache_dtype, "weights": weights,
        "target_mass": target_mass,
        "retained_mass_mean": round(mass_mean, 6) if mass_mean >= 0 else None,
        "retained_mass_min": round(mass_min, 6) if mass_min >= 0 else None,
        "retained_kv_bytes": session.retained_kv_bytes,
        "compressed_tokens": report.context_tokens if report is not None else None,
        "retained_entries": session.retained_entries,
        "retained_per_layer": list(report.retained_per_layer) if report is not None else None,
        "kept_fraction": session.retained_kv_bytes / session.full_kv_bytes if session.full_kv_bytes else None,
        "max_tokens": max_tokens or case["max_tokens"], "prediction": result.text, "answers": case["answers"],
        "score": score(result.text, case["answers"], case["scoring"]), "seconds": round(seconds, 3),
    }


def cache_dtypes(text):
    """--cache-dtype: a comma list of float32 / int8."""
    out = text.split(",")
    for d in out:
        if d not in ("float32", "int8"):
            raise argparse.ArgumentTypeError("cache dtype %r is not float32 or int8" % d)
    return out


def label(policy, cache_dtype, weights="float32", target_mass=None):
    """A record's policy name: the policy, then "@native" for the server's native weights,
    "@<dtype>" for a cache dtype other than float32 and "@mass<t>" for a quality-targeted
    budget (echokv@native@int8, echokv@mass0.95)."""
    parts = [policy] + [x for x in (weights, cache_dtype) if x != "float32"]
    if target_mass is not None:
        parts.append("mass%g" % target_mass)
    return "@".join(parts)


def target_masses(text):
    """--target-mass: a comma list of values in (0, 1]."""
    out = [float(x) for x in text.split(",")]
    for m in out:
        if not 0 < m <= 1:
            raise argparse.ArgumentTypeError("target mass %g is not in (0, 1]" % m)
    return out


def mass_table(records):
    """The quality-targeted budgets beside the fixed ones (issue 29 point 4): per
    (setting, policy label, ratio): n, mean score [95 % CI], mean kept share of the full
    cache, and for @mass<t> labels how many cases met the target on the session's signal
    (retained_mass_mean >= t: what GetSession reports) and in every layer and group
    (retained_mass_min >= t), and the share of layers that kept the ceiling (the ratio's
    budget, where the target could be capped)."""
    cells = {}
    for r in records:
        if is_full(r["policy"]):
            continue
        cells.setdefault((r["setting"], r["policy"], r["ratio"]), []).append(r)
    lines = ["| setting | policy | ceiling r | n | score [95 % CI] | kept share | memory saved | mean signal "
             "| target met (mean) | target met (every layer) | layers at ceiling |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (setting, policy, ratio), rs in sorted(cells.items()):
        mean, lo, hi = bootstrap([r["score"] for r in rs])
        kept = [r["kept_fraction"] for r in rs if r.get("kept_fraction") is not None]
        share = sum(kept) / len(kept) if kept else float("nan")
        t = rs[0].get("target_mass")
        met_mean = met = ceiling = ""
        signal = [r["retained_mass_mean"] for r in rs if r.get("retained_mass_mean") is not None]
        if t is not None:
            met_mean = "%d / %d" % (sum((r["retained_mass_mean"] or 0) >= t - 1e-9 for r in rs), len(rs))
            met = "%d / %d" % (sum((r["retained_mass_min"] or 0) >= t - 1e-9 for r in rs), len(rs))
            # Layers that kept the ceiling (the ratio's budget): the target was capped there.
            per = [n >= r["budget"] for r in rs for n in r.get("retained_per_layer") or []]
            ceiling = "%.0f %%" % (100.0 * sum(per) / len(per)) if per else "?"
        lines.append("| %s | %s | %g | %d | %.2f [%.2f, %.2f] | %.3f | %.1f %% | %s | %s | %s | %s |" % (
            setting, policy, ratio, len(rs), mean, lo, hi, share, 100 * (1 - share),
            "%.3f" % (sum(signal) / len(signal)) if signal else "", met_mean, met, ceiling))
    return "\n".join(lines)


def is_full(policy):
    """full, full@int8, kvpress/full: a cache without eviction (one column for all ratios)."""
    return policy.split("@")[0].split("/")[-1] == "full"


def summarize(records):
    """Per (setting, policy, ratio, task) and over all tasks ("all"): n, mean, 95 % CI."""
    cells = {}
    for r in records:
        for task in (r["task"], "all"):
            cells.setdefault((r["setting"], r["policy"], r["ratio"], task), []).append(r["score"])
    out = []
    for (setting, policy, ratio, task), values in sorted(cells.items()):
        mean, lo, hi = bootstrap(values)
        out.append({"setting": setting, "policy": policy, "ratio": ratio, "task": task, "n": len(values),
                    "mean": round(mean, 4), "ci95": [round(lo, 4), round(hi, 4)]})
    return out


def load_records(paths):
    records, sources = [], []
    for path in paths:
        if path.endswith(".jsonl"):  # a run's OUT.partial.jsonl: its records so far
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip()]
            sources.append({"partial": path})
            continue
        with open(path) as f:
            data = json.load(f)
        assert data["schema"] == SCHEMA, path
        records += data["records"]
        sources.append(data["meta"])
    # A run repeated in several files (e.g. the full cache of each invocation) counts once:
    # the last one read.
    unique = {}
    for r in records:
        unique[(r["case_id"], r["setting"], r["policy"], r["ratio"])] = r
    return list(unique.values()), sources


def open_partial(out, resume):
    """OUT.partial.jsonl and the records already there by (case, setting, label, ratio):
    kept with `resume`, else the file is removed (a fresh run)."""
    partial = out + ".partial.jsonl"
    done = {}
    if resume and os.path.exists(partial):
        with open(partial) as f:
            for line in f:
                r = json.loads(line)
                done[(r["case_id"], r["setting"], r["policy"], r["ratio"])] = r
    elif os.path.exists(partial):
        os.unlink(partial)
    return partial, done


def run_plan(plan, partial, done, key, run, progress):
    """Runs every item of `plan` whose key(item) is not in `done`, appending each record
    to `partial` as it finishes; progress(k, item, record, elapsed) prints a line.
    Returns the records in plan order (the resumed ones included)."""
    records, started = [], time.monotonic()
    with open(partial, "a") as log:
        for k, item in enumerate(plan):
            if key(item) in done:
                records.append(done[key(item)])
                continue
            r = run(item)
            records.append(r)
            log.write(json.dumps(r, sort_keys=True) + "\n")
            log.flush()
            print("[%d/%d %.0fs] %s" % (k + 1, len(plan), time.monotonic() - started, progress(item, r)),
                  file=sys.stderr, flush=True)
    return records


def seconds_by_length(records):
    """{length: mean seconds per run} for the JSON's meta."""
    seconds = {}
    for r in records:
        seconds.setdefault(str(r["length"]), []).append(r["seconds"])
    return {k: round(sum(v) / len(v), 3) for k, v in seconds.items()}


def markdown(records, engine=None):
    """One table per task: rows (engine, setting, policy), columns the ratios."""
    ratios = sorted({r["ratio"] for r in records if not is_full(r["policy"])}) or [0.0]
    tasks = sorted({r["task"] for r in records}) + ["all"]
    summ = summarize(records)
    cell = {(s["setting"], s["policy"], s["ratio"], s["task"]): s for s in summ}
    engines = {}
    for r in records:
        engines[(r["setting"], r["policy"])] = r.get("engine", engine or "echokv-server")
    lines = []
    for task in tasks:
        lines.append("\n**%s**\n" % task)
        lines.append("| engine | setting | policy | n | " + " | ".join("r=%g" % x for x in ratios) + " |")
        lines.append("|---|---|---|---|" + "---|" * len(ratios))
        for (setting, policy) in sorted(engines, key=lambda k: (engines[k], k[0], k[1] != "full", k[1])):
            if is_full(policy):
                s = cell.get((setting, policy, 0.0, task))
                if s:
                    lines.append("| %s | %s | %s | %d | %s |" % (
                        engines[(setting, policy)], setting, policy, s["n"],
                        " | ".join(["%.2f [%.2f, %.2f]" % (s["mean"], *s["ci95"])] * len(ratios))))
                continue
            row = [cell.get((setting, policy, x, task)) for x in ratios]
            if not any(row):
                continue
            n = max(s["n"] for s in row if s)
            lines.append("| %s | %s | %s | %d | %s |" % (
                engines[(setting, policy)], setting, policy, n,
                " | ".join("%.2f [%.2f, %.2f]" % (s["mean"], *s["ci95"]) if s else "" for s in row)))
    return "\n".join(lines)


def compact(records):
    """One table per ratio: rows (engine, setting, policy), columns the tasks (mean) and
    all tasks (mean [95 % CI]); the full cache's row in every table."""
    summ = {(s["setting"], s["policy"], s["ratio"], s["task"]): s for s in summarize(records)}
    tasks = sorted({r["task"] for r in records})
    ratios = sorted({r["ratio"] for r in records if not is_full(r["policy"])}) or [0.0]
    rows = sorted({(r.get("engine", "echokv-server"), r["setting"], r["policy"]) for r in records},
                  key=lambda k: (k[0], k[1], not is_full(k[2]), k[2]))
    lines = []
    for ratio in ratios:
        lines.append("\n**r = %g**\n" % ratio)
        lines.append("| engine | setting | policy | n | " + " | ".join(tasks) + " | all [95 % CI] |")
        lines.append("|---|---|---|---|" + "---|" * (len(tasks) + 1))
        for engine, setting, policy in rows:
            at = 0.0 if is_full(policy) else ratio
            if (setting, policy, at, "all") not in summ:
                continue
            s = summ[(setting, policy, at, "all")]
            cells = ["%.2f" % summ[(setting, policy, at, t)]["mean"] if (setting, policy, at, t) in summ else ""
                     for t in tasks]
            lines.append("| %s | %s | %s | %d | %s | %.2f [%.2f, %.2f] |" % (
                engine, setting, policy, s["n"], " | ".join(cells), s["mean"], *s["ci95"]))
    return "\n".join(lines)


def paired(records, pairs):
    """Per (setting, ratio) and pair A=B of policies (e.g. snapkv=kvpress/snapkv): the
    mean per-case score difference A - B with its 95 % paired bootstrap interval, and how
    many cases gave the same answer text (stripped)."""
    by = {}
    for r in records:
        by[(r["setting"], r["policy"], r["ratio"], r["case_id"])] = r
    lines = ["| setting | A | B | ratio | n | mean A | mean B | A - B [95 % paired bootstrap] | same answer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a, b in pairs:
        # "policy" (both in the same setting) or "setting:policy" (e.g. agent_tiered:echokv).
        sa, a = a.split(":") if ":" in a else (None, a)
        sb, b = b.split(":") if ":" in b else (None, b)
        keys = sorted({(k[0], k[2]) for k in by if k[1] == a and sa in (None, k[0])})
        for setting, ratio in keys:
            other = sb or setting
            cases = sorted(k[3] for k in by if k[:3] == (setting, a, ratio) and (other, b, ratio, k[3]) in by)
            if not cases:
                continue
            ra = [by[(setting, a, ratio, c)] for c in cases]
            rb = [by[(other, b, ratio, c)] for c in cases]
            if sb:
                b = "%s:%s" % (sb, b)
            mean, lo, hi = bootstrap([x["score"] - y["score"] for x, y in zip(ra, rb)])
            same = sum(x["prediction"].strip() == y["prediction"].strip() for x, y in zip(ra, rb))
            lines.append("| %s | %s | %s | %g | %d | %.2f | %.2f | %+.2f [%+.2f, %+.2f] | %d / %d |" % (
                setting, a, b, ratio, len(cases), sum(x["score"] for x in ra) / len(ra),
                sum(y["score"] for y in rb) / len(rb), mean, lo, hi, same, len(cases)))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=os.path.join(ROOT, "build", "longctx_suite.jsonl"))
    parser.add_argument("--server-binary", default=os.path.join(ROOT, "build", "bin", "echokv-server"))
    parser.add_argument("--server", help="address of a running server instead of --server-binary")
    parser.add_argument("--model", help="the server's --model (default: the server's default, the GGUF)")
    parser.add_argument("--client", default=os.path.join(ROOT, "client", "python"))
    parser.add_argument("--tokenize-binary", default=os.path.join(ROOT, "build", "bin", "echokv-tokenize"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help=QUICK.__repr__())
    parser.add_argument("--smoke", action="store_true", help=SMOKE.__repr__())
    parser.add_argument("--tasks")
    parser.add_argument("--lengths")
    parser.add_argument("--indices", help="case indices within a (task, length) cell, e.g. 0,1")
    parser.add_argument("--policies")
    parser.add_argument("--ratios")
    parser.add_argument("--settings")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--max-tokens", type=int, help="answer cap for every case instead of the suite's per task "
                        "(e.g. to see whether an answer cut at the cap was on its way)")
    parser.add_argument("--weights", default="float32", choices=("float32", "native"),
                        help="the started server's --weights (records labelled <policy>@native); with "
                             "--server, what that server runs (it is not checked)")
    parser.add_argument("--cache-dtype", default="float32", type=cache_dtypes,
                        help="comma list of storages of the sessions' retained tier, e.g. float32,int8 "
                             "(records: policy@int8; 'full' in --policies adds full@int8)")
    parser.add_argument("--target-mass", type=target_masses,
                        help="comma list of target masses: echokv / snapkv in --policies also run with the "
                             "quality-targeted budget, each ratio's budget the ceiling (records: policy@mass<t>)")
    parser.add_argument("--mass-table", action="store_true",
                        help="with --summarize: the quality-targeted budgets beside the fixed ones")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="print markdown tables and exit")
    parser.add_argument("--compact", action="store_true", help="with --summarize: one table per ratio, tasks as columns")
    parser.add_argument("--pairs", help="with --summarize: paired differences, e.g. snapkv=kvpress/snapkv,...")
    args = parser.parse_args()
    if args.summarize:
        records, _ = load_records(args.summarize)
        print(mass_table(records) if args.mass_table else compact(records) if args.compact else markdown(records))
        if args.pairs:
            print()
            print(paired(records, [p.split("=") for p in args.pairs.split(",")]))
        return 0
    if not args.out:
        parser.error("--out is required")
    preset = SMOKE if args.smoke else QUICK if args.quick else {}
    tasks = args.tasks.split(",") if args.tasks else preset.get("tasks")
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else preset.get("lengths")
    indices = [int(x) for x in args.indices.split(",")] if args.indices else preset.get("indices")
    policies = args.policies.split(",") if args.policies else preset.get("policies", list(POLICIES))
    ratios = [float(x) for x in args.ratios.split(",")] if args.ratios else preset.get("ratios", list(RATIOS))
    settings = args.settings.split(",") if args.settings else preset.get("settings", list(SETTINGS))
    with open(args.suite) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    cases = [c for c in cases if (tasks is None or c["task"] in tasks) and (lengths is None or c["length"] in lengths)
             and (indices is None or c["index"] in indices)]
    if not cases:
        raise SystemExit("no case of %s matches" % args.suite)
    model = args.model or os.path.join(os.environ.get("ECHOKV_MODELS") or os.path.join(ROOT, ".cache", "models"),
                                       GGUF_NAME)
    tokenize_cases(args.tokenize_binary, model, cases)
    plan = []
    for c in cases:
        plan.append((c, "qaware", "full", 0.0, "float32", None))
        for dtype in args.cache_dtype:
            if dtype != "float32" and "full" in policies:
                plan.append((c, "qaware", "full", 0.0, dtype, None))
            for setting in settings:
                for policy in (preset.get("agent_policies", policies) if setting.startswith("agent") else policies):
                    if policy != "full":
                        for ratio in ratios:
                            plan.append((c, setting, policy, ratio, dtype, None))
                            if policy in ("echokv", "snapkv"):
                                for m in args.target_mass or []:
                                    plan.append((c, setting, policy, ratio, dtype, m))
    partial, done = open_partial(args.out, args.resume)
    # SIGTERM ends the run like Ctrl-C: the finally below stops the server it started.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    sys.path.insert(0, args.client)
    import echokv
    tmp = tempfile.TemporaryDirectory(prefix="echokv-longctx-")
    server = None
    if not args.server:
        server = Server(args.server_binary, model, args.threads, tmp.name, args.weights)
        address = server.address
    else:
        address = args.server
    started = time.monotonic()
    try:
        client = echokv.Client(address)
        info = client.info()
        records = run_plan(
            plan, partial, done,
            key=lambda item: (item[0]["id"], item[1], label(item[2], item[4], args.weights, item[5]), item[3]),
            run=lambda item: run_one(client, *item[:5], args.weights, args.max_tokens, item[5]),
            progress=lambda item, r: "%s %s %s r=%g B=%s -> %.2f (%.1fs) %r" % (
                item[0]["id"], item[1], r["policy"], item[3], r["budget"], r["score"], r["seconds"],
                r["prediction"][:60]))
        client.close()
    except BaseException:
        if server is not None:
            sys.stderr.write("---- echokv-server log (tail) ----\n" + server.tail() + "\n")
        raise
    finally:
        if server is not None:
            server.stop()
    meta = {
        "engine": "echokv-server", "door": "grpc", "suite": os.path.basename(args.suite),
        "model": info.model.name if hasattr(info, "model") and hasattr(info.model, "name") else GGUF_NAME,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "argv": sys.argv[1:], "cases": len(cases), "runs": len(records),
        "wall_seconds": round(time.monotonic() - started, 1),
        "mean_run_seconds_by_length": seconds_by_length(records),
        "policies": policies, "ratios": ratios, "settings": settings, "weights": args.weights,
        "max_tokens": args.max_tokens, "target_mass": args.target_mass,
    }
    out = {"schema": SCHEMA, "meta": meta, "records": records, "summary": summarize(records)}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
