#!/usr/bin/python3
"""Damaged, full and unusable state directories under the real echokv-server (issue 9
point 5 b-d), on stories260K:

  (b) one state dir holding, next to two healthy sessions, a session with a flipped
      segment-header byte, one with a flipped payload byte, a truncated segment, a
      manifest of an unknown format version, a missing segment and a session copied from
      a server on another model (echokv-make-test-model): the server starts; each
      damaged session is absent with a log line naming it and its kind and counted in
      echokv_state_errors_total{kind} (scraped from /metrics); the flipped payload byte is
      found on first use (payloads are verified lazily, docs/ARCHITECTURE.md "Recovery
      rules"): DATA_LOSS, counted as kind="checksum", never served; every damaged file is
      byte for byte as before; the healthy sessions are served bit for bit (tokens, hot
      positions, greedy continuation) and keep growing.
  (c) disk full: a 2 MiB tmpfs mounted in a private mount namespace (the test re-executes
      itself under `unshare --mount`; without it the test says so and skips this part,
      leaving disk-full to the C++ seam tests state_diskfull_test / durability_test):
      Append, Generate(commit) and Create fail with RESOURCE_EXHAUSTED, the session and
      its files are unchanged, the server keeps serving, and once space is freed the same
      append succeeds and survives kill -9.
  (d) an unusable state dir at start (a regular file, a path under a regular file, a
      read-only file system, a dir another server holds): a clear error naming
      --state_dir and the path, a non-zero exit.

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 tests/server/state_faults_test.py \\
        --server-binary build/bin/echokv-server --client client/python \\
        --make-test-model build/bin/echokv-make-test-model

Needs $ECHOKV_TEST_DATA (models/stories260K); exits 77 (ctest: skipped) when unset.
"""

import errno
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import HANG_GUARD_S  # noqa: E402

GREEDY_N = 6
BUDGET = 8
NAMESPACE_ENV = "ECHOKV_STATE_FAULTS_NAMESPACE"  # set once re-executed under unshare

ARGS = None
echokv = None


class Server(harness.Server):
    """echokv-server on loopback with a state dir; gRPC and metrics ports from --port-file."""

    def __init__(self, state_dir, work, model=None, extra=()):
        super().__init__(ARGS.server_binary, model or ARGS.model, http=False, work=work, poll_s=0.02,
                         extra=["--state-dir", state_dir] + list(extra))
        self.port = self.grpc_port
        self.client = echokv.Client(self.address, retry=False, timeout=60, stream_timeout=60)

    def state_errors(self):
        """{kind: count} of echokv_state_errors_total from /metrics."""
        out = {}
        for m in re.finditer(r'^echokv_state_errors_total\{kind="([a-z_]+)"\} ([0-9.e+]+)$', self.metrics(), re.M):
            out[m.group(1)] = int(float(m.group(2)))
        return out

    def stop(self):
        self.client.close()
        super().stop()

    def kill(self):
        self.client.close()
        super().kill()


class Snapshot:
    """What a session looks like from outside: tokens, hot positions, greedy tokens."""

    @staticmethod
    def of(client, sid):
        tokens = tuple(client.get(sid, include_tokens=True).tokens)
        positions = tuple(tuple(tuple(g.positions) for g in layer.groups)
                          for layer in client.inspect(sid, positions=True).layers)
        greedy = tuple(client.generate(sid, max_tokens=GREEDY_N, ignore_eos=True).collect().token_ids)
        return tokens, positions, greedy


