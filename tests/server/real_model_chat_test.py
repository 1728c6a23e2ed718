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

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import jinja2

SKIP = 77
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


class Server:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="echokv-real-")
        ports = os.path.join(self.tmp.name, "ports")
        self.log_path = os.path.join(self.tmp.name, "server.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [ARGS.server_binary, "--model", ARGS.model, "--insecure", "--host", "127.0.0.1", "--port", "0",
             "--metrics-port", "0", "--http-port", "0", "--port-file", ports],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("echokv-server exited:\n" + self.tail())
            if os.path.exists(ports):
                with open(ports) as f:
                    values = [int(x) for x in f.read().split()]
                if len(values) == 3:
                    self.grpc_port, _, self.http_port = values
                    return
            time.sleep(0.05)
        raise AssertionError("echokv-server wrote no --port-file")

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def post(self, path, body, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=HANG_GUARD_S)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        payload = json.loads(r.read())
        conn.close()
        return r.status, payload

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=HANG_GUARD_S)
        self.log.close()
        self.tmp.cleanup()
        if code != 0:
            raise AssertionError("echokv-server exited with %d after SIGTERM" % code)


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
    sys.path.insert(0, args.client)
    import echokv as module
    echokv = module
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
