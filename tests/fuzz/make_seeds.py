#!/usr/bin/python3
"""Writes the committed seed corpus of every fuzz target (tests/fuzz/corpus/<target>/).

Seeds are real files, cut down: the header of stories260K's safetensors and a small
well-formed checkpoint in the same format, the real config.json files, minimised
tokenizer.json files (the first vocabulary entries and the merges among them, with the
real normalizer / pre-tokenizer / decoder / added tokens of gpt2 and qwen2.5), GGUF files
of tiny models in the layout of SmolLM2's (its real metadata keys, chat template and first
tokens, read from the models folder), the six
real chat templates, real requests, and snapshots exported from a real server
(tests/fuzz/corpus/fuzz_snapshot/README.md says how). Every file starts with the target's
selector byte (see each target's header comment).

  /usr/bin/python3 tests/fuzz/make_seeds.py [--data ../shared] [--models .cache/models]   # Debian python3-protobuf
"""
import argparse
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= 200 * 1024, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, off, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def model_files(data):
    model = os.path.join(data, "models", "stories260K")
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    real_header = json.loads(raw[8:8 + n])
    # The real file cut after its header and 4 KB of data (the parser must refuse the
    # truncation by the offsets), and the bare header.
    write("fuzz_model_files", "stories260K_truncated.safetensors", b"\x00" + raw[:8 + n + 4096])
    # The real tensor names and dtypes with tiny shapes: a checkpoint that opens.
    small = []
    for i, name in enumerate(sorted(k for k in real_header if k != "__metadata__")[:6]):
        dtype = ["F32", "BF16", "F16"][i % 3]
        size = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
        shape = [2, 3] if i % 2 == 0 else [4]
        count = shape[0] * (shape[1] if len(shape) > 1 else 1)
        small.append((name, dtype, shape, bytes(range(i, i + count * size))))
    small.append(("scalar", "F32", [], b"\x00\x00\x80\x3f"))
    small.append(("empty", "F32", [0, 5], b""))
    write("fuzz_model_files", "small_checkpoint.safetensors",
          b"\x00" + safetensors(small, {"format": "pt", "source": "stories260K"}))
    shard = "model-00001-of-00001.safetensors"
    index = {"metadata": {"total_size": sum(len(t[3]) for t in small)},
             "weight_map": {t[0]: shard for t in small}}
    write("fuzz_model_files", "sharded_index", b"\x01" + json.dumps(index).encode() + b"\x00" + safetensors(small))
    # config.json (+ generation_config.json) of the real model, and variants of the
    # other architectures' fields (rope scaling, sliding window, GQA) from the docs.
    with open(os.path.join(model, "config.json"), "rb") as f:
        config = f.read()
    with open(os.path.join(model, "generation_config.json"), "rb") as f:
        generation = f.read()
    write("fuzz_model_files", "stories260K_config", b"\x02" + config + b"\x00" + generation)
    c = json.loads(config)
    llama3 = dict(c, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
                  eos_token_id=[1, 2], tie_word_embeddings=True)
    write("fuzz_model_files", "llama3_rope_config", b"\x02" + json.dumps(llama3).encode())
    qwen = dict(c, model_type="qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=2,
                rope_scaling={"type": "linear", "factor": 2.0}, torch_dtype="bfloat16")
    write("fuzz_model_files", "qwen2_sliding_config", b"\x02" + json.dumps(qwen).encode())
    mistral = dict(c, model_type="mistral", sliding_window=128, head_dim=c.get("hidden_size", 64) // c.get(
        "num_attention_heads", 8), rope_scaling=None)
    write("fuzz_model_files", "mistral_config", b"\x02" + json.dumps(mistral).encode() + b"\x00" +
          b'{"bos_token_id": 1, "eos_token_id": [2, 3]}')


