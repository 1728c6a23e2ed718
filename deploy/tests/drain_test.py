#!/usr/bin/python3
"""A local stand-in for the chart's rolling update and scale-down (issue 32): three
echokv-server processes (replica ids echokv-0..2, their own state dirs, stories260K)
behind the Python client's owner routing (replicas=), as in
tests/client/python/client_server_test.py's three-replica test.

  rolling update   each server in turn gets SIGTERM and restarts on its state dir and
                   port (what the StatefulSet does, pod by pod); while one is down its
                   sessions answer UNAVAILABLE (never NOT_FOUND); afterwards every
                   session continues exactly as before (the same greedy tokens).
  scale-down 3->2  `echokv-cli drain` on echokv-2 reads spec.replicas (2) from a fake
                   Kubernetes API with the pod's token, moves every session to its
                   heir echokv-1 (ids kept) while a client keeps appending to one of
                   them; then echokv-2 stops. No acknowledged append is lost, and the
                   client finds every session on the remaining pods (its walk over the
                   owner's heirs) and continues it identically.
  scale-down 2->1  the same for echokv-1: its own sessions and those drained from
                   echokv-2 go to echokv-0.
  guards           a pod within the replica count moves nothing (a rolling update);
                   an API that refuses the token (403) moves nothing either.

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 deploy/tests/drain_test.py \
        --server-binary build/bin/echokv-server --cli build/bin/echokv-cli --client client/python

Exits 77 (ctest: skipped) without $ECHOKV_TEST_DATA (models/stories260K).
"""

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

SKIP = 77
ARGS = None
echokv = None
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
         "in the park with her friends. One day, she found a small red ball.")
NAMES = ["echokv-0", "echokv-1", "echokv-2"]