def files_of(directory):
    """{relative path: (size, SHA-256)} of every file under `directory`: equal iff the
    files are byte for byte the same (and a difference prints short)."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                data = f.read()
            out[os.path.relpath(path, directory)] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def listed_segments(session_dir):
    """Segment entries of the manifest (its JSON: ARCHITECTURE.md "Manifest file")."""
    with open(os.path.join(session_dir, "manifest"), "rb") as f:
        data = f.read()
    assert data[:8] == b"ECHOKVMF", session_dir
    (json_bytes,) = struct.unpack_from("<Q", data, 32)
    return json.loads(data[64:64 + json_bytes].decode())["segments"]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def grow(client, ids):
    """A session of a few turns: create, append, commit (three segments)."""
    s = client.create(ids=ids, policy="echokv", budget=BUDGET)
    client.append(s.id, ids=[(i * 7 + 11) % 500 + 3 for i in ids[:6]])
    client.generate(s.id, max_tokens=3, ignore_eos=True, commit=True).collect()
    return s.id


class FaultsTestCase(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory(prefix="echokv-faults-")
        self.addCleanup(self.work.cleanup)
        self.servers = []

    def start(self, state_dir, **kwargs):
        server = Server(state_dir, self.work.name, **kwargs)
        self.servers.append(server)
        return server

    def tearDown(self):
        for server in self.servers:
            if server.process.poll() is None:
                server.kill()
        # Kept for run(): the work dir (and the log in it) is removed by the cleanups,
        # which run before run() can look at the result.
        self.log_tail = ""
        log = os.path.join(self.work.name, "server.log")
        if os.path.exists(log):
            with open(log) as f:
                self.log_tail = f.read()[-6000:]

    def run(self, result=None):
        failures = len(result.failures) + len(result.errors) if result else 0
        self.log_tail = ""
        outcome = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > failures and self.log_tail:
            sys.stderr.write("---- echokv-server log (tail) ----\n" + self.log_tail + "\n")
        return outcome


class DamagedStateTest(FaultsTestCase):
    # victim -> the kind it is refused with at start (None: found on first use)
    KINDS = {"header": "checksum", "truncated": "truncated", "version": "unknown_version",
             "missing": "missing_segment", "foreign": "foreign_model", "payload": None}

    def test_damaged_sessions_are_refused_and_left_untouched(self):
        state = os.path.join(self.work.name, "state")
        server = self.start(state)
        ids = {}
        for n, name in enumerate(["healthy1", "healthy2", "header", "payload", "truncated", "version", "missing"]):
            ids[name] = grow(server.client, [1] + [(n * 31 + i * 13) % 500 + 3 for i in range(12)])
        expected = {name: Snapshot.of(server.client, ids[name]) for name in ("healthy1", "healthy2")}
        server.stop()

        # A session saved by a server on another model, copied into this dir.
        other_model = os.path.join(self.work.name, "other-model")
        subprocess.run([ARGS.make_test_model, "--arch", "llama", "--out", other_model], check=True,
                       stdout=subprocess.DEVNULL)
        other_state = os.path.join(self.work.name, "other-state")
        other = self.start(other_state, model=other_model)
        ids["foreign"] = other.client.create(ids=[1, 5, 6, 7, 8, 9, 10, 11, 12], budget=4).id
        other.stop()
        shutil.copytree(os.path.join(other_state, "sessions", ids["foreign"]),
                        os.path.join(state, "sessions", ids["foreign"]))

        def session_dir(name):
            return os.path.join(state, "sessions", ids[name])

        def segment(name, index):
            seq = listed_segments(session_dir(name))[index]["seq"]
            return os.path.join(session_dir(name), "seg-%d.ekv" % seq)

        for name in ("header", "payload", "truncated", "missing"):
            self.assertGreaterEqual(len(listed_segments(session_dir(name))), 2, name)
        flip_byte(segment("header", 0), 48)  # token_end of the segment header
        with open(segment("payload", -1), "rb") as f:
            (payload_offset,) = struct.unpack_from("<Q", f.read(128), 64)
        flip_byte(segment("payload", -1), payload_offset + 10)
        with open(segment("truncated", -1), "r+b") as f:
            f.truncate(os.path.getsize(segment("truncated", -1)) - 64)
        with open(os.path.join(session_dir("version"), "manifest"), "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", 2))
        os.remove(segment("missing", 0))
        damaged = {name: files_of(session_dir(name)) for name in self.KINDS}

        server = self.start(state)
        client = server.client
        listed = {s.id for s in client.list()}
        self.assertEqual(listed, {ids["healthy1"], ids["healthy2"], ids["payload"]})
        log = server.log()
        refused = {}
        for name, kind in self.KINDS.items():
            if kind is None:
                continue
            self.assertRegex(log, r"saved session '%s' refused \(%s\)" % (ids[name], kind))
            refused[kind] = refused.get(kind, 0) + 1
        self.assertEqual(server.state_errors(), refused)
        self.assertRegex(log, r"restored 3 session\(s\), refused 5")

        # The healthy sessions, bit for bit, and they keep growing.
        for name, snapshot in expected.items():
            self.assertEqual(Snapshot.of(client, ids[name]), snapshot, name)
            grown = client.append(ids[name], ids=[40, 41, 42])
            self.assertEqual(grown.tokens_seen, len(snapshot[0]) + 3)
        # The flipped payload byte: found when the session is first used, never served.
        # The first use is DATA_LOSS; later ones are refused as "failed verification".
        with self.assertRaises(echokv.DataLoss) as caught:
            client.generate(ids["payload"], max_tokens=2).collect()
        self.assertIn("checksum", caught.exception.message)
        with self.assertRaises(echokv.FailedPrecondition) as caught:
            client.append(ids["payload"], ids=[40, 41])
        self.assertIn("failed verification", caught.exception.message)
        with self.assertRaises(echokv.FailedPrecondition):
            client.inspect(ids["payload"], positions=True)
        print("NOTE: after DATA_LOSS the session is still listed: %s"
              % (ids["payload"] in {s.id for s in client.list()}))
        self.assertGreaterEqual(server.state_errors().get("checksum", 0), refused["checksum"] + 1)
        self.assertIn(ids["payload"], server.log())
        # A new session is served.
        fresh = client.create(ids=[1, 20, 21, 22, 23, 24, 25, 26, 27, 28], budget=BUDGET)
        self.assertEqual(client.get(fresh.id).tokens_seen, 10)
        server.stop()

        for name, before in damaged.items():
            self.assertEqual(files_of(session_dir(name)), before, "%s: files changed" % name)
        # Still refused (and still there) on the next start.
        server = self.start(state)
        self.assertNotIn(ids["header"], {s.id for s in server.client.list()})
        self.assertEqual(server.state_errors().get("truncated"), 1)
        server.stop()


class DiskFullTest(FaultsTestCase):
    def test_disk_full(self):
        if os.environ.get(NAMESPACE_ENV) != "1":
            self.skipTest("NOTE: no private mount namespace (needs root and `unshare --mount`); disk full is "
                          "covered by the C++ state_diskfull_test / durability_test seams only")
        mount_point = os.path.join(self.work.name, "small")
        os.mkdir(mount_point)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mount_point], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", mount_point])
        state = os.path.join(mount_point, "state")
        server = self.start(state)
        client = server.client
        victim = grow(client, [1] + list(range(30, 50)))
        other = grow(client, [1] + list(range(60, 75)))
        before = Snapshot.of(client, victim)
        victim_dir = os.path.join(state, "sessions", victim)
        files_before = files_of(victim_dir)

        filler = os.path.join(mount_point, "filler")
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
            except OSError as e:
                self.assertEqual(e.errno, errno.ENOSPC)
        with self.assertRaises(echokv.ResourceExhausted) as caught:
            client.append(victim, ids=list(range(100, 140)))
        self.assertRegex(caught.exception.message, r"(?i)no space|ENOSPC")
        with self.assertRaises(echokv.ResourceExhausted):
            client.generate(victim, max_tokens=4, ignore_eos=True, commit=True).collect()
        with self.assertRaises(echokv.ResourceExhausted):
            client.create(ids=[1] + list(range(200, 240)), budget=BUDGET)
        # Unchanged, still served, and so is everything else.
        self.assertEqual(Snapshot.of(client, victim), before)
        self.assertEqual(files_of(victim_dir), files_before)
        self.assertEqual(len(client.list()), 2)
        self.assertEqual(client.health(), "SERVING")
        self.assertEqual(len(client.generate(other, max_tokens=4, ignore_eos=True).collect().token_ids), 4)

        # Space again: the same append succeeds and is durable.
        os.remove(filler)
        grown = client.append(victim, ids=list(range(100, 140)))
        self.assertEqual(grown.tokens_seen, len(before[0]) + 40)
        after = Snapshot.of(client, victim)
        server.kill()
        server = self.start(state)
        self.assertEqual(Snapshot.of(server.client, victim), after)
        server.stop()


class BadStateDirTest(FaultsTestCase):
    def refused(self, state_dir, expect):
        """Starts the server on `state_dir`; it must exit non-zero naming the flag, the
        path and `expect`."""
        log_path = os.path.join(self.work.name, "refused.log")
        with open(log_path, "w") as log:
            process = subprocess.run(
                [ARGS.server_binary, "--model", ARGS.model, "--host", "127.0.0.1", "--insecure", "--port", "0",
                 "--metrics-port=-1", "--threads", "1", "--state-dir", state_dir],
                stdout=log, stderr=subprocess.STDOUT, timeout=HANG_GUARD_S)
        with open(log_path) as f:
            output = f.read()
        self.assertNotEqual(process.returncode, 0, output)
        self.assertIn("--state_dir", output)
        self.assertIn(state_dir, output)
        self.assertRegex(output, expect)
        self.assertNotIn("listening on", output)

    def test_a_file_in_place_of_the_dir(self):
        path = os.path.join(self.work.name, "not-a-dir")
        with open(path, "w") as f:
            f.write("x")
        self.refused(path, r"not a directory")
        with open(path) as f:
            self.assertEqual(f.read(), "x")

    def test_a_path_under_a_file(self):
        path = os.path.join(self.work.name, "file")
        with open(path, "w") as f:
            f.write("x")
        self.refused(os.path.join(path, "state"), r"Not a directory")

    def test_a_read_only_file_system(self):
        if os.environ.get(NAMESPACE_ENV) != "1":
            self.skipTest("NOTE: no private mount namespace for a read-only mount")
        mount_point = os.path.join(self.work.name, "ro")
        os.mkdir(mount_point)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", mount_point], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", mount_point])
        self.refused(os.path.join(mount_point, "state"), r"Read-only file system")

    def test_a_dir_another_server_holds(self):
        state = os.path.join(self.work.name, "state")
        holder = self.start(state)
        self.refused(state, r"(?i)lock|in use|another")
        self.assertEqual(holder.client.health(), "SERVING")
        holder.stop()


def main():
    global ARGS, echokv
    parser = harness.arguments(__doc__)
    parser.add_argument("--make-test-model", required=True, help="the echokv-make-test-model binary")
    args, rest = parser.parse_known_args()
    args.model = harness.stories260k()
    harness.reexec_in_private_mount_namespace(NAMESPACE_ENV, "the tmpfs parts are")
    ARGS = args
    echokv = harness.import_client(args.client)
    # A skipped part is not a passed one: ctest reports it as skipped (and CI fails).
    return harness.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main())