def minimise_bpe(path, keep=700):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
    merges = []
    for m in j["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    j["model"]["vocab"] = vocab
    j["model"]["merges"] = merges
    for k, t in enumerate(j["added_tokens"][:6]):
        t["id"] = keep + k
    j["added_tokens"] = j["added_tokens"][:6]
    return json.dumps(j, ensure_ascii=False).encode()


def tokenizer(data):
    texts = [
        ("plain", "Once upon a time, there was a little girl named Lily. She loved to play outside."),
        ("unicode", "Ünïcödé café naïve — “quotes” 日本語のテキスト 🙂 e\u0301 \u00e9 ﬁ"),
        ("special", "<|im_start|>user\nHi<|im_end|>\n<s>[INST] x [/INST]</s><|endoftext|>"),
        ("code", "def f(x):\n\treturn x ** 2  # 123456789\r\n\n\n    'll 've 're"),
        ("spaces", "   leading  and   trailing   \n\n\n\t\t  "),
    ]
    for t in range(4):
        for name, text in texts:
            write("fuzz_tokenizer", "enc%d_%s" % (t, name), bytes([t | 0x18]) + text.encode())
    write("fuzz_tokenizer", "invalid_utf8", bytes([0x02]) + b"ok \xff\xfe \xc3 \xe2\x82 end")
    write("fuzz_tokenizer", "decode_ids", bytes([0x80]) + struct.pack("<8i", 1, 2, 3, 100, 200, 3000, 7, 0))
    write("fuzz_tokenizer", "decode_raw_ids", bytes([0xa3]) + struct.pack("<4i", -1, 2 ** 31 - 1, 151645, 50256))
    write("fuzz_tokenizer", "nfc", bytes([0x05]) + "e\u0301 A\u030a \u1e9b\u0323".encode())
    for name in ("gpt2", "qwen2.5"):
        tj = minimise_bpe(os.path.join(data, "tokenizers", name, "tokenizer.json"))
        cfg = {"add_bos_token": False, "eos_token": "<|endoftext|>" if name == "gpt2" else "<|im_end|>",
               "bos_token": None, "model_max_length": 1024}
        write("fuzz_tokenizer", "json_%s_min" % name, b"\x04" + tj + b"\x00" + json.dumps(cfg).encode())


def chat(data):
    d = os.path.join(data, "chat_templates")
    names = ["NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
             "meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
             "microsoft-Phi-3.5-mini-instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}]
    requests = {
        "simple": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        "multi": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                               {"role": "user", "content": "Tell me a story."}], "add_generation_prompt": False},
        "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"},
                               {"role": "assistant", "content": None, "tool_calls": [
                                   {"id": "call_1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                               {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                                "content": "sunny"}], "tools": tools},
        "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                           {"type": "text", "text": "part two"}]}]},
    }
    for i, name in enumerate(names):
        with open(os.path.join(d, name), "rb") as f:
            source = f.read()
        req = requests["tools" if i in (0, 1, 2) else "multi"]
        write("fuzz_chat_template", "source_%d" % i, b"\x00" + source + b"\x00" + json.dumps(req).encode())
        for rname, r in requests.items():
            write("fuzz_chat_template", "real%d_%s" % (i, rname), bytes([1 + 4 * i]) + json.dumps(r).encode())
        write("fuzz_chat_template", "structs%d" % i, bytes([2 + 4 * i]) + json.dumps(requests["tools"]).encode())
    small = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{{ m['content'] | trim }}"
             "{% if not loop.last %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
             "{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"
             "{{ 'a,b' | replace(',', ';') | upper }}{{ [3,1,2] | sort | join('-') }}{{ {'k': 1} | tojson }}"
             "{% macro m(x) %}[{{ x }}]{% endmacro %}{{ m(1) }}{{ raise_exception('no') if false }}"
             "{{ strftime_now('%Y-%m-%d') }}{{ messages[0]['content'][1:3] }}{{ 7 // 2 }}{{ 2 ** 10 }}")
    write("fuzz_chat_template", "small_features", b"\x00" + small.encode() + b"\x00" +
          json.dumps(requests["simple"]).encode())
    with open(os.path.join(data, "tokenizers", "qwen2.5", "tokenizer_config.json"), "rb") as f:
        write("fuzz_chat_template", "qwen_tokenizer_config", b"\x03" + f.read())
    with open(os.path.join(d, names[0]), encoding="utf-8") as f:
        hermes = f.read()
    cfg = {"bos_token": {"content": "<s>"}, "eos_token": "</s>",
           "chat_template": [{"name": "default", "template": small}, {"name": "tool_use", "template": hermes}]}
    write("fuzz_chat_template", "named_templates_config", b"\x03" + json.dumps(cfg).encode() + b"\x00" +
          b'{"unk_token": "<unk>"}')


def edge():
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))
    from echokv.v1 import echokv_pb2 as pb  # generated by the normal build (build/python)
    desc = pb.DESCRIPTOR.services_by_name["EchoKV"]
    index = {m.input_type.name: i for i, m in enumerate(desc.methods)}

    def grpc(name, msg):
        write("fuzz_edge", "grpc_" + name, bytes([2 * index[type(msg).__name__]]) + msg.SerializeToString())

    sid = "0123456789abcdef0123456789abcdef"
    grpc("create_text", pb.CreateSessionRequest(
        input=pb.Input(text="Once upon a time", add_special_tokens=True),
        compression=pb.CompressionConfig(policy="echokv", budget=64, lookahead=8, workspace=96, window=8,
                                         bootstrap="snapkv", repair=True, memory="tiered"),
        ttl_seconds=600))
    grpc("create_chat", pb.CreateSessionRequest(input=pb.Input(chat=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content="Hi", name="u"),
                  pb.ChatMessage(role="assistant", content="", tool_calls=[
                      pb.ToolCall(id="c1", type="function", function_name="f", arguments_json='{"a": 1}')]),
                  pb.ChatMessage(role="tool", content="42", tool_call_id="c1")],
        tools_json='[{"type": "function", "function": {"name": "f"}}]', add_generation_prompt=True))))
    grpc("append_tokens", pb.AppendToSessionRequest(session_id=sid, input=pb.Input(tokens=pb.TokenIds(ids=[1, 2, 3]))))
    grpc("generate", pb.GenerateRequest(session_id=sid, max_tokens=16, sampling=pb.SamplingParams(
        temperature=0.7, top_p=0.9, top_k=40, seed=1, min_p=0.05, repetition_penalty=1.1)))
    grpc("fork", pb.ForkSessionRequest(session_id="replica-0." + sid, ttl_seconds=60))
    grpc("compress", pb.CompressRequest(input=pb.Input(text="abc"), compression=pb.CompressionConfig(
        policy="h2o", budget=4)))
    grpc("inspect", pb.InspectCacheRequest(session_id=sid, include_positions=True))
    grpc("import_header", pb.ImportSessionRequest(header=pb.ImportSessionRequest.Header(keep_id=True, ttl_seconds=5)))
    grpc("import_data", pb.ImportSessionRequest(data=b"EKVSNAP1" + bytes(56)))
    grpc("list", pb.ListSessionsRequest())
    write("fuzz_edge", "grpc_bad_utf8", bytes([2 * index["CreateSessionRequest"]]) + b"\x0a\x04\x0a\x02\xc3\x28")
    http_chat = {"model": "stories260K", "messages": [{"role": "system", "content": "s"},
                                                      {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "max_tokens": 16, "temperature": 0.5, "top_p": 0.9, "stream": True,
                 "stream_options": {"include_usage": True}, "stop": ["\n", "END"], "seed": 3, "logprobs": True,
                 "top_logprobs": 2, "session_id": "new", "frequency_penalty": 0.0, "n": 1, "user": "u"}
    write("fuzz_edge", "http_chat", b"\x01" + json.dumps(http_chat).encode())
    http_completion = {"model": "stories260K", "prompt": "Once upon", "max_tokens": 8, "echo": False,
                       "logprobs": 1, "stop": "x", "stream": False, "session_id": sid}
    write("fuzz_edge", "http_completion", b"\x03" + json.dumps(http_completion).encode())
    write("fuzz_edge", "http_completion_tokens", b"\x03" + json.dumps({"prompt": [1, 2, 3], "max_tokens": 1}).encode())
    write("fuzz_edge", "http_session", b"\x05" + sid.encode() + b"\x00" + sid.encode())
    write("fuzz_edge", "http_session_new", b"\x05NEW\x00")


# ---- GGUF (fuzz_gguf): a small writer and reader of the format, in plain Python ----

GGUF_TYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8,
              "arr": 9, "u64": 10, "i64": 11, "f64": 12}
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type id -> (block size, bytes per block)
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
               10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18),
               23: (256, 136), 30: (1, 2)}


