#!/usr/bin/env python3
"""Writes the real-model oracles of issue 27 into tests/model/testdata/smollm2/, from Hugging Face
transformers loading SmolLM2-135M-Instruct.Q4_1.gguf itself (dequantized to float32 on the CPU):

  prompts.json          16 prompts (short / ~1 K / ~4 K tokens, raw text and chat-rendered): text,
                        messages, source file, token ids
  logits_last.f32       float32 logits at each prompt's last position, [16, 49152] row-major
  logits_early.f32      float32 logits at positions 0 and 1023 of the four ~4 K prompts, [8, 49152]
  logits.json           shapes, row table, sha256, per-row scale and top-5 ids/values
  greedy.json           64 greedy tokens per prompt, with the top-2 ids/logits and margin per step
  tokenization.json     a mixed corpus: ids (add_special_tokens True/False), tokens, decodes,
                        single-id decodes; next to each, the ids of SmolLM2's own pre-tokenizer
  chat_template.json    apply_chat_template renders (tokenize=False) and their ids (tokenize=True)
  facts.json            what transformers built: config, tokenizer pipeline, q/k layout checks
  hf_export/            the small files of save_pretrained (config, generation config, tokenizer)

and the whole save_pretrained export (with model.safetensors, ~540 MB) into --export-dir, which is
never committed. Run by hand in the oracle venv (tools/oracle/make_venv.sh); no test runs it:

  .cache/oracle-venv/bin/python tools/oracle/make_model_goldens.py \
      [--gguf /work/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--export-dir /work/models/smollm2-hf-export]

Prompt texts are cut from Debian's /usr/share/common-licenses (package base-files: Apache-2.0,
MPL-2.0, GPL-2, GPL-3, LGPL-2, LGPL-2.1, GFDL-1.3, CC0-1.0, Artistic) at paragraph boundaries; the
cut texts, the files' sha256 and the rendered prompts are stored in prompts.json, so the goldens
do not depend on those files after generation. Everything runs in float32 with sdpa attention
(transformers' default), 2 threads; the output is deterministic.
"""
import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

LICENSES = "/usr/share/common-licenses"
VOCAB = 49152
N_NEW = 64
EARLY_POSITIONS = [0, 1023]


# ---------------------------------------------------------------------------------------------
# Prompts


def source_text(name):
    path = os.path.join(LICENSES, name)
    with open(path, "rb") as fh:
        data = fh.read()
    return data.decode("utf-8"), hashlib.sha256(data).hexdigest()


WS_BEFORE_DIGIT = re.compile(r"\s{2,}(?=[0-9])")


def collapse_ws_before_digits(text):
    """A run of two or more whitespace characters right before a digit becomes one newline (if it
    has one) or one space. That run is where transformers' GGUF tokenizer (GPT-2 split alone) and
    SmolLM2's own (digits split first, as llama.cpp's `smollm`) differ: "\n  3" is [ĊĠ, Ġ, 3]
    in the first and [ĊĠĠ, 3] in the second. Without such runs both give the same ids, so these prompts test the model, not
    that choice (tokenization.json tests the choice)."""
    return WS_BEFORE_DIGIT.sub(lambda m: "\n" if "\n" in m.group(0) else " ", text)


def cut(tok, name, target, start_paragraph=0, budget=0):
    """Whole paragraphs of a licence file from `start_paragraph` on, until the text has at least
    `target - budget` tokens, with collapse_ws_before_digits applied. Returns (text, source)."""
    text, sha = source_text(name)
    paras = text.split("\n\n")
    out = []
    i = start_paragraph
    while i < len(paras):
        out.append(paras[i])
        i += 1
        joined = collapse_ws_before_digits("\n\n".join(out))
        if len(tok(joined, add_special_tokens=False)["input_ids"]) >= target - budget:
            break
    return collapse_ws_before_digits("\n\n".join(out)), {
        "file": os.path.join(LICENSES, name), "sha256": sha, "paragraphs": [start_paragraph, i],
        "cut": "text.split('\\n\\n')[a:b] joined with '\\n\\n', then collapse_ws_before_digits"}


