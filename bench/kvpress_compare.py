#!/usr/bin/env python3
"""kvpress side by side (issue 29 point 3): the long-context suite's cases on the same
GGUF (transformers' gguf_file= loader, dequantized to float32 on the CPU) with kvpress's
presses at the same compression ratios, writing the JSON schema of
bench/eval/longctx_eval.py (engine "kvpress"), so `longctx_eval.py --summarize` puts
both in one table.

    tools/kvpress_venv.sh                      # once: .venv-kvpress with kvpress, transformers, torch
    .venv-kvpress/bin/python bench/kvpress_compare.py --suite build/longctx_suite.jsonl \\
        --out docs/results/longctx/kvpress_1k.json [--quick] [--presses snapkv,streamingllm] [--ratios 0.5,0.9]

Settings, matched explicitly to ours on the same token ids (the evaluator's segments,
tokenized by echokv-tokenize; the JSON records both counts):
  qaware     the whole prompt (context + question + generation prompt + answer prefix) is
             prefilled under the press (kvpress compresses each layer's cache in a forward
             hook after its attention ran over the whole prompt, as our one-shot prefill +
             compression does); the first answer token comes from the prefill's last logits.
  qagnostic  kvpress's own default (its pipeline): the context alone is prefilled under the
             press, then the question ids run uncompressed on top; greedy answer.
Presses: SnapKV and PyramidKV with our window and kernel (snapkv_window 32, snapkv_kernel
7, compression/config.h; kvpress's defaults are 64 and 5), StreamingLLM (4 sinks, as
ours), ExpectedAttention, TOVA, Knorm, AdaKV (over SnapKV, alpha_safeguard 0.2), all at
their defaults otherwise. Greedy decoding with explicit position ids after compression,
as kvpress's pipeline does (generate_answer), stopping at the model's EOS.

--cache quanto4 (or quanto2) runs every case on transformers' QuantizedCache, the
quantized cache kvpress documents (KIVI-style, optimum-quanto backend: int4 / int2 in
groups of 64 with a scale and a shift per group, the last <= 128 tokens in full
precision; its presses re-quantize what they keep); records are labelled
"kvpress/<press>@quanto4". quanto offers 2 and 4 bits only (no 8-bit cache here).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import longctx_eval as ev  # noqa: E402  (schema, scoring, bootstrap, tables: one definition)

PRESSES = ("snapkv", "pyramidkv", "streamingllm", "expected_attention", "tova", "knorm", "adakv")
QUICK = {"lengths": [1024], "indices": [0], "presses": ["snapkv", "streamingllm", "expected_attention"],
         "ratios": [0.9], "settings": ["qaware"]}


def make_press(name, ratio):
    import kvpress
    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=7)
    if name == "pyramidkv":
        return kvpress.PyramidKVPress(compression_ratio=ratio, window_size=32, kernel_size=7)
    if name == "streamingllm":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)
    if name == "expected_attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=ratio)
    if name == "tova":
        return kvpress.TOVAPress(compression_ratio=ratio)
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=ratio)
    if name == "adakv":
        return kvpress.AdaKVPress(press=kvpress.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=7))
    raise ValueError(name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=os.path.join(ROOT, "build", "longctx_suite.jsonl"))
    parser.add_argument("--model", default=os.path.join(os.environ.get("ECHOKV_MODELS") or
                                                        os.path.join(ROOT, ".cache", "models"), ev.GGUF_NAME))
    parser.add_argument("--tokenize-binary", default=os.path.join(ROOT, "build", "bin", "echokv-tokenize"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks")
    parser.add_argument("--lengths")
    parser.add_argument("--indices")
    parser.add_argument("--presses", help="comma-separated (%s); 'full' adds the uncompressed reference, which "
                        "runs by default when --presses is not given" % ",".join(PRESSES))
    parser.add_argument("--ratios")
    parser.add_argument("--settings")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--cache", default="dynamic", choices=("dynamic", "quanto4", "quanto2"),
                        help="transformers' DynamicCache (float32) or QuantizedCache (optimum-quanto, 4 or 2 bits)")
    args = parser.parse_args()
    preset = QUICK if args.quick else {}
    tasks = args.tasks.split(",") if args.tasks else preset.get("tasks")
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else preset.get("lengths")
    indices = [int(x) for x in args.indices.split(",")] if args.indices else preset.get("indices")
    presses = args.presses.split(",") if args.presses else preset.get("presses", list(PRESSES))
    ratios = [float(x) for x in args.ratios.split(",")] if args.ratios else preset.get("ratios", list(ev.RATIOS))
    settings = args.settings.split(",") if args.settings else preset.get("settings", ["qaware", "qagnostic"])
    with open(args.suite) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    cases = [c for c in cases if (tasks is None or c["task"] in tasks) and (lengths is None or c["length"] in lengths)
             and (indices is None or c["index"] in indices)]
    ev.tokenize_cases(args.tokenize_binary, args.model, cases)

    import torch
    import transformers
    import kvpress
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
    torch.set_num_threads(args.threads)
    gdir, gfile = os.path.dirname(os.path.abspath(args.model)), os.path.basename(args.model)
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gfile)
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gfile, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])

    def answer(case, setting, press):
        segs = case["segment_ids"]
        if setting == "qaware":
            prefill, question = [i for s in segs for i in s], []
        else:
            prefill, question = [i for s in segs[:-1] for i in s], segs[-1]
        if args.cache == "dynamic":
            cache = DynamicCache()
        else:
            from transformers import QuantizedCache
            cache = QuantizedCache("quanto", model.config, nbits=int(args.cache[len("quanto"):]))
        with torch.inference_mode():
            ctx = torch.tensor([prefill])
            with press(model) if press is not None else _null():
                hidden = model.model(input_ids=ctx, past_key_values=cache).last_hidden_state
            # Entries kept, summed over layers and KV heads as our retained_entries (PyramidKV
            # keeps a different length per layer; AdaKV keeps them all and masks per head).
            kept = sum(layer.get_seq_length() * model.config.num_key_value_heads for layer in cache.layers)
            pos = len(prefill)
            if question:
                out = model(input_ids=torch.tensor([question]), past_key_values=cache,
                            position_ids=torch.arange(pos, pos + len(question)).unsqueeze(0), logits_to_keep=1)
                logits = out.logits[0, -1]
                pos += len(question)
            else:
                logits = model.lm_head(hidden[:, -1:])[0, -1]
            ids = [int(logits.argmax())]
            for _ in range(case["max_tokens"] - 1):
                if ids[-1] in eos:
                    break
                out = model(input_ids=torch.tensor([[ids[-1]]]), past_key_values=cache,
                            position_ids=torch.tensor([[pos]]))
                pos += 1
                ids.append(int(out.logits[0, -1].argmax()))
        if ids and ids[-1] in eos:
            ids = ids[:-1]
        return tok.decode(ids, skip_special_tokens=True), kept

    # The full-cache reference runs when --presses is not given or names "full".
    plan = [(c, "qaware", "full", 0.0) for c in cases] if not args.presses or "full" in presses else []
    presses = [p for p in presses if p != "full"]
    plan += [(c, s, p, r) for c in cases for s in settings for p in presses for r in ratios]
    partial, done = ev.open_partial(args.out, args.resume)
    cache_dtype = "float32" if args.cache == "dynamic" else args.cache  # the records' dtype and label suffix
    layers_groups = model.config.num_hidden_layers * model.config.num_key_value_heads

    def run(item):
        case, setting, name, ratio = item
        t0 = time.monotonic()
        press = None if name == "full" else make_press(name, ratio)
        text, kept = answer(case, setting, press)
        compressed = case["n_tokens"] if setting == "qaware" else case["context_tokens"]
        return {
            "case_id": case["id"], "task": case["task"], "length": case["length"], "n_tokens": case["n_tokens"],
            "context_tokens": case["context_tokens"], "question_tokens": case["question_tokens"],
            "setting": setting, "policy": ev.label("kvpress/" + name, cache_dtype), "ratio": ratio,
            "engine": "kvpress", "cache_dtype": cache_dtype,
            "budget": None if name == "full" else int(compressed * (1 - ratio)),
            "compressed_tokens": compressed,
            "retained_entries": kept + (layers_groups * case["question_tokens"] if setting == "qagnostic" else 0),
            "kept_fraction": kept / (layers_groups * compressed), "entries_kept_at_compression": kept,
            "max_tokens": case["max_tokens"], "prediction": text, "answers": case["answers"],
            "score": ev.score(text, case["answers"], case["scoring"]), "seconds": round(time.monotonic() - t0, 3),
        }

    started = time.monotonic()
    records = ev.run_plan(
        plan, partial, done,
        key=lambda item: (item[0]["id"], item[1], ev.label("kvpress/" + item[2], cache_dtype), item[3]),
        run=run,
        progress=lambda item, r: "%s %s %s r=%g entries=%d -> %.2f (%.1fs) %r" % (
            item[0]["id"], item[1], item[2], item[3], r["entries_kept_at_compression"], r["score"], r["seconds"],
            r["prediction"][:60]))
    meta = {
        "engine": "kvpress", "kvpress": getattr(kvpress, "__version__", None) or _version("kvpress"),
        "transformers": transformers.__version__, "torch": torch.__version__, "threads": args.threads,
        "suite": os.path.basename(args.suite), "model": ev.GGUF_NAME,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "argv": sys.argv[1:], "cases": len(cases), "runs": len(records),
        "wall_seconds": round(time.monotonic() - started, 1),
        "mean_run_seconds_by_length": ev.seconds_by_length(records),
        "presses": presses, "ratios": ratios, "settings": settings, "cache": args.cache,
    }
    with open(args.out, "w") as f:
        json.dump({"schema": ev.SCHEMA, "meta": meta, "records": records, "summary": ev.summarize(records)},
                  f, indent=1, sort_keys=True)
    print(ev.markdown(records))
    return 0


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _version(name):
    from importlib.metadata import version
    return version(name)


if __name__ == "__main__":
    sys.exit(main())
