"""What the Python tests under tests/server share (standard library only): starting the
real echokv-server on loopback with --port-file and reading its ports, its log, a
SIGTERM stop that checks the exit code, HTTP requests and SSE streams on the OpenAI
door, /metrics, polling with a hang guard, the model folder with a chat template, and
the command line, skip and exit-code conventions of echokv_server_py_test
(tests/server/CMakeLists.txt), and the re-execution in a private mount namespace of
the tests that mount file systems.

A test imports it as `import harness` after putting its own folder first on sys.path
(ctest runs the scripts by absolute path from the build folder, so the folder of the
script is what finds this file, whatever the working directory):

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness  # noqa: E402

No wait here depends on timing: each polls for a state with a generous ceiling
(HANG_GUARD_S) that only guards against hangs; reaching it is a failure.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

SKIP = 77            # ctest's SKIP_RETURN_CODE of echokv_server_py_test
HANG_GUARD_S = 120   # ceiling of every wait; reaching it is a failure, never a pass
HOST = "127.0.0.1"
START_MARK = "==== start ====\n"

# stories260K ships no chat template, and a model without one refuses chat input. The
# tests serve it from a folder of links to its files plus a chat_template.jinja (the
# loader's second source, model/chat_template.h): ChatML, plain text for this tokenizer.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def model_with_chat_template(model, parent):
    """A folder named like `model` inside `parent` holding links to its files and
    CHAT_TEMPLATE (so the served model id stays the folder's name, "stories260K")."""
    out = os.path.join(parent, os.path.basename(model))
    os.makedirs(out)
    for name in os.listdir(model):
        os.symlink(os.path.join(model, name), os.path.join(out, name))
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return out


class Server:
    """One echokv-server on 127.0.0.1 with ports chosen by the kernel and read from
    --port-file (three lines: gRPC, metrics, HTTP).

    The command line: `binary`, --host 127.0.0.1 --port 0 --port-file, then --model
    (unless None: the server's default model), --insecure (unless insecure=False),
    --metrics-port 0 (-1 with metrics=False), --http-port 0 (none with http=False),
    --threads (unless None), then `extra`. Its files (the port file, the log) are in
    `work`, a temporary folder removed by stop() when none is given; `log_path` names
    a log shared by several servers (it accumulates; each start marks its beginning).
    start() is called by the constructor unless start=False; it returns once the port
    file is there (polling every poll_s) and fails if the server exits first."""

    def __init__(self, binary, model=None, extra=(), insecure=True, metrics=True, http=True, threads=1,
                 work=None, name="server", log_path=None, env=None, poll_s=0.05, hang_guard_s=HANG_GUARD_S,
                 start=True):
        self._tmp = None
        if work is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="echokv-%s-" % name)
            work = self._tmp.name
        self.work = work
        self.port_file = os.path.join(work, name + ".ports")
        self.log_path = log_path or os.path.join(work, name + ".log")
        self.args = [binary, "--host", HOST, "--port", "0", "--port-file", self.port_file]
        if model is not None:
            self.args += ["--model", model]
        if insecure:
            self.args.append("--insecure")
        self.args += ["--metrics-port", "0" if metrics else "-1"]
        if http:
            self.args += ["--http-port", "0"]
        if threads is not None:
            self.args += ["--threads", str(threads)]
        self.args += list(extra)
        self.env = env
        self.poll_s = poll_s
        self.hang_guard_s = hang_guard_s
        self.process = None
        self.log_start = 0
        self.killed = False
        if start:
            self.start()

    # ---- process ----

    def start(self):
        """(Re)starts the process with the same command line and waits for its ports."""
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        with open(self.log_path, "a") as log:
            log.write(START_MARK)
            log.flush()
            self.log_start = log.tell()
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.killed = False
        deadline = time.monotonic() + self.hang_guard_s
        while True:
            if self.process.poll() is not None:
                raise AssertionError("echokv-server exited with %d at start:\n%s"
                                     % (self.process.returncode, self.log()[-4000:]))
            if os.path.exists(self.port_file):  # written whole (renamed into place)
                with open(self.port_file) as f:
                    ports = [int(x) for x in f.read().split()]
                if len(ports) == 3:
                    self.grpc_port, self.metrics_port, self.http_port = ports
                    self.address = "%s:%d" % (HOST, self.grpc_port)
                    return self
            if time.monotonic() > deadline:
                raise AssertionError("echokv-server wrote no --port-file")
            time.sleep(self.poll_s)

    def running(self):
        return self.process is not None and self.process.poll() is None

    def stop(self, check_exit=True):
        """SIGTERM (when still running) and wait: fails if the server ignores it for the
        hang guard (then it is killed), and, with check_exit, if its exit code is not 0
        (unless kill() ended it). Removes the temporary work folder either way."""
        try:
            if self.process is None:
                return None
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=self.hang_guard_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                    raise AssertionError("echokv-server ignored SIGTERM:\n" + self.log()[-4000:])
            code = self.process.returncode
            if check_exit and not self.killed and code != 0:
                raise AssertionError("echokv-server exited with %d after SIGTERM:\n%s" % (code, self.log()[-4000:]))
            return code
        finally:
            self.cleanup()

    def kill(self, wait=True):
        """SIGKILL (a crash); with wait, reaps the process."""
        self.killed = True
        if self.process.poll() is None:  # never a signal to a reaped (reusable) pid
            self.process.kill()
        if wait:
            self.process.wait()

    def cleanup(self):
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def rss(self):
        """The server's VmRSS in bytes."""
        with open("/proc/%d/status" % self.process.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    # ---- log ----

    def log(self):
        """What this start of the process has logged."""
        with open(self.log_path) as f:
            f.seek(self.log_start)
            return f.read()

    def tail(self, n=4000):
        """The last `n` characters of the whole log."""
        with open(self.log_path) as f:
            return f.read()[-n:]

    # ---- metrics port ----

    def metrics(self):
        with urllib.request.urlopen("http://%s:%d/metrics" % (HOST, self.metrics_port), timeout=HANG_GUARD_S) as r:
            return r.read().decode()

    def metric(self, name, labels=None):
        """The sum of the series `name` (labelled or not) whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            if labels and not all('%s="%s"' % kv in head for kv in labels.items()):
                continue
            if head == name or head.startswith(name + "{"):
                total += float(value)
        return total


# ---- the HTTP door (standard library only) ----

def request(port, method, path, body=None, headers=None, raw=None, timeout=HANG_GUARD_S, source=None):
    """One request on a new connection (from `source` when given): (status, headers
    {lower-case name: value}, bytes). `body` is sent as JSON, `raw` as is."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        payload = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
    finally:
        conn.close()


def post_json(port, path, body, headers=None):
    """A POST whose answer is JSON: (status, headers, parsed body)."""
    status, heads, payload = request(port, "POST", path, body, headers)
    return status, heads, json.loads(payload)


def sse_events(text):
    """The data of the events of an SSE body but the final [DONE], after checking the
    framing: every event is one `data:` line followed by a blank line, and the stream
    ends right after `data: [DONE]`."""
    if not text.endswith("\n\n"):
        raise AssertionError("the stream does not end with a blank line: %r" % text[-80:])
    events = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        if len(lines) != 1 or not lines[0].startswith("data: "):
            raise AssertionError("not one data line: %r" % block)
        events.append(lines[0][len("data: "):])
    if events[-1] != "[DONE]" or "[DONE]" in events[:-1]:
        raise AssertionError("[DONE] is not the last event alone: %r" % events[-3:])
    return events[:-1]


def sse(port, path, body, headers=None):
    """A streamed request that must answer 200 text/event-stream: (headers, [event data
    strings but [DONE]]), the framing checked by sse_events."""
    status, heads, payload = request(port, "POST", path, body, headers)
    if status != 200:
        raise AssertionError("stream answered %d: %r" % (status, payload[:300]))
    if heads.get("content-type") != "text/event-stream":
        raise AssertionError("content-type %r" % heads.get("content-type"))
    return heads, sse_events(payload.decode("utf-8"))


def stalled_stream(port, path, body, headers=None):
    """Starts a streamed request on a raw socket with a tiny receive buffer and reads
    only the response head and the first event: (socket, bytes read). The caller stops
    reading (the server holds the stream back) or reads on slowly, and closes it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(HANG_GUARD_S)
    s.connect((HOST, port))
    data = json.dumps(body).encode()
    head = b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n" % path.encode()
    for name, value in (headers or {}).items():
        head += b"%s: %s\r\n" % (name.encode(), value.encode())
    s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    got = b""
    while b"data: " not in got:
        more = s.recv(1024)
        if not more:
            raise AssertionError("the stream closed early: %r" % got)
        got += more
    if not got.startswith(b"HTTP/1.1 200"):
        raise AssertionError("stream refused: %r" % got[:300])
    return s, got


def wait_until(predicate, what, timeout=HANG_GUARD_S, poll_s=0.05):
    """The first truthy value of predicate(), polled; fails after the hang guard."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError("gave up waiting (hang guard) for: " + what)


class LogOnFailure:
    """A unittest.TestCase mixin: when a test fails, the tail of the log of the server
    `failure_server()` returns (None: nothing) goes to stderr."""

    def failure_server(self):
        return None

    def run(self, result=None):
        failures = len(result.failures) + len(result.errors) if result else 0
        outcome = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > failures:
            server = self.failure_server()
            if server is not None:
                sys.stderr.write("---- echokv-server log (tail) ----\n" + server.tail() + "\n")
        return outcome


# ---- the command line of echokv_server_py_test ----

def arguments(doc, client_required=True):
    """The parser of the arguments every registration passes (--server-binary, --client);
    a test adds its own, then calls parse_known_args() (the rest goes to unittest)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--client", required=client_required, help="folder holding the echokv package")
    return parser


def stories260k():
    """$ECHOKV_TEST_DATA/models/stories260K; exits 77 (ctest: skipped, which CI counts as
    a failure) when $ECHOKV_TEST_DATA is unset and 1 when the model is not there."""
    data = os.environ.get("ECHOKV_TEST_DATA")
    if not data:
        print("SKIPPED: $ECHOKV_TEST_DATA is unset (needs models/stories260K)")
        sys.exit(SKIP)
    model = os.path.join(data, "models", "stories260K")
    if not os.path.isfile(os.path.join(model, "config.json")):
        print("no config.json in " + model)
        sys.exit(1)
    return model


def reexec_in_private_mount_namespace(env_name, skipped):
    """Mounts (a tmpfs, a read-only bind) need a mount namespace of our own, so that
    nothing leaks into the host's mounts even if this process dies: re-executes this
    script under `unshare --mount` when allowed, with $`env_name` = "1"; where it is not,
    sets it to "0" and says that `skipped` is skipped (the test then skips that part,
    which ctest reports as skipped and CI as a failure). Returns only in the latter case
    or once re-executed ($`env_name` already set)."""
    if os.environ.get(env_name) is not None:
        return
    unshare = shutil.which("unshare")
    # In a chroot "/" is not a mount point and cannot be made private; then our mounts
    # could only leak through a shared mount, and with none nothing propagates.
    with open("/proc/self/mountinfo") as f:
        any_shared = " shared:" in f.read()
    for propagation in ("private", None if any_shared else "unchanged"):
        if not unshare or propagation is None:
            continue
        command = [unshare, "--mount", "--propagation", propagation]
        if subprocess.run(command + ["true"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0:
            os.environ[env_name] = "1"
            os.execv(unshare, command + [sys.executable] + sys.argv)
    os.environ[env_name] = "0"
    print("NOTE: `unshare --mount` is not permitted here: %s skipped" % skipped)


def import_client(folder):
    """The echokv Python client (client/python) from `folder`."""
    sys.path.insert(0, folder)
    import echokv
    return echokv


def run_tests(rest):
    """unittest on this module with `rest` as its arguments: 0 when every test passed, 1
    on a failure, 77 when one was skipped (a skipped case is not a passed one: ctest
    reports it as skipped, and CI fails)."""
    program = unittest.main(module="__main__", argv=[sys.argv[0]] + list(rest), exit=False, verbosity=2)
    if not program.result.wasSuccessful():
        return 1
    return SKIP if program.result.skipped else 0