def gguf_value(t, v):
    if t == 8:
        b = v.encode() if isinstance(v, str) else v
        return struct.pack("<Q", len(b)) + b
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def gguf_file(kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, ggml type, bytes)] -> GGUF v3 bytes."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gguf_value(8, key) + struct.pack("<I", t) + gguf_value(t, v)
    off, blobs = 0, []
    for name, dims, t, data in tensors:
        out += gguf_value(8, name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, off)
        blobs.append((off, data))
        off += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    data = bytearray(off)
    for o, b in blobs:
        data[o:o + len(b)] = b
    return out + bytes(data)


def gguf_read_metadata(path):
    """The metadata of a GGUF file as {key: (type, value)} (arrays as (element type, list))."""
    with open(path, "rb") as f:
        head = f.read(24)
        _, _, n_tensors, n_kv = struct.unpack("<4sIQQ", head)

        def read(n):
            return f.read(n)

        def value(t):
            if t == 8:
                (n,) = struct.unpack("<Q", read(8))
                return read(n).decode("utf-8", "surrogateescape")
            if t == 9:
                et, n = struct.unpack("<IQ", read(12))
                return (et, [value(et) for _ in range(n)])
            fmt = SCALAR_FMT[t]
            return struct.unpack(fmt, read(struct.calcsize(fmt)))[0]

        meta = {}
        for _ in range(n_kv):
            (n,) = struct.unpack("<Q", read(8))
            key = read(n).decode()
            (t,) = struct.unpack("<I", read(4))
            meta[key] = (t, value(t))
    return meta


