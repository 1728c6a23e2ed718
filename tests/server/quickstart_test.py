#!/usr/bin/python3
"""The README's and docs/API.md's HTTP quick-starts, run as written against the real
echokv-server started as the docs start it: no --model, so the default model
(SmolLM2-135M-Instruct GGUF from .cache/models, where scripts/setup.sh puts it), with
the docs' own curl command lines (only the port is replaced by the one the server bound).
Issue 25 item 12: the chat quick-starts failed on the default model of their day.

    /usr/bin/python3 tests/server/quickstart_test.py --server-binary build/bin/echokv-server

Label `model` (needs the default GGUF; in CI setup.sh fetched it, and its absence fails).
"""

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

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


class Server:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="echokv-quickstart-")
        ports = os.path.join(self.tmp.name, "ports")
        self.log_path = os.path.join(self.tmp.name, "server.log")
        self.log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k not in ("ECHOKV_MODEL", "ECHOKV_MODELS")}
        self.process = subprocess.Popen(
            [ARGS.server_binary, "--insecure", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
             "--http-port", "0", "--port-file", ports], stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("echokv-server exited:\n" + self.tail())
            if os.path.exists(ports):
                with open(ports) as f:
                    values = [int(x) for x in f.read().split()]
                if len(values) == 3:
                    self.http_port = values[2]
                    return
            time.sleep(0.05)
        raise AssertionError("echokv-server wrote no --port-file")

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def run(self, command):
        command = command.replace("localhost:8080", "127.0.0.1:%d" % self.http_port)
        out = subprocess.run(["bash", "-c", command + " -w '\\n%{http_code}'"], capture_output=True, text=True,
                             timeout=HANG_GUARD_S)
        body, _, code = out.stdout.rpartition("\n")
        return out.returncode, int(code or 0), body

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=HANG_GUARD_S)
        self.log.close()
        self.tmp.cleanup()


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
    parser = argparse.ArgumentParser()
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--client")   # given to every server test; unused here
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