class Server:
    """echokv-server on loopback; port 0 + --port-file unless `port`."""

    def __init__(self, name, state_dir, port=0):
        self.name = name
        self.tmp = tempfile.TemporaryDirectory(prefix="echokv-drain-")
        self.port_file = os.path.join(self.tmp.name, "ports")
        self.log_path = os.path.join(self.tmp.name, "server.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [ARGS.server_binary, "--model", ARGS.model, "--host", "127.0.0.1", "--insecure",
             "--port", str(port), "--metrics-port=-1", "--port-file", self.port_file, "--threads", "1",
             "--replica-id", name, "--state-dir", state_dir, "--shutdown-grace", "2s"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.port = port

    def wait(self, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("%s exited with %d:\n%s" % (self.name, self.process.returncode, self.tail()))
            if os.path.exists(self.port_file):
                with open(self.port_file) as f:
                    lines = f.read().split()
                if len(lines) >= 2:
                    self.port = int(lines[0])
                    return self
            time.sleep(0.05)
        raise AssertionError("%s wrote no --port-file in %d s" % (self.name, timeout_s))

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-3000:]

    def stop(self):
        """SIGTERM, as the kubelet sends after the preStop hook; exit 0 expected."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError("%s ignored SIGTERM for 60 s" % self.name)
            if code != 0:
                raise AssertionError("%s exited with %d after SIGTERM:\n%s" % (self.name, code, self.tail()))
        self.log.close()
        self.tmp.cleanup()


class FakeKubeApi:
    """GET /apis/apps/v1/namespaces/NS/statefulsets/echokv -> {"spec": {"replicas": N}}
    for the bearer token `token`; 403 otherwise. Records the requests."""

    def __init__(self, token, namespace="echokv-ns"):
        self.replicas = 3
        self.requests = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                api.requests.append((self.path, self.headers.get("Authorization")))
                want = "/apis/apps/v1/namespaces/%s/statefulsets/echokv" % namespace
                if self.headers.get("Authorization") != "Bearer " + token:
                    self.send_response(403)
                    body = b'{"kind":"Status","code":403}'
                elif self.path != want:
                    self.send_response(404)
                    body = b'{"kind":"Status","code":404}'
                else:
                    self.send_response(200)
                    body = json.dumps({"kind": "StatefulSet", "metadata": {"name": "echokv"},
                                       "spec": {"replicas": api.replicas, "serviceName": "echokv-headless"},
                                       "status": {"replicas": 3}}).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class DrainTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.TemporaryDirectory(prefix="echokv-drain-fleet-")
        self.addCleanup(self.root.cleanup)
        self.servers = {}
        self.addCleanup(self.stop_all)
        for name in NAMES:
            self.servers[name] = Server(name, self.state(name))
        for s in self.servers.values():
            s.wait()
        self.addresses = {n: s.address for n, s in self.servers.items()}
        self.kube_dir = os.path.join(self.root.name, "kube")
        os.mkdir(self.kube_dir)
        for f, text in (("token", "pod-token\n"), ("namespace", "echokv-ns\n")):
            with open(os.path.join(self.kube_dir, f), "w") as fh:
                fh.write(text)
        self.api = FakeKubeApi("pod-token")
        self.addCleanup(self.api.stop)

    def state(self, name):
        return os.path.join(self.root.name, name)

    def stop_all(self):
        failed = []
        for name, server in self.servers.items():
            try:
                server.stop()
            except AssertionError as e:
                failed.append(str(e))
        if failed:
            raise AssertionError("\n".join(failed))

    def client(self):
        c = echokv.Client(replicas=self.addresses)
        self.addCleanup(c.close)
        return c

    def drain(self, name, *extra, expect_rc=0):
        peers = ",".join("%s=%s" % (n, a) for n, a in self.addresses.items() if n != name)
        cmd = [ARGS.cli, "--server", self.addresses[name], "--timeout", "30", "drain", "--pod", name,
               "--statefulset", "echokv", "--kube-dir", self.kube_dir, "--kube-api", self.api.url,
               "--peers", peers, "--deadline", "120"] + list(extra)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        self.assertEqual(p.returncode, expect_rc, "drain of %s:\n%s%s" % (name, p.stdout, p.stderr))
        return p

    def listed(self, name):
        with echokv.Client(self.addresses[name], retry=False) as c:
            return {s.id for s in c.list()}

    def restart(self, name):
        port = self.servers[name].port
        self.servers[name].stop()
        self.servers[name] = Server(name, self.state(name), port=port).wait()

    def wait_serving(self, name):
        """Until the restarted server answers a fresh channel (what a readiness probe
        gates traffic on)."""
        deadline = time.monotonic() + 60
        while True:
            with echokv.Client(self.addresses[name], retry=False) as probe:
                try:
                    if probe.health(timeout=2) == "SERVING":
                        return
                except (echokv.Unavailable, echokv.DeadlineExceeded):
                    pass
            self.assertLess(time.monotonic(), deadline, "%s never answered" % name)
            time.sleep(0.1)

    def continuations(self, client, sessions):
        return {sid: client.generate(sid, max_tokens=8).collect().token_ids for sid in sessions}

    def test_rolling_update_then_scale_down(self):
        client = self.client()
        sessions = []
        for i in range(6):
            s = client.create("%s Number %d." % (STORY, i), budget=16)
            client.generate(s.id, max_tokens=4, commit=True).collect()
            sessions.append(s.id)
        owners = {sid.split(".")[0] for sid in sessions}
        self.assertEqual(owners, set(NAMES), "new sessions spread over the three")
        reference = self.continuations(client, sessions)

        # --- rolling update: one pod at a time, highest ordinal first (StatefulSet order).
        for name in reversed(NAMES):
            victim = next(sid for sid in sessions if sid.startswith(name + "."))
            port = self.servers[name].port
            self.servers[name].stop()
            # Down: its sessions are UNAVAILABLE, not NOT_FOUND (their state is on its volume;
            # the heirs answer NOT_FOUND and the client reports the owner's state).
            with echokv.Client(replicas=self.addresses, retry=False) as probe:
                with self.assertRaises(echokv.Unavailable):
                    probe.get(victim, timeout=5)
            self.servers[name] = Server(name, self.state(name), port=port).wait()
            self.wait_serving(name)
        # (A client connected before reconnects on gRPC's own backoff; a new one at once.)
        client = self.client()
        self.assertEqual(self.continuations(client, sessions), reference, "after the rolling update")

        # --- the drain of a pod within the replica count moves nothing.
        self.api.replicas = 3
        p = self.drain("echokv-1")
        self.assertIn("within the 3 replica(s)", p.stderr)
        self.assertEqual(self.listed("echokv-1"), {s for s in sessions if s.startswith("echokv-1.")})

        # --- an API that refuses the pod's token: nothing moves, exit 1.
        with open(os.path.join(self.kube_dir, "token"), "w") as f:
            f.write("stale-token")
        self.api.replicas = 2
        p = self.drain("echokv-2", expect_rc=1)
        self.assertIn("PERMISSION_DENIED", p.stderr)
        self.assertIn("nothing moved", p.stderr)
        self.assertEqual(len(self.listed("echokv-2")), 2)
        with open(os.path.join(self.kube_dir, "token"), "w") as f:
            f.write("pod-token")

        # --- scale-down 3 -> 2, with a client appending to one of echokv-2's sessions
        # throughout the drain. Every append the client got an answer for must be in
        # the session afterwards.
        writer_sid = next(sid for sid in sessions if sid.startswith("echokv-2."))
        others = [sid for sid in sessions if sid != writer_sid]
        acked = []
        stop = threading.Event()
        errors = []

        def writer():
            w = echokv.Client(replicas=self.addresses)
            try:
                while not stop.is_set():
                    try:
                        acked.append(w.append(writer_sid, " And then they played.").tokens_seen)
                    except (echokv.FailedPrecondition, echokv.NotFound) as e:
                        errors.append(e)  # busy with the drain's copy / between two pods
                    time.sleep(0.1)
            finally:
                w.close()

        t = threading.Thread(target=writer)
        t.start()
        try:
            time.sleep(0.3)
            p = self.drain("echokv-2")
            time.sleep(0.3)
        finally:
            stop.set()
            t.join()
        moved = [line for line in p.stdout.splitlines() if "->" in line]
        self.assertEqual(len(moved), 2, p.stdout + p.stderr)
        self.assertTrue(all(line.endswith("-> echokv-1") for line in moved), p.stdout)  # heir of 2 with 2 pods
        self.assertEqual(self.listed("echokv-2"), set(), "echokv-2 kept sessions after its drain")
        self.assertEqual(self.api.requests[-1], ("/apis/apps/v1/namespaces/echokv-ns/statefulsets/echokv",
                                                 "Bearer pod-token"))
        self.assertGreater(len(acked), 3, "the writer got few answers: %s" % errors)
        self.servers["echokv-2"].stop()
        del self.servers["echokv-2"]
        fresh = self.client()  # learns nothing in advance: walks from the id's owner
        self.assertEqual(fresh.get(writer_sid).tokens_seen, max(acked), "an acknowledged append was lost")
        self.assertEqual(self.continuations(fresh, others), {s: reference[s] for s in others},
                         "after the scale-down to 2")
        self.assertEqual(self.listed("echokv-0") | self.listed("echokv-1"), set(sessions), "a session was lost")

        # --- scale-down 2 -> 1: echokv-1's own sessions and those it holds for echokv-2.
        self.api.replicas = 1
        p = self.drain("echokv-1")
        self.assertEqual(len([line for line in p.stdout.splitlines() if line.endswith("-> echokv-0")]), 4,
                         p.stdout + p.stderr)
        self.servers["echokv-1"].stop()
        del self.servers["echokv-1"]
        self.assertEqual(self.listed("echokv-0"), set(sessions))
        fresh = self.client()
        self.assertEqual(self.continuations(fresh, others), {s: reference[s] for s in others},
                         "after the scale-down to 1")
        self.assertEqual(fresh.get(writer_sid).tokens_seen, max(acked))


def main():
    global ARGS, echokv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--client", required=True, help="folder holding the echokv package")
    args, rest = parser.parse_known_args()
    data = os.environ.get("ECHOKV_TEST_DATA")
    if not data:
        print("SKIP: $ECHOKV_TEST_DATA is not set (needs models/stories260K)")
        return SKIP
    args.model = os.path.join(data, "models", "stories260K")
    ARGS = args
    sys.path.insert(0, args.client)
    import echokv as module
    echokv = module
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
