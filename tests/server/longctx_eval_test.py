#!/usr/bin/python3
"""bench/eval/longctx_eval.py --smoke end to end against the real binary and the real
model (SmolLM2-135M-Instruct Q4_1 GGUF): the committed quick suite
(bench/data/longctx_quick.jsonl, tools/longctx_suite.py's 1K cells) is tokenized by
echokv-tokenize, sent as sessions over gRPC (question-aware and tiered agent flow), and
the JSON it writes must have the schema, one scored record per planned run, the session
token counts the suite measured (the evaluator refuses a mismatch), and the full cache's
answer right (the floor: full-cache accuracy 1.0 on niah_single-1k-00, measured
2026-12-02 by our server and by transformers + kvpress alike, docs/RESULTS.md). Each
compressed record carries the fidelity signal (retained attention mass), which
bench/eval/mass_correlation.py tabulates against the drop; bench/eval/retention_map.py
maps one session's kept positions with the needle found at its own tokens.

    /usr/bin/python3 tests/server/longctx_eval_test.py --server-binary build/bin/echokv-server \\
        --tokenize-binary build/bin/echokv-tokenize --client client/python

Without the model the script exits 77 (ctest: skipped, which CI counts as a failure).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import unittest

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUITE = os.path.join(ROOT, "bench", "data", "longctx_quick.jsonl")
FULL_FLOOR = 1.0
ARGS = None
RECORD_KEYS = {"case_id", "task", "length", "n_tokens", "context_tokens", "question_tokens", "setting", "policy",
               "ratio", "budget", "compressed_tokens", "retained_entries", "kept_fraction", "prediction", "answers",
               "score", "seconds", "cache_dtype", "weights", "retained_mass_mean", "retained_mass_min", "max_tokens"}


def model_path():
    folder = os.environ.get("ECHOKV_MODELS") or os.path.join(ROOT, ".cache", "models")
    path = os.path.join(folder, GGUF_NAME)
    return path if os.path.isfile(path) else None


class LongctxEvalTest(unittest.TestCase):
    def test_smoke_run_writes_every_record_scored_and_the_full_cache_answers(self):
        with open(SUITE, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with open(os.path.join(ROOT, "docs", "results", "longctx", "quick_suite.sha256")) as f:
            self.assertEqual(digest, f.read().split()[0], "bench/data/longctx_quick.jsonl changed")
        with tempfile.TemporaryDirectory(prefix="echokv-longctx-test-") as tmp:
            out = os.path.join(tmp, "smoke.json")
            run = subprocess.run(
                [sys.executable, os.path.join(ROOT, "bench", "eval", "longctx_eval.py"), "--smoke",
                 "--suite", SUITE, "--server-binary", ARGS.server_binary, "--tokenize-binary",
                 ARGS.tokenize_binary, "--client", ARGS.client, "--model", ARGS.model, "--out", out],
                capture_output=True, text=True, timeout=600)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            self.assertIn("[3/3 ", run.stderr, "progress lines")
            with open(out) as f:
                data = json.load(f)
            # The fidelity signal against the accuracy drop, over this output (issue 29).
            corr = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "eval", "mass_correlation.py"), out,
                                   "--svg", os.path.join(tmp, "mass.svg")], capture_output=True, text=True,
                                  timeout=60)
            self.assertEqual(corr.returncode, 0, corr.stderr[-3000:])
            with open(os.path.join(tmp, "mass.svg")) as f:
                self.assertIn(">snapkv</text>", f.read())
        self.assertEqual(data["schema"], "echokv.longctx.v1")
        for key in ("engine", "commit", "date_utc", "cases", "runs", "mean_run_seconds_by_length"):
            self.assertIn(key, data["meta"])
        records = data["records"]
        planned = {("full", "qaware", 0.0), ("snapkv", "qaware", 0.5), ("snapkv", "agent_tiered", 0.5)}
        self.assertEqual({(r["policy"], r["setting"], r["ratio"]) for r in records}, planned)
        self.assertEqual(len(records), 3)
        with open(SUITE) as f:
            case = next(json.loads(line) for line in f if '"niah_single-1k-00"' in line)
        for r in records:
            self.assertTrue(RECORD_KEYS <= set(r), RECORD_KEYS - set(r))
            self.assertEqual(r["case_id"], "niah_single-1k-00")
            self.assertEqual(r["n_tokens"], case["n_tokens"])
            self.assertTrue(0.0 <= r["score"] <= 1.0)
            self.assertIsInstance(r["prediction"], str)
            self.assertEqual(r["weights"], "float32")
            self.assertEqual(r["max_tokens"], case["max_tokens"])
            if r["policy"] == "full":
                self.assertIsNone(r["retained_mass_mean"])
                self.assertIsNone(r["budget"])
                self.assertEqual(r["retained_entries"], 30 * 3 * case["n_tokens"])  # layers x KV groups x L
            else:
                # The share of SnapKV's window attention the kept half holds: above what
                # half the entries picked blindly would hold on average, at most all of it.
                self.assertGreater(r["retained_mass_min"], 0.0)
                self.assertLessEqual(r["retained_mass_min"], r["retained_mass_mean"])
                self.assertLessEqual(r["retained_mass_mean"], 1.0)
                self.assertGreater(r["retained_mass_mean"], 0.5)
                self.assertEqual(r["budget"], int(case["n_tokens"] * 0.5))
                self.assertEqual(r["retained_entries"], 30 * 3 * r["budget"])
                self.assertEqual(r["compressed_tokens"], case["n_tokens"])
        # One row per (policy, ratio) with its signal, drop and the lost count.
        drop = None
        full_score = next(r["score"] for r in records if r["policy"] == "full")
        for r in records:
            if r["policy"] == "snapkv" and r["setting"] == "qaware":
                case_drop = full_score - r["score"]
                drop = "| snapkv | 0.5 | 1 | %.3f | %+.3f | %d |" % (r["retained_mass_mean"], case_drop,
                                                                   1 if case_drop > 0 else 0)
        self.assertIn(drop, corr.stdout)
        full = [r["score"] for r in records if r["policy"] == "full"]
        self.assertGreaterEqual(sum(full) / len(full), FULL_FLOOR, [r["prediction"] for r in records])
        cells = {(s["setting"], s["policy"], s["ratio"], s["task"]) for s in data["summary"]}
        self.assertIn(("qaware", "full", 0.0, "all"), cells)
        for s in data["summary"]:
            lo, hi = s["ci95"]
            self.assertTrue(lo <= s["mean"] <= hi, s)

    def test_int8_run_stores_the_retained_tier_at_68_of_256_bytes_and_plots_the_frontier(self):
        """--cache-dtype int8 with full in --policies (issue 31): the float32 reference,
        full@int8 and snapkv@int8, with the bytes the server reports (64 int8 codes + one
        float32 scale per row of a KV group: 68 / 256 of float32), and the frontier plot
        of that output."""
        with tempfile.TemporaryDirectory(prefix="echokv-longctx-int8-") as tmp:
            out = os.path.join(tmp, "int8.json")
            run = subprocess.run(
                [sys.executable, os.path.join(ROOT, "bench", "eval", "longctx_eval.py"), "--suite", SUITE,
                 "--tasks", "niah_single", "--lengths", "1024", "--indices", "0", "--policies", "full,snapkv",
                 "--ratios", "0.5", "--settings", "qaware", "--cache-dtype", "int8", "--server-binary",
                 ARGS.server_binary, "--tokenize-binary", ARGS.tokenize_binary, "--client", ARGS.client,
                 "--model", ARGS.model, "--out", out], capture_output=True, text=True, timeout=600)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            with open(out) as f:
                records = {r["policy"]: r for r in json.load(f)["records"]}
            svg = os.path.join(tmp, "frontier.svg")
            plot = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "eval", "frontier_plot.py"), out,
                                   "--svg", svg], capture_output=True, text=True, timeout=60)
            self.assertEqual(plot.returncode, 0, plot.stderr[-3000:])
            with open(svg) as f:
                picture = f.read()
        self.assertEqual(set(records), {"full", "full@int8", "snapkv@int8"})
        self.assertEqual(records["full"]["cache_dtype"], "float32")
        self.assertEqual(records["full"]["kept_fraction"], 1.0)
        self.assertEqual(records["full@int8"]["cache_dtype"], "int8")
        self.assertAlmostEqual(records["full@int8"]["kept_fraction"], 68 / 256, places=9)
        budget = records["snapkv@int8"]["budget"]
        self.assertAlmostEqual(records["snapkv@int8"]["kept_fraction"],
                               68 / 256 * budget / records["snapkv@int8"]["n_tokens"], places=9)
        # The quantized full cache still finds the needle (measured 2026-12-03: ' 5140175.').
        self.assertEqual(records["full@int8"]["score"], 1.0, records["full@int8"]["prediction"])
        self.assertIn("| echokv-server | full@int8 | 0 | 1 | 0.2656 | 1.000 |", plot.stdout)
        self.assertTrue(picture.startswith("<svg") and picture.rstrip().endswith("</svg>"))
        self.assertIn(">full@int8</text>", picture)


class TargetMassEvalTest(unittest.TestCase):
    def test_target_mass_runs_beside_the_fixed_budget_and_the_table_counts_the_target(self):
        """--target-mass 0.95 (issue 29 point 4): echokv at r = 0.5 and echokv@mass0.95
        with the same budget as its ceiling on the real model; the targeted run keeps
        fewer entries, its layers below the ceiling reach the mass, and --mass-table
        reports it."""
        with tempfile.TemporaryDirectory(prefix="echokv-longctx-mass-") as tmp:
            out = os.path.join(tmp, "mass.json")
            run = subprocess.run(
                [sys.executable, os.path.join(ROOT, "bench", "eval", "longctx_eval.py"), "--suite", SUITE,
                 "--tasks", "niah_single", "--lengths", "1024", "--indices", "0", "--policies", "echokv",
                 "--ratios", "0.5", "--settings", "qaware", "--target-mass", "0.95", "--server-binary",
                 ARGS.server_binary, "--tokenize-binary", ARGS.tokenize_binary, "--client", ARGS.client,
                 "--model", ARGS.model, "--out", out], capture_output=True, text=True, timeout=600)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            with open(out) as f:
                records = {r["policy"]: r for r in json.load(f)["records"]}
            table = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "eval", "longctx_eval.py"),
                                    "--summarize", out, "--mass-table"], capture_output=True, text=True, timeout=60)
            self.assertEqual(table.returncode, 0, table.stderr[-3000:])
        self.assertEqual(set(records), {"full", "echokv", "echokv@mass0.95"})
        fixed, targeted = records["echokv"], records["echokv@mass0.95"]
        self.assertIsNone(fixed["target_mass"])
        self.assertEqual(targeted["target_mass"], 0.95)
        self.assertEqual(targeted["budget"], fixed["budget"])
        self.assertEqual(fixed["retained_per_layer"], [fixed["budget"]] * 30)
        per_layer = targeted["retained_per_layer"]
        self.assertEqual(len(per_layer), 30)
        self.assertTrue(all(1 <= n <= fixed["budget"] for n in per_layer), per_layer)
        self.assertLess(sum(per_layer), sum(fixed["retained_per_layer"]))
        self.assertLess(targeted["kept_fraction"], fixed["kept_fraction"])
        if all(n < fixed["budget"] for n in per_layer):
            self.assertGreaterEqual(targeted["retained_mass_min"], 0.95 - 1e-6)
        row = [l for l in table.stdout.splitlines() if "| echokv@mass0.95 |" in l]
        self.assertEqual(len(row), 1, table.stdout)
        self.assertIn("| qaware | echokv@mass0.95 | 0.5 | 1 |", row[0])


class RetentionMapTest(unittest.TestCase):
    def test_map_marks_the_needle_and_counts_what_each_layer_kept(self):
        """bench/eval/retention_map.py on niah_single-1k-00, SnapKV at r = 0.5: the
        evidence span it finds holds the needle's own tokens (tokenized alone), and the
        map draws every kept run of the 30 x 3 rows (the session's InspectCache)."""
        with tempfile.TemporaryDirectory(prefix="echokv-retention-test-") as tmp:
            svg = os.path.join(tmp, "map.svg")
            run = subprocess.run(
                [sys.executable, os.path.join(ROOT, "bench", "eval", "retention_map.py"), "--suite", SUITE,
                 "--case", "niah_single-1k-00", "--policies", "snapkv", "--ratio", "0.5", "--server-binary",
                 ARGS.server_binary, "--tokenize-binary", ARGS.tokenize_binary, "--client", ARGS.client,
                 "--model", ARGS.model, "--svg", svg], capture_output=True, text=True, timeout=600)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            with open(svg) as f:
                picture = f.read()
        sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
        import longctx_eval as ev
        with open(SUITE) as f:
            case = next(json.loads(line) for line in f if '"niah_single-1k-00"' in line)
        ev.tokenize_cases(ARGS.tokenize_binary, ARGS.model, [case])
        ids = [i for seg in case["segment_ids"] for i in seg]
        spans = json.loads(run.stdout.split("evidence at ")[1].split(", question")[0].replace("(", "[")
                           .replace(")", "]"))
        self.assertEqual(len(spans), 1, run.stdout)  # one needle
        tok = ev.Tokenizer(ARGS.tokenize_binary, ARGS.model)
        answer = tok.ids(case["answers"][0])
        start, end = spans[0]
        window = ids[start - 1:end + 1]  # within a token of the boundary
        self.assertTrue(any(window[k:k + len(answer)] == answer for k in range(len(window))),
                        (window, answer))
        self.assertIn("snapkv, r = 0.5 (B = %d)" % int(case["n_tokens"] * 0.5), run.stdout)
        self.assertIn("evidence kept per 5 layers:", run.stdout)
        self.assertTrue(picture.startswith("<svg") and picture.rstrip().endswith("</svg>"))
        self.assertGreater(picture.count("<rect "), 90)  # at least one kept run per row


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--tokenize-binary", required=True)
    parser.add_argument("--client", required=True)
    args, rest = parser.parse_known_args()
    args.model = model_path()
    if args.model is None:
        print("SKIPPED: %s is in no models folder ($ECHOKV_MODELS or .cache/models): run scripts/setup.sh"
              % GGUF_NAME)
        return SKIP
    ARGS = args
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
