#!/usr/bin/python3
"""echokv-server on the real model (SmolLM2-135M-Instruct, Q4_1 GGUF) over both doors:
a multi-turn chat session started on the OpenAI HTTP door, continued over gRPC (a chat
append and a committed generation) and again over HTTP, must hold exactly the ids of
tokenizing the whole conversation rendered at once -- rendered here by Python's Jinja2
(Debian's python3-jinja2, an engine independent of ours) from the model's own
template (tests/model/testdata/smollm2/chat_template.json, equal to the GGUF's
tokenizer.chat_template), tokenized by echokv-tokenize on the GGUF (whose ids are
checked against the model's own tokenizer by model_smollm2_golden_test).

    /usr/bin/python3 tests/server/real_model_chat_test.py --server-binary build/bin/echokv-server \\
        --tokenize-binary build/bin/echokv-tokenize --client client/python

The model comes from $ECHOKV_MODELS or the checkout's .cache/models (scripts/setup.sh
fetches it); without it the script exits 77 (ctest: skipped, which CI counts as a
failure).
"""

import json
import os
import subprocess
import sys
import unittest

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HANG_GUARD_S = 300
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARGS = None
echokv = None


def model_path():
    folder = os.environ.get("ECHOKV_MODELS") or os.path.join(ROOT, ".cache", "models")
    path = os.path.join(folder, GGUF_NAME)
    return path if os.path.isfile(path) else None


def render(messages, add_generation_prompt):
    """The conversation as transformers' apply_chat_template renders it (Jinja2 with
    transformers' options: trim_blocks, lstrip_blocks)."""
    with open(os.path.join(ROOT, "tests", "model", "testdata", "smollm2", "chat_template.json")) as f:
        template = json.load(f)["template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def tokenize(text):
    out = subprocess.run([ARGS.tokenize_binary, "--tokenizer", ARGS.model, "--text", text, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ids"]


class Server(harness.Server):
    def __init__(self):
        super().__init__(ARGS.server_binary, ARGS.model, name="real", threads=None, hang_guard_s=HANG_GUARD_S)

    def post(self, path, body, headers=None):
        status, _, payload = harness.request(self.http_port, "POST", path, body, headers, timeout=HANG_GUARD_S)
        return status, json.loads(payload)


class RealModelChatTest(unittest.TestCase):
    def test_a_conversation_over_both_doors_holds_the_ids_of_the_whole_render(self):
        server = Server()
        try:
            client = echokv.Client("127.0.0.1:%d" % server.grpc_port)
            u1 = {"role": "user", "content": "What is the capital of France? Answer in one word."}
            status, first = server.post("/v1/chat/completions", {
                "model": "echokv", "messages": [u1], "max_tokens": 12, "temperature": 0, "session_id": "new"})
            self.assertEqual(status, 200, first)
            sid = first["session_id"]
            a1 = first["choices"][0]["message"]["content"]
            self.assertIn("Paris", a1)

            # gRPC: a chat append (the next user turn) and a committed reply.
            u2 = {"role": "user", "content": "And of Italy, in 2024?"}
            client.append(sid, chat=[u2])
            result = client.generate(sid, max_tokens=10, commit=True).collect()
            self.assertTrue(result.text)

            held = client.get(sid)
            a2 = held.messages[-1].content
            self.assertEqual([m.role for m in held.messages], ["user", "assistant", "user", "assistant"])
            u3 = {"role": "user", "content": "Thanks!  12 3"}  # spaces before digits: the model's own split
            conversation = [u1, {"role": "assistant", "content": a1}, u2, {"role": "assistant", "content": a2}, u3]
            status, third = server.post("/v1/chat/completions", {
                "model": "echokv", "messages": conversation, "max_tokens": 8, "temperature": 0},
                headers={"x-echokv-session": sid})
            self.assertEqual(status, 200, third)
            a3 = third["choices"][0]["message"]["content"]

            final = client.get(sid, include_tokens=True)
            messages = [{"role": m.role, "content": m.content} for m in final.messages]
            self.assertEqual(messages, conversation + [{"role": "assistant", "content": a3}])
            want = tokenize(render(messages, add_generation_prompt=False))
            got = list(final.tokens)
            self.assertEqual(len(got), final.tokens_seen)
            if got != want:
                at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                self.fail("the session's %d ids differ from the whole render's %d ids at index %d: %r vs %r"
                          % (len(got), len(want), at, got[at:at + 8], want[at:at + 8]))
            client.delete(sid)
            client.close()
        except BaseException:
            sys.stderr.write("---- echokv-server log (tail) ----\n" + server.tail() + "\n")
            raise
        finally:
            server.stop()


def main():
    global ARGS, echokv
    parser = harness.arguments(__doc__)
    parser.add_argument("--tokenize-binary", required=True)
    args, rest = parser.parse_known_args()
    args.model = model_path()
    if args.model is None:
        print("SKIPPED: %s is in no models folder ($ECHOKV_MODELS or .cache/models): run scripts/setup.sh"
              % GGUF_NAME)
        return harness.SKIP
    ARGS = args
    echokv = harness.import_client(args.client)
    return harness.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main())
