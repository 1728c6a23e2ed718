#!/usr/bin/python3
"""bench/eval/longctx_eval.py --smoke end to end against the real binary and the real
model (SmolLM2-135M-Instruct Q4_1 GGUF): the committed quick suite
(bench/data/longctx_quick.jsonl, tools/longctx_suite.py's 1K cells) is tokenized by
echokv-tokenize, sent as sessions over gRPC (question-aware and tiered agent flow), and
the JSON it writes must have the schema, one scored record per planned run, the session
token counts the suite measured (the evaluator refuses a mismatch), and the full cache's
answer right (the floor: full-cache accuracy 1.0 on niah_single-1k-00, measured
2026-12-02 by our server and by transformers + kvpress alike, docs/RESULTS.md).

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
               "score", "seconds"}


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
            if r["policy"] == "full":
                self.assertIsNone(r["budget"])
                self.assertEqual(r["retained_entries"], 30 * 3 * case["n_tokens"])  # layers x KV groups x L
            else:
                self.assertEqual(r["budget"], int(case["n_tokens"] * 0.5))
                self.assertEqual(r["retained_entries"], 30 * 3 * r["budget"])
                self.assertEqual(r["compressed_tokens"], case["n_tokens"])
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