def paragraph_after(tok, name, target):
    """Index of the first paragraph after `target` tokens (so two cuts of a file do not overlap)."""
    text, _ = source_text(name)
    paras = text.split("\n\n")
    for i in range(1, len(paras)):
        if len(tok("\n\n".join(paras[:i]), add_special_tokens=False)["input_ids"]) >= target:
            return i
    return len(paras)


def build_prompts(tok):
    P = []

    def raw(name, length, text, source=None):
        P.append({"name": name, "kind": "raw", "length": length, "text": text, "source": source})

    def chat(name, length, messages, source=None):
        P.append({"name": name, "kind": "chat", "length": length, "messages": messages,
                  "source": source})

    raw("raw_short_capital", "short", "The capital of France is")
    raw("raw_short_code", "short", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
    raw("raw_short_story", "short", "Once upon a time, in a small village by the sea,")
    chat("chat_short_question", "short", [{"role": "user", "content": "What is the capital of France?"}])
    chat("chat_short_system", "short", [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Write a haiku about the sea."}])
    chat("chat_short_multiturn", "short", [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a fun fact about octopuses."}])

    t, s = cut(tok, "Apache-2.0", 1000)
    raw("raw_1k_apache", "1k", t, s)
    t, s = cut(tok, "MPL-2.0", 1000)
    raw("raw_1k_mpl", "1k", t, s)
    t, s = cut(tok, "GPL-2", 1000)
    raw("raw_1k_gpl2", "1k", t, s)
    t, s = cut(tok, "LGPL-2.1", 1000, budget=40)
    chat("chat_1k_lgpl21", "1k", [{"role": "user", "content":
        "Read this text and answer the question.\n\n" + t + "\n\nQuestion: What is this text about?"}], s)
    t, s = cut(tok, "CC0-1.0", 1000, budget=60)
    chat("chat_1k_cc0", "1k", [
        {"role": "system", "content": "You are a helpful legal assistant."},
        {"role": "user", "content": t + "\n\nSummarize the text above in one sentence."}], s)
    t, s = cut(tok, "Artistic", 1000, budget=80)
    chat("chat_1k_artistic", "1k", [
        {"role": "user", "content": t + "\n\nWhat is this licence called?"},
        {"role": "assistant", "content": "It is the Artistic License."},
        {"role": "user", "content": "Who is the Copyright Holder, according to it?"}], s)

    t, s = cut(tok, "GPL-3", 4000)
    raw("raw_4k_gpl3", "4k", t, s)
    t, s = cut(tok, "GFDL-1.3", 4000)
    raw("raw_4k_gfdl13", "4k", t, s)
    start = paragraph_after(tok, "GPL-3", 4000)
    t, s = cut(tok, "GPL-3", 4000, start_paragraph=start, budget=60)
    chat("chat_4k_gpl3_tail", "4k", [{"role": "user", "content":
        t + "\n\nQuestion: According to the text, what happens if you violate the licence?"}], s)
    t, s = cut(tok, "LGPL-2", 4000, budget=60)
    chat("chat_4k_lgpl2", "4k", [
        {"role": "system", "content": "You answer questions about software licences."},
        {"role": "user", "content": t + "\n\nSummarize the main points of the text above."}], s)
    assert len(P) == 16
    return P


def chat_ids(tok, messages, **kw):
    out = tok.apply_chat_template(messages, tokenize=True, **kw)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def original_tokenizer(tok):
    """transformers' GGUF tokenizer with SmolLM2's own pre-tokenizer put back: Digits(individual)
    then ByteLevel(use_regex) -- the same split as llama.cpp's `smollm` pre type."""
    from tokenizers import Tokenizer, pre_tokenizers
    t = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return t


# ---------------------------------------------------------------------------------------------
# Tokenization corpus


def corpus():
    py = ('import os\n\n\nclass Cache:\n    """A tiny LRU cache."""\n\n    def __init__(self, n: int = 128):\n'
          '        self.n = n\n        self._d = {}  # key -> value\n\n    def get(self, k, default=None):\n'
          '        if k in self._d:\n            return self._d[k]\n        return default\n\n\n'
          'if __name__ == "__main__":\n\tprint(f"{Cache(4).n:>8}", end="\\n")\n')
    cpp = ('#include <vector>\n#include "model/gguf.h"\n\ntemplate <typename T>\nstd::vector<T> Take(const std::vector<T>& v, size_t n) {\n'
           '  if (n > v.size()) n = v.size();  // clamp\n  return {v.begin(), v.begin() + n};\n}\n\n'
           'int main(int argc, char** argv) {\n  auto* p = &argv[0];\n  std::cout << Take<int>({1, 2, 3}, 2).size() << "\\n";\n'
           '  return p->empty() ? 1 : 0;\n}\n')
    return [
        ("empty", ""),
        ("space", " "),
        ("spaces3", "   "),
        ("tab", "\t"),
        ("newline", "\n"),
        ("crlf", "a\r\nb\r\n"),
        ("trailing_spaces", "hello   "),
        ("leading_spaces", "   hello"),
        ("whitespace_mix", "a \t b\n\n\nc  \n  d\t\t\te    "),
        ("newlines_run", "\n\n\n\n\nend"),
        ("indent_runs", "x\n    y\n        z\n\t\tw"),
        ("python", py),
        ("cpp", cpp),
        ("accents", "Café naïve résumé façade Ångström Øresund"),
        ("combining", "e\u0301 a\u0308 n\u0303 (decomposed) vs é ä ñ"),
        ("cjk", "你好，世界！这是一个测试。"),
        ("japanese", "日本語のテキストとカタカナ ー"),
        ("korean", "한국어 텍스트입니다"),
        ("emoji", "Emoji: 😀👍🏽🇺🇸 and ❤️ 👨\u200d👩\u200d👧\u200d👦"),
        ("arabic_rtl", "مرحبا بالعالم"),
        ("hebrew_rtl", "שלום עולם"),
        ("bidi_mixed", "The word שלום means peace; مرحبا means hello."),
        ("cyrillic_greek", "Россия и Україна; αβγ ΔΣΩ"),
        ("math_symbols", "∑∫√∞≠≤ x² + y³ = ½"),
        ("zero_width_nbsp_bom", "\ufeffzero\u200bwidth and\u00a0nbsp"),
        ("digits", "12345"),
        ("pi", "3.14159"),
        ("date", "2026-12-02"),
        ("thousands", "1,000,000 and 0x7FFF and v1.2.3"),
        ("space_digits", " 42"),
        ("two_spaces_digits", "x  12"),
        ("numbered_list", "Steps:\n    1. item\n    2. other\n  10. last"),
        ("newline_space_digits", "\n\n 123"),
        ("phone", "call 555-0123 now"),
        ("non_ascii_digits", "٣٤٥ ① ²"),
        ("contractions", "I'm sure they'll say it's fine, don't you think? We've seen it. You'd, she's."),
        ("contractions_upper", "I'M SURE IT'S FINE, DON'T WORRY"),
        ("special_im_start", "<|im_start|>"),
        ("special_im_end", "<|im_end|>"),
        ("special_endoftext", "<|endoftext|>"),
        ("special_turn", "<|im_start|>user\nHi there<|im_end|>\n"),
        ("special_glued", "x<|endoftext|>y<|im_start|><|im_end|>"),
        ("special_spaced", " <|im_start|> assistant "),
        ("special_other", "<repo_name>echokv<file_sep>main.cc<empty_output>"),
        ("partial_im_sta", "<|im_sta"),
        ("partial_im_end", "<|im_end"),
        ("partial_endoftext", "<|endoftext"),
        ("partial_pipe", "<|im_start|"),
        ("special_wrong_case", "<|IM_START|>"),
        ("repeated_chars", "a" * 40 + " " + "=" * 30),
        ("url_email", "See https://example.org/a/b?c=1&d=2#frag or mail me@example.org."),
        ("json", '{"key": [1, 2.5, null, true], "nested": {"s": "t\\u00e9"}}'),
        ("markdown_table", "| name | value |\n|------|------:|\n| a    |     1 |\n"),
    ]


def tokenization(tok, orig):
    cases = []
    for name, text in corpus():
        ids_t = list(tok(text, add_special_tokens=True)["input_ids"])
        ids_f = list(tok(text, add_special_tokens=False)["input_ids"])
        ids_o = orig.encode(text, add_special_tokens=False).ids
        dec = tok.decode(ids_f)
        cases.append({
            "name": name, "text": text,
            "ids_add_special_true": ids_t, "ids_add_special_false": ids_f,
            "tokens": tok.convert_ids_to_tokens(ids_f),
            "decode": dec,
            "decode_skip_special": tok.decode(ids_f, skip_special_tokens=True),
            "roundtrip_equal": dec == text,
            "ids_original_pretokenizer": ids_o,
            "original_agrees": ids_o == ids_f,
        })
    singles = []
    for token in ["Ġthe", "Ġ", "ĠĠĠĠ", "Ċ", "ĊĊ", "Hello", "ĠHello", "Ã", "©", "<|im_start|>", "<|im_end|>",
                  "<|endoftext|>", "<repo_name>"]:
        i = tok.convert_tokens_to_ids(token)
        singles.append({"token": token, "id": i, "decode": tok.decode([i]),
                        "decode_skip_special": tok.decode([i], skip_special_tokens=True)})
    last = VOCAB - 1
    singles.append({"token": tok.convert_ids_to_tokens(last), "id": last, "decode": tok.decode([last]),
                    "decode_skip_special": tok.decode([last], skip_special_tokens=True)})
    byte_ids = byte_token_ids(tok)
    partial = []
    for text in ["é", "😀", "你"]:
        ids = [byte_ids[x] for x in text.encode("utf-8")]
        partial.append({"text": text, "byte_ids": ids,
                        "decode_each": [tok.decode([i]) for i in ids],
                        "decode_all": tok.decode(ids),
                        "encode": list(tok(text, add_special_tokens=False)["input_ids"])})
    return {"cases": cases, "single_id_decodes": singles, "utf8_byte_tokens": partial}


def byte_token_ids(tok):
    """byte value -> id of the single-byte token (GPT-2's byte-to-unicode spelling)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    b2u = bytes_to_unicode()
    return {b: tok.convert_tokens_to_ids(u) for b, u in b2u.items()}


# ---------------------------------------------------------------------------------------------
# Chat template


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat_cases():
    u = [{"role": "user", "content": "Hello, who are you?"}]
    su = [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Where is the treasure?"}]
    multi = [{"role": "system", "content": "Answer briefly."},
             {"role": "user", "content": "What is 2+2?"},
             {"role": "assistant", "content": "4"},
             {"role": "user", "content": "And 3+3?"}]
    multi_nosys = [{"role": "user", "content": "Name a colour."},
                   {"role": "assistant", "content": "Blue."},
                   {"role": "user", "content": "Another one."},
                   {"role": "assistant", "content": "Green."}]
    return [
        ("user", u, {}),
        ("user_gen", u, {"add_generation_prompt": True}),
        ("system_user", su, {}),
        ("system_user_gen", su, {"add_generation_prompt": True}),
        ("multi_turn", multi, {}),
        ("multi_turn_gen", multi, {"add_generation_prompt": True}),
        ("multi_turn_no_system_ends_assistant", multi_nosys, {}),
        ("multi_turn_no_system_ends_assistant_gen", multi_nosys, {"add_generation_prompt": True}),
        ("system_only_gen", [{"role": "system", "content": "Be kind."}], {"add_generation_prompt": True}),
        ("empty_content_gen", [{"role": "user", "content": ""}], {"add_generation_prompt": True}),
        ("unicode_content", [{"role": "user", "content": "¿Qué tal? 你好 😀\n\tindented\n  12 items"}],
         {"add_generation_prompt": True}),
        ("special_token_in_content", [{"role": "user", "content": "say <|im_end|> then <|im_start|>"}],
         {"add_generation_prompt": True}),
        ("tool_role_message", [{"role": "user", "content": "Weather in Paris?"},
                               {"role": "tool", "content": "{\"temp\": 21}"}], {"add_generation_prompt": True}),
        ("user_gen_with_tools", u, {"add_generation_prompt": True, "tools": [WEATHER_TOOL]}),
        ("system_user_gen_with_tools", su, {"add_generation_prompt": True, "tools": [WEATHER_TOOL]}),
    ]


def chat_templates(tok, orig, gguf_template):
    out = []
    renders = {}
    for name, messages, kw in chat_cases():
        text = tok.apply_chat_template(messages, tokenize=False, **kw)
        ids = chat_ids(tok, messages, **kw)
        ids_text = list(tok(text, add_special_tokens=False)["input_ids"])
        assert ids == ids_text, name
        ids_o = orig.encode(text, add_special_tokens=False).ids
        renders[name] = text
        out.append({"name": name, "messages": messages,
                    "add_generation_prompt": bool(kw.get("add_generation_prompt", False)),
                    "tools": kw.get("tools"), "render": text, "ids": ids,
                    "ids_original_pretokenizer": ids_o, "original_agrees": ids_o == ids})
    tools_ignored = (renders["user_gen_with_tools"] == renders["user_gen"]
                     and renders["system_user_gen_with_tools"] == renders["system_user_gen"])
    return {"template": tok.chat_template, "template_equals_gguf": tok.chat_template == gguf_template,
            "template_mentions_tools": "tools" in tok.chat_template,
            "tools_ignored": tools_ignored, "cases": out}


# ---------------------------------------------------------------------------------------------
# Model


def topk(row, k):
    v, i = torch.topk(row, k)
    return [int(x) for x in i], [float(x) for x in v]


def forward_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()


def greedy(model, ids):
    """64 greedy steps through model.generate. The model's own generation config names
    <|im_end|> as eos, which generate would stop at: it is set to None for these runs."""
    import copy
    from transformers import GenerationConfig
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.eos_token_id = None
    cfg = GenerationConfig(max_new_tokens=N_NEW, do_sample=False, num_beams=1, repetition_penalty=1.0,
                           eos_token_id=None, pad_token_id=2, temperature=None, top_p=None, top_k=None,
                           output_logits=True, return_dict_in_generate=True)
    try:
        with torch.no_grad():
            # An explicit mask: without one, generate masks every prompt token equal to
            # pad_token_id (2, <|im_end|>, which every chat prompt holds).
            x = torch.tensor([ids])
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=cfg)
    finally:
        model.generation_config = saved
    new = [int(x) for x in out.sequences[0, len(ids):]]
    assert len(new) == N_NEW, len(new)
    steps = []
    for s, lg in enumerate(out.logits):
        v, i = torch.topk(lg[0].float(), 2)
        assert int(i[0]) == new[s] or float(v[0]) == float(v[1]), (s, int(i[0]), new[s])
        steps.append({"top2_ids": [int(i[0]), int(i[1])], "top2_logits": [float(v[0]), float(v[1])],
                      "margin": float(v[0] - v[1])})
    return new, steps, out.logits[0][0].float()


def qk_layout_check(model, gguf_path, cfg):
    """Compare transformers' q_proj/k_proj with the GGUF's attn_q/attn_k, dequantized by gguf."""
    import gguf
    r = gguf.GGUFReader(gguf_path)
    t = {x.name: x for x in r.tensors}
    res = {}
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    for name, hf, heads in (("blk.0.attn_q.weight", model.model.layers[0].self_attn.q_proj.weight, nh),
                            ("blk.0.attn_k.weight", model.model.layers[0].self_attn.k_proj.weight, nkv),
                            ("blk.0.attn_v.weight", model.model.layers[0].self_attn.v_proj.weight, nkv)):
        g = gguf.quants.dequantize(t[name].data, t[name].tensor_type)
        g = np.asarray(g, dtype=np.float32).reshape(hf.shape)
        h = hf.detach().numpy()
        hd = g.shape[0] // heads
        # HF row h*hd + j*(hd/2) + i  <-  GGUF row h*hd + 2*i + j
        perm = g.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(g.shape)
        res[name] = {"max_abs_diff_as_stored": float(np.abs(g - h).max()),
                     "max_abs_diff_after_unpermute": float(np.abs(perm - h).max())}
    emb = gguf.quants.dequantize(t["token_embd.weight"].data, t["token_embd.weight"].tensor_type)
    emb = np.asarray(emb, dtype=np.float32).reshape(model.model.embed_tokens.weight.shape)
    res["token_embd.weight"] = {"max_abs_diff": float(np.abs(emb - model.model.embed_tokens.weight.detach().numpy()).max())}
    res["has_output_weight"] = "output.weight" in t
    res["lm_head_is_embed_tokens"] = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return res


# ---------------------------------------------------------------------------------------------


def versions():
    return {n: md.version(n) for n in ("torch", "transformers", "tokenizers", "gguf", "numpy", "jinja2")}


def dump(path, obj):
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1, ensure_ascii=False)
        fh.write("\n")


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(os.environ.get("ECHOKV_MODELS", "/work/models"),
                                                   "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "model", "testdata", "smollm2"))
    ap.add_argument("--export-dir", default="/work/models/smollm2-hf-export")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a loaded 2-core machine, 2 threads spin at every barrier)")
    ap.add_argument("--skip-greedy", action="store_true", help="for quick trials only")
    ap.add_argument("--trial", action="store_true",
                    help="for quick trials only: the 6 short prompts (the ~4 K early-logit rows stay empty)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import gguf
    gdir, gfile = os.path.split(os.path.abspath(args.gguf))
    with open(args.gguf, "rb") as fh:
        gguf_sha = hashlib.sha256(fh.read()).hexdigest()
    reader = gguf.GGUFReader(args.gguf)
    gguf_template = reader.fields["tokenizer.chat_template"].contents()
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gfile)
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gfile, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    load_s = time.time() - t0
    orig = original_tokenizer(tok)
    common = {"generator": "tools/oracle/make_model_goldens.py", "versions": versions(),
              "gguf_file": gfile, "gguf_sha256": gguf_sha,
              "load": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32, "
                      "attn_implementation='sdpa'); AutoTokenizer.from_pretrained(dir, gguf_file=...)",
              "threads": args.threads}

    # Prompts and their ids.
    prompts = build_prompts(tok)
    if args.trial:
        prompts = prompts[:6]
    for i, p in enumerate(prompts):
        p["index"] = i
        if p["kind"] == "chat":
            p["text"] = tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
            p["ids"] = chat_ids(tok, p["messages"], add_generation_prompt=True)
            assert p["ids"] == list(tok(p["text"], add_special_tokens=False)["input_ids"])
            p["render"] = "apply_chat_template(messages, add_generation_prompt=True)"
        else:
            p["ids"] = list(tok(p["text"], add_special_tokens=True)["input_ids"])
            assert p["ids"] == list(tok(p["text"], add_special_tokens=False)["input_ids"])
        p["n_tokens"] = len(p["ids"])
        o = orig.encode(p["text"], add_special_tokens=False).ids
        p["original_agrees"] = o == p["ids"]
        assert p["original_agrees"], p["name"]
        print(f"prompt {i:2d} {p['name']:24s} {p['n_tokens']:5d} tokens  original_agrees={p['original_agrees']}")
    dump(os.path.join(args.out, "prompts.json"), dict(common, prompts=prompts))

    # Logits (full forward, no cache) and greedy continuations.
    last = np.zeros((len(prompts), VOCAB), dtype=np.float32)
    early_rows, early = [], []
    rows, greedy_out = [], []
    first_step_diff = 0.0
    timings = []
    for i, p in enumerate(prompts):
        t0 = time.time()
        lg = forward_logits(model, p["ids"])
        fwd_s = time.time() - t0
        last[i] = lg[-1].numpy()
        ids5, vals5 = topk(lg[-1], 5)
        rows.append({"row": i, "prompt": i, "position": len(p["ids"]) - 1, "top5_ids": ids5,
                     "top5_logits": vals5, "max_abs": float(lg[-1].abs().max()),
                     "std": float(lg[-1].std())})
        if p["length"] == "4k":
            for pos in EARLY_POSITIONS:
                r = lg[pos]
                i5, v5 = topk(r, 5)
                early_rows.append({"row": len(early), "prompt": i, "position": pos, "top5_ids": i5,
                                   "top5_logits": v5, "max_abs": float(r.abs().max()), "std": float(r.std())})
                early.append(r.numpy())
        g_s = 0.0
        if not args.skip_greedy:
            t0 = time.time()
            new, steps, first = greedy(model, p["ids"])
            g_s = time.time() - t0
            first_step_diff = max(first_step_diff, float((first - lg[-1]).abs().max()))
            eos = [s for s, x in enumerate(new) if x == 2]
            greedy_out.append({"prompt": i, "name": p["name"], "new_ids": new,
                               "first_eos_step": eos[0] if eos else None,
                               "text": tok.decode(new), "steps": steps,
                               "min_margin": min(s["margin"] for s in steps),
                               "min_margin_step": int(np.argmin([s["margin"] for s in steps]))})
        timings.append({"prompt": i, "n_tokens": p["n_tokens"], "forward_s": round(fwd_s, 2),
                        "generate_s": round(g_s, 2)})
        print(f"logits {i:2d} top1={ids5[0]} ({vals5[0]:.4f})  fwd {fwd_s:.1f}s  greedy {g_s:.1f}s", flush=True)
    early = np.stack(early).astype(np.float32) if early else np.zeros((0, VOCAB), np.float32)
    with open(os.path.join(args.out, "logits_last.f32"), "wb") as fh:
        fh.write(last.astype("<f4").tobytes())
    with open(os.path.join(args.out, "logits_early.f32"), "wb") as fh:
        fh.write(early.astype("<f4").tobytes())

    # How far eager attention (plain softmax(QK^T)V) is from the sdpa oracle, on one ~1 K prompt
    # (eager at 4 K tokens takes minutes on 2 threads).
    p4 = next((p for p in prompts if p["length"] == "1k"), prompts[-1])
    model.set_attn_implementation("eager")
    lg_eager = forward_logits(model, p4["ids"])[-1]
    model.set_attn_implementation("sdpa")
    sdpa_diff = float((lg_eager - torch.from_numpy(last[p4["index"]])).abs().max())

    dump(os.path.join(args.out, "logits.json"), dict(
        common,
        last={"file": "logits_last.f32", "dtype": "float32 little-endian", "shape": list(last.shape),
              "layout": "row-major [prompt][vocab]; row r = prompts.json prompt r at its last position",
              "sha256": hashlib.sha256(last.astype("<f4").tobytes()).hexdigest(), "rows": rows},
        early={"file": "logits_early.f32", "dtype": "float32 little-endian", "shape": list(early.shape),
               "layout": "row-major [row][vocab]; rows in the table below (prompt, position)",
               "sha256": hashlib.sha256(early.astype("<f4").tobytes()).hexdigest(), "rows": early_rows},
        forward="model(input_ids, use_cache=False).logits, float32, no batching, sdpa attention "
                "(transformers' default; torch's CPU scaled_dot_product_attention)",
        eager_vs_sdpa_max_abs_diff={"prompt": p4["index"], "position": len(p4["ids"]) - 1,
                                    "max_abs_diff": sdpa_diff},
        generate_first_step_vs_forward_max_abs_diff=first_step_diff,
        ))
    print("load %.1f s; timings %s" % (load_s, json.dumps(timings)))
    if not args.skip_greedy:
        dump(os.path.join(args.out, "greedy.json"), dict(
            common, max_new_tokens=N_NEW,
            generate="model.generate(ids, GenerationConfig(max_new_tokens=64, do_sample=False, num_beams=1, "
                     "repetition_penalty=1.0, eos_token_id=None), output_logits=True): exactly 64 steps, not "
                     "stopped at <|im_end|> (first_eos_step says where it first appears); KV cache on",
            margin="top1 logit - top2 logit of the step's raw logits (output_logits)",
            continuations=greedy_out))

    # Tokenizer and chat template.
    dump(os.path.join(args.out, "tokenization.json"), dict(
        common, tokenizer="AutoTokenizer.from_pretrained(dir, gguf_file=...)",
        ids_original_pretokenizer="the same vocab and merges with pre_tokenizer "
                                  "Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, "
                                  "trim_offsets=True, use_regex=True)] (SmolLM2's tokenizer.json; llama.cpp's "
                                  "`smollm` pre type splits the same way)",
        **tokenization(tok, orig)))
    dump(os.path.join(args.out, "chat_template.json"), dict(common, **chat_templates(tok, orig, gguf_template)))

    # Facts.
    bt = json.loads(tok.backend_tokenizer.to_str())
    cfg = model.config
    fields = {k: reader.fields[k].contents() for k in reader.fields
              if k.startswith(("general.", "llama.", "tokenizer.ggml.")) and k not in
              ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")}
    tt = reader.fields["tokenizer.ggml.token_type"].contents()
    facts = dict(common,
                 gguf_metadata=fields,
                 gguf_token_types={str(k): tt.count(k) for k in sorted(set(tt))},
                 gguf_tensor_types=dict(sorted({t.tensor_type.name: sum(1 for x in reader.tensors if x.tensor_type == t.tensor_type)
                                                for t in reader.tensors}.items())),
                 config=cfg.to_dict(),
                 tokenizer={"class": type(tok).__name__, "normalizer": bt["normalizer"],
                            "pre_tokenizer": bt["pre_tokenizer"], "post_processor": bt["post_processor"],
                            "decoder": bt["decoder"],
                            "model": {k: v for k, v in bt["model"].items() if k not in ("vocab", "merges")},
                            "added_tokens": bt["added_tokens"],
                            "bos": [tok.bos_token, tok.bos_token_id], "eos": [tok.eos_token, tok.eos_token_id],
                            "pad": [tok.pad_token, tok.pad_token_id], "unk": [tok.unk_token, tok.unk_token_id],
                            "add_bos_token": getattr(tok, "add_bos_token", None),
                            "add_eos_token": getattr(tok, "add_eos_token", None),
                            "clean_up_tokenization_spaces": tok.clean_up_tokenization_spaces},
                 generation_config=model.generation_config.to_dict(),
                 qk_layout=qk_layout_check(model, args.gguf, cfg))
    dump(os.path.join(args.out, "facts.json"), facts)

    # The transformers export.
    export_dir = args.export_dir
    if os.path.isdir(export_dir):
        shutil.rmtree(export_dir)
    os.makedirs(export_dir)
    # A GGUF-loaded model refuses save_pretrained (its GgufHfQuantizer is not serializable): save a
    # plain LlamaForCausalLM holding the same float32 tensors instead.
    from transformers import LlamaConfig, LlamaForCausalLM
    d = cfg.to_dict()
    d.pop("quantization_config", None)
    d["architectures"] = ["LlamaForCausalLM"]
    plain_cfg = LlamaConfig.from_dict(d)
    plain = LlamaForCausalLM(plain_cfg).to(torch.float32)
    missing = plain.load_state_dict(model.state_dict(), strict=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(export_dir)
    tok.save_pretrained(export_dir)
    hf_dir = os.path.join(args.out, "hf_export")
    if os.path.isdir(hf_dir):
        shutil.rmtree(hf_dir)
    os.makedirs(hf_dir)
    committed = []
    for name in sorted(os.listdir(export_dir)):
        if name.endswith((".json", ".jinja", ".txt")) and os.path.getsize(os.path.join(export_dir, name)) < 8 << 20:
            shutil.copy(os.path.join(export_dir, name), os.path.join(hf_dir, name))
            committed.append(name)
    print("export:", sorted(os.listdir(export_dir)), "committed:", committed)

    # The export reloads to the same logits (a check of the export itself, not an oracle).
    re_m = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32, attn_implementation="sdpa")
    re_t = AutoTokenizer.from_pretrained(export_dir)
    p0 = prompts[3]
    assert chat_ids(re_t, p0["messages"], add_generation_prompt=True) == p0["ids"]
    re_lg = forward_logits(re_m, p0["ids"])[-1]
    diff = float((re_lg - torch.from_numpy(last[3])).abs().max())
    print("export reload: chat ids equal, logits max abs diff", diff)
    with open(os.path.join(args.out, "facts.json")) as fh:
        facts = json.load(fh)
    facts["hf_export"] = {"dir": export_dir, "files": sorted(os.listdir(export_dir)), "committed": committed,
                          "reload_logits_max_abs_diff_prompt3": diff}
    dump(os.path.join(args.out, "facts.json"), facts)
    total = 0
    for dirpath, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    print(f"total {total} bytes under {args.out}")


if __name__ == "__main__":
    sys.exit(main())
