#!/usr/bin/python3
"""Writes the committed seed corpus of every fuzz target (tests/fuzz/corpus/<target>/).

Seeds are real files, cut down: the header of stories260K's safetensors and a small
well-formed checkpoint in the same format, the real config.json files, minimised
tokenizer.json files (the first vocabulary entries and the merges among them, with the
real normalizer / pre-tokenizer / decoder / added tokens of gpt2 and qwen2.5), the six
real chat templates, real requests, and snapshots exported from a real server
(tests/fuzz/corpus/fuzz_snapshot/README.md says how). Every file starts with the target's
selector byte (see each target's header comment).

  /usr/bin/python3 tests/fuzz/make_seeds.py [--data ../shared]   # Debian python3-protobuf
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared"))
    a = p.parse_args()
    for t in ("fuzz_model_files", "fuzz_tokenizer", "fuzz_chat_template", "fuzz_edge"):
        shutil.rmtree(os.path.join(HERE, "corpus", t), ignore_errors=True)
    model_files(a.data)
    tokenizer(a.data)
    chat(a.data)
    edge()


if __name__ == "__main__":
    main()
