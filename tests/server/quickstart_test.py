#!/usr/bin/python3
"""The README's and docs/API.md's HTTP quick-starts, run as written against the real
echokv-server started as the docs start it: no --model, so the default model
(SmolLM2-135M-Instruct GGUF from .cache/models, where scripts/setup.sh puts it), with
the docs' own curl command lines (only the port is replaced by the one the server bound).
Issue 25 item 12: the chat quick-starts failed on the default model of their day.

    /usr/bin/python3 tests/server/quickstart_test.py --server-binary build/bin/echokv-server

Label `model` (needs the default GGUF; in CI setup.sh fetched it, and its absence fails).
"""

import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HANG_GUARD_S = 300
ARGS = None


def doc(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def readme_chat_curl():
    """README's inline `curl localhost:8080/v1/chat/completions -d '...'` (wrapped over lines)."""
    m = re.search(r"`(curl localhost:8080/v1/chat/completions -d '.*?')`", doc("README.md"), re.S)
    assert m, "README.md has no chat curl quick-start"
    return " ".join(m.group(1).split())


def api_http_block():
    """The sh block of docs/API.md that starts the server with --http-port 8080: its curl commands."""
    for block in re.findall(r"```sh\n(.*?)```", doc("docs/API.md"), re.S):
        if "--http-port 8080" in block:
            joined = re.sub(r"\n(?!curl|build/|#)", " ", block)   # continuation lines of one command
            joined = joined.replace("\\ ", " ")
            return [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]
    raise AssertionError("docs/API.md has no sh block with --http-port 8080")


class Server(harness.Server):
    def __init__(self):
        # As the docs start it: no --model (the default model), no --threads.
        env = {k: v for k, v in os.environ.items() if k not in ("ECHOKV_MODEL", "ECHOKV_MODELS")}
        super().__init__(ARGS.server_binary, None, name="quickstart", threads=None, env=env,
                         hang_guard_s=HANG_GUARD_S)

    def run(self, command):
        command = command.replace("localhost:8080", "127.0.0.1:%d" % self.http_port)
        out = subprocess.run(["bash", "-c", command + " -w '\\n%{http_code}'"], capture_output=True, text=True,
                             timeout=HANG_GUARD_S)
        body, _, code = out.stdout.rpartition("\n")
        return out.returncode, int(code or 0), body

    def stop(self):
        super().stop(check_exit=False)


class QuickStartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        path = os.path.join(ROOT, ".cache", "models", GGUF_NAME)
        if not os.path.isfile(path):
            raise AssertionError("%s is missing: scripts/setup.sh fetches it" % path)
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def check_chat(self, command):
        rc, code, body = self.server.run(command)
        self.assertEqual((rc, code), (0, 200), "%s\n-> %s\n%s" % (command, body, self.server.tail()))
        reply = json.loads(body)
        self.assertEqual(reply["object"], "chat.completion")
        self.assertTrue(reply["choices"][0]["message"]["content"].strip(), reply)

    def test_the_default_model_is_the_real_one(self):
        rc, code, body = self.server.run("curl -s localhost:8080/v1/models")
        self.assertEqual((rc, code), (0, 200), body)
        self.assertIn("SmolLM2", json.loads(body)["data"][0]["id"])

    def test_readme_chat_quickstart(self):
        self.check_chat(readme_chat_curl() + " -s")

    def test_api_md_quickstarts(self):
        commands = api_http_block()
        self.assertGreaterEqual(len(commands), 3, commands)
        for command in commands:
            with self.subTest(command=command):
                if "/v1/chat/completions" in command:
                    self.check_chat(command)
                    continue
                rc, code, body = self.server.run(command)
                self.assertEqual((rc, code), (0, 200), "%s\n-> %s" % (command, body))
                if '"stream": true' in command:
                    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
                    self.assertEqual(events[-1], "[DONE]", body)
                    text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
                    self.assertTrue(text.strip(), body)
                else:
                    json.loads(body)


def main():
    global ARGS
    # --client: given to every server test; unused here.
    ARGS, rest = harness.arguments(__doc__, client_required=False).parse_known_args()
    return harness.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main())
