#!/usr/bin/python3
"""int8 retained caches through the real echokv-server (issue 31), on stories260K, over
gRPC (and the HTTP door's echokv.cache_dtype):

  - compression.cache_dtype "int8" on CreateSession, in evict and tiered memory: the
    session says int8 (GetSession, InspectCache, the report), its retained bytes are
    2 (d + 4) per entry and KV group (int8 rows with a float32 scale each) where a
    float32 session of the same text and budget holds 8 d, everywhere the bytes are
    reported (GetSession, InspectCache per group and in total, ServerInfo, the
    echokv_session_retained_kv_bytes gauge); the same entries are kept as in float32
    (selection scores in full precision);
  - append, generate (commit), fork, export / import keep it int8: a fork and an import
    continue with the source's greedy tokens, exactly (rows and scales are copied, never
    re-quantized);
  - with --state-dir, a restart brings every int8 session back with the same retained
    positions, bytes and greedy continuation (evict: the int8 rows and scales saved; tiered:
    re-quantized from the exact cold tier, the same bits);
  - state written before issue 31 (testdata/state_before_31: made by echokv-server at
    3465d71 on stories260K, with its expected tokens, positions and greedy continuation in
    state_before_31.json) still loads, as float32 sessions, and continues as it did;
  - --default_cache_dtype int8 makes int8 the default; bad names are refused naming the
    field (gRPC INVALID_ARGUMENT "compression.cache_dtype", HTTP 400 param
    "echokv.cache_dtype", the server refusing to start on a bad flag).

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 tests/server/int8_cache_test.py \\
        --server-binary build/bin/echokv-server --client client/python

Needs $ECHOKV_TEST_DATA (models/stories260K); exits 77 (ctest: skipped) when unset.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
         "with her friends. One day she saw a big tree with a swing.")
MORE = " Lily ran to the swing and laughed."
BUDGET = 12
GREEDY = 10

ARGS = None
echokv = None


def greedy(c, sid, n=GREEDY):
    return list(c.generate(sid, max_tokens=n, ignore_eos=True).collect().token_ids)


def positions(c, sid):
    return [[list(g.positions) for g in layer.groups] for layer in c.inspect(sid, positions=True).layers]


class Int8CacheTest(harness.LogOnFailure, unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="echokv-int8-")
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            if s.running():
                s.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def start(self, *extra, metrics=False, http=False):
        s = harness.Server(ARGS.server_binary, ARGS.model, http=http, metrics=metrics, work=self.work,
                           name="server%d" % len(self.servers), extra=list(extra))
        self.servers.append(s)
        self.server = s
        return s, echokv.Client(s.address, retry=False, timeout=60, stream_timeout=60)

    def failure_server(self):
        return self.servers[-1] if self.servers else None

    def test_sessions_in_int8(self):
        server, c = self.start(metrics=True, http=True)
        info = c.info()
        d = info.model.head_dim
        self.assertEqual(info.default_compression.cache_dtype, "float32")
        for memory in ("evict", "tiered"):
            with self.subTest(memory=memory):
                f = c.create(STORY, policy="snapkv", budget=BUDGET, memory=memory)
                q = c.create(STORY, policy="snapkv", budget=BUDGET, memory=memory, cache_dtype="int8")
                self.assertEqual(f.compression.cache_dtype, "float32")
                self.assertEqual(q.compression.cache_dtype, "int8")
                self.assertEqual(q.last_report.config.cache_dtype, "int8")
                self.assertEqual(q.retained_entries, f.retained_entries)
                self.assertEqual(f.retained_kv_bytes, f.retained_entries * 8 * d)
                self.assertEqual(q.retained_kv_bytes, q.retained_entries * 2 * (d + 4))
                self.assertEqual(q.full_kv_bytes, f.full_kv_bytes)  # measured against float32
                self.assertEqual(q.last_report.retained_kv_bytes, q.retained_kv_bytes)
                self.assertEqual(positions(c, q.id), positions(c, f.id))  # full-precision selection
                ins = c.inspect(q.id)
                self.assertEqual(ins.total_kv_bytes, q.retained_kv_bytes)
                for layer in ins.layers:
                    for g in layer.groups:
                        self.assertEqual(g.kv_bytes, g.retained * 2 * (d + 4))
                # Append and a committed generation keep it int8 and its bytes true.
                q = c.append(q.id, MORE)
                self.assertEqual(q.compression.cache_dtype, "int8")
                self.assertEqual(q.retained_kv_bytes, q.retained_entries * 2 * (d + 4))
                result = c.generate(q.id, max_tokens=4, ignore_eos=True, commit=True).collect()
                q = result.session
                self.assertEqual(q.retained_kv_bytes, q.retained_entries * 2 * (d + 4))
                # Generating does not change the session: the same greedy tokens twice.
                want = greedy(c, q.id)
                self.assertEqual(greedy(c, q.id), want)
                # A fork and an import continue exactly as the source.
                fork = c.fork(q.id)
                self.assertEqual(fork.compression.cache_dtype, "int8")
                self.assertEqual(fork.retained_kv_bytes, q.retained_kv_bytes)
                self.assertEqual(greedy(c, fork.id), want)
                imported = c.import_(b"".join(c.export(q.id)))
                self.assertEqual(imported.compression.cache_dtype, "int8")
                self.assertEqual(imported.retained_kv_bytes, q.retained_kv_bytes)
                self.assertEqual(positions(c, imported.id), positions(c, q.id))
                self.assertEqual(greedy(c, imported.id), want)
        # ServerInfo's live bytes and the gauge add the sessions' own (int8 and float32).
        live = sum(s.retained_kv_bytes for s in c.list())
        self.assertEqual(c.info().live_retained_kv_bytes, live)
        harness.wait_until(lambda: server.metric("echokv_session_retained_kv_bytes") == live,
                           "echokv_session_retained_kv_bytes = %d" % live)
        # Refusals name the field.
        for bad in ("int4", "bfloat16", "INT8", ""):
            with self.subTest(bad=bad):
                with self.assertRaises(echokv.errors.InvalidArgument) as e:
                    c.create(STORY, budget=BUDGET, cache_dtype=bad)
                self.assertIn("compression.cache_dtype", str(e.exception))
        status, _, body = harness.post_json(server.http_port, "/v1/completions",
                                            {"model": "stories260K", "prompt": STORY, "max_tokens": 3,
                                             "echokv": {"cache_dtype": "int3"}})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], "echokv.cache_dtype")
        status, _, body = harness.post_json(server.http_port, "/v1/completions",
                                            {"model": "stories260K", "prompt": STORY, "max_tokens": 3,
                                             "echokv": {"cache_dtype": "int8", "budget": BUDGET}})
        self.assertEqual(status, 200, body)
        c.close()

    def test_restart_and_default(self):
        state = os.path.join(self.work, "state")
        server, c = self.start("--state-dir", state, "--default-cache-dtype", "int8")
        self.assertEqual(c.info().default_compression.cache_dtype, "int8")
        want = {}
        for memory in ("evict", "tiered"):
            s = c.create(STORY, policy="snapkv", budget=BUDGET, memory=memory)
            self.assertEqual(s.compression.cache_dtype, "int8")  # the server default
            s = c.append(s.id, MORE)
            want[s.id] = (c.get(s.id).retained_kv_bytes, positions(c, s.id), greedy(c, s.id))
        c.close()
        server.stop()
        server.start()
        c = echokv.Client(server.address, retry=False, timeout=60, stream_timeout=60)
        for sid, (size, pos, tokens) in want.items():
            with self.subTest(session=sid):
                s = c.get(sid)
                self.assertEqual(s.compression.cache_dtype, "int8")
                self.assertEqual(s.retained_kv_bytes, size)
                self.assertEqual(positions(c, sid), pos)
                self.assertEqual(greedy(c, sid), tokens)
        c.close()
        server.stop()
        # A bad flag: the server does not start, and says which flag.
        bad = subprocess.run([ARGS.server_binary, "--model", ARGS.model, "--insecure", "--port", "0",
                              "--default-cache-dtype", "int4"], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--default_cache_dtype", bad.stdout + bad.stderr)

    def test_state_written_before_issue_31_still_loads(self):
        state = os.path.join(self.work, "old-state")
        shutil.copytree(os.path.join(HERE, "testdata", "state_before_31"), state)
        with open(os.path.join(HERE, "testdata", "state_before_31.json")) as f:
            expected = json.load(f)
        server, c = self.start("--state-dir", state)
        for memory, e in expected.items():
            with self.subTest(memory=memory):
                s = c.get(e["id"], include_tokens=True)
                self.assertEqual(s.memory, memory)
                self.assertEqual(s.compression.cache_dtype, "float32")
                self.assertEqual(list(s.tokens), e["tokens"])
                self.assertEqual(s.retained_kv_bytes, e["retained_kv_bytes"])
                self.assertEqual(positions(c, e["id"]), e["positions"])
                self.assertEqual(greedy(c, e["id"]), e["greedy"])
        c.close()


def main():
    global ARGS, echokv
    args, rest = harness.arguments(__doc__).parse_known_args()
    args.model = harness.stories260k()
    ARGS = args
    echokv = harness.import_client(args.client)
    return harness.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main())