def random_bytes(n, seed):
    x, out = seed * 2654435761 % 2**32 or 1, bytearray(n)
    for i in range(n):  # xorshift32: deterministic, no numpy
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out[i] = x & 0xFF
    return bytes(out)


def quant_tensor(t, rows, cols, seed):
    block, size = GGML_BLOCKS[t]
    data = bytearray(random_bytes(rows * cols // block * size, seed))
    if t in (0,):  # f32: small finite values
        data = b"".join(struct.pack("<f", ((b % 200) - 100) / 100.0) for b in data[::4])
    elif t in (1, 30):  # f16 / bf16: keep exponents small
        data = bytearray(data)
        for i in range(1, len(data), 2):
            data[i] = 0x3C if t == 1 else 0x3F
    return bytes(data)


def gguf(models_dir):
    """Seeds for fuzz_gguf: a tiny llama and qwen2 model in the layout of SmolLM2's file
    (its real metadata keys, chat template and the first tokens of its vocabulary, with
    the merges among them, when the real file is in the models folder), and every
    tensor type once."""
    real = os.path.join(models_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    tokens, merges, template, types = None, None, None, None
    if os.path.exists(real):
        meta = gguf_read_metadata(real)
        tokens = meta["tokenizer.ggml.tokens"][1][1][:400]
        kept = set(tokens)
        merges = [m for m in meta["tokenizer.ggml.merges"][1][1] if "".join(m.split(" ")) in kept
                  and all(p in kept for p in m.split(" "))][:300]
        template = meta["tokenizer.chat_template"][1]
        types = meta["tokenizer.ggml.token_type"][1][1][:400]
    else:
        print("make_seeds: %s is missing; the GGUF seeds use a synthetic vocabulary" % real, file=sys.stderr)
        alphabet = [chr(c) for c in range(0x21, 0x7F)] + ["\u0120", "\u010a"]
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + ["\u0120t", "he", "\u0120the"]
        merges = ["\u0120 t", "h e", "\u0120t he"]
        template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                    "{% endif %}")
        types = [3, 3, 3] + [1] * (len(tokens) - 3)
    vocab, hidden, ffn, heads, kv_heads, layers = len(tokens), 64, 128, 4, 2, 2
    head_dim = hidden // heads

    def model(arch, weight_type, bias, pre):
        kvs = [("general.architecture", 8, arch), ("general.name", 8, "seed"), ("general.alignment", 4, 32),
               (arch + ".block_count", 4, layers), (arch + ".context_length", 4, 256),
               (arch + ".embedding_length", 4, hidden), (arch + ".feed_forward_length", 4, ffn),
               (arch + ".attention.head_count", 4, heads), (arch + ".attention.head_count_kv", 4, kv_heads),
               (arch + ".rope.freq_base", 6, 100000.0), (arch + ".attention.layer_norm_rms_epsilon", 6, 1e-5),
               (arch + ".rope.dimension_count", 4, head_dim), ("tokenizer.ggml.model", 8, "gpt2"),
               ("tokenizer.ggml.pre", 8, pre), ("tokenizer.ggml.tokens", 9, (8, tokens)),
               ("tokenizer.ggml.token_type", 9, (5, types)), ("tokenizer.ggml.merges", 9, (8, merges)),
               ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
               ("tokenizer.ggml.padding_token_id", 4, 2), ("tokenizer.ggml.add_bos_token", 7, 0),
               ("tokenizer.chat_template", 8, template)]
        ts, seed = [], 1
        ts.append(("token_embd.weight", [hidden, vocab], 8, quant_tensor(8, vocab, hidden, seed)))
        for l in range(layers):
            for name, rows, cols in (("attn_q", heads * head_dim, hidden), ("attn_k", kv_heads * head_dim, hidden),
                                     ("attn_v", kv_heads * head_dim, hidden), ("attn_output", hidden, hidden),
                                     ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
                seed += 1
                ts.append(("blk.%d.%s.weight" % (l, name), [cols, rows], weight_type,
                           quant_tensor(weight_type, rows, cols, seed)))
            if bias:
                for name, rows in (("attn_q", heads * head_dim), ("attn_k", kv_heads * head_dim),
                                   ("attn_v", kv_heads * head_dim)):
                    ts.append(("blk.%d.%s.bias" % (l, name), [rows], 0, quant_tensor(0, 1, rows, seed)))
            for name in ("attn_norm", "ffn_norm"):
                ts.append(("blk.%d.%s.weight" % (l, name), [hidden], 0, quant_tensor(0, 1, hidden, seed)))
        ts.append(("output_norm.weight", [hidden], 0, quant_tensor(0, 1, hidden, 99)))
        return gguf_file(kvs, ts)

    write("fuzz_gguf", "llama_q4_1_smollm", model("llama", 3, False, "smollm"))
    write("fuzz_gguf", "qwen2_q8_0_bias", model("qwen2", 8, True, "qwen2"))
    write("fuzz_gguf", "llama_q4_k_llama_bpe", model("llama", 12, False, "llama-bpe"))
    every = [("t%d" % t, [GGML_BLOCKS[t][0] * 2, 2], t, quant_tensor(t, 2, GGML_BLOCKS[t][0] * 2, t))
             for t in sorted(GGML_BLOCKS)]
    write("fuzz_gguf", "every_type", gguf_file([("general.architecture", 8, "llama")], every, alignment=64))
    write("fuzz_gguf", "every_value_type", gguf_file(
        [("k.u8", 0, 255), ("k.i8", 1, -1), ("k.u16", 2, 65535), ("k.i16", 3, -2), ("k.u32", 4, 7),
         ("k.i32", 5, -7), ("k.f32", 6, 0.5), ("k.bool", 7, 1), ("k.str", 8, "s"), ("k.u64", 10, 2**63),
         ("k.i64", 11, -2**62), ("k.f64", 12, 0.25), ("k.arr", 9, (9, [(4, [1, 2]), (8, ["a"])]))], []))


def http_heads():
    """Request heads as real clients send them (curl, the OpenAI Python client, a
    Prometheus scrape) and the smuggling shapes the parse refuses; the selector byte is
    the read boundary."""
    heads = {
        "curl_completion": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: curl/7.88.1\r\n"
                           b"Accept: */*\r\nAuthorization: Bearer t0k\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 52\r\n\r\n{\"model\": \"echokv\", \"prompt\": \"Once\", \"max_tokens\": 4}",
        "openai_chat_stream": b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: gzip, deflate\r\n"
                              b"Connection: keep-alive\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n"
                              b"X-Stainless-Lang: python\r\nContent-Length: 2\r\n\r\n{}",
        "scrape": b"GET /metrics?x=1 HTTP/1.1\r\nHost: pod:9090\r\nUser-Agent: Prometheus/2.42.0\r\n"
                  b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n",
        "bare_lf": b"GET /health HTTP/1.0\nHost: a\n\n",
        "chunked": b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "cl_twice_equal": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        "cl_conflict": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 0\r\n\r\nhello",
        "cl_and_te": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "space_before_colon": b"POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n",
        "folded": b"GET / HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n",
    }
    for i, (name, head) in enumerate(sorted(heads.items())):
        write("fuzz_http_head", name, bytes([(17 * i + 5) % 256]) + head)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared"))
    p.add_argument("--models", default=os.environ.get("ECHOKV_MODELS", os.path.join(ROOT, ".cache", "models")))
    a = p.parse_args()
    for t in ("fuzz_model_files", "fuzz_gguf", "fuzz_tokenizer", "fuzz_chat_template", "fuzz_edge", "fuzz_http_head"):
        shutil.rmtree(os.path.join(HERE, "corpus", t), ignore_errors=True)
    model_files(a.data)
    gguf(a.models)
    tokenizer(a.data)
    chat(a.data)
    edge()
    http_heads()


if __name__ == "__main__":
    main()
