#!/usr/bin/python3
"""The quality-targeted budget (issue 29 point 4, docs/ALGORITHM.md §9) through the real
echokv-server, on stories260K, over gRPC and the HTTP door's echokv.target_mass:

  - compression.target_mass on CreateSession (echokv and snapkv, evict and tiered
    memory): every layer keeps at most `budget` entries (the ceiling); the fidelity
    signal of every layer below the ceiling reaches the target in every KV group; a
    lower target keeps fewer entries (memory saved grows) and the bytes follow; the
    session, its report, InspectCache and the CLI-visible config say target_mass;
  - an append re-selects with the same target (its report carries it); a fork keeps
    it; with --state-dir a restart brings it back;
  - bad values are refused naming the field (gRPC INVALID_ARGUMENT
    "compression.target_mass" for 0, 1.5, NaN and for a policy without it, h2o; HTTP 400
    param "echokv.target_mass" for 0 and for a string).

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 tests/server/target_mass_test.py \\
        --server-binary build/bin/echokv-server --client client/python

Needs $ECHOKV_TEST_DATA (models/stories260K); exits 77 (ctest: skipped) when unset.
"""

import math
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
         "with her friends. One day she saw a big tree with a swing. She ran to the tree and sat on "
         "the swing. Her mom pushed her high into the sky and Lily laughed and laughed.")
MORE = " Then a little bird came and sat on the branch next to her."
CEILING = 40

ARGS = None
echokv = None


def layer_masses(report):
    """Per layer, the retained mass of its KV groups (the report's row-major list)."""
    g = report.num_kv_heads
    m = list(report.retained_mass)
    return [m[i * g:(i + 1) * g] for i in range(report.num_layers)]


class TargetMassTest(harness.LogOnFailure, unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="echokv-mass-")
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            if s.running():
                s.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def start(self, *extra, http=False):
        s = harness.Server(ARGS.server_binary, ARGS.model, http=http, work=self.work,
                           name="server%d" % len(self.servers), extra=list(extra))
        self.servers.append(s)
        return s, echokv.Client(s.address, retry=False, timeout=60, stream_timeout=60)

    def failure_server(self):
        return self.servers[-1] if self.servers else None

    def check_target(self, report, target):
        """Every layer within the ceiling; below it, every group at the target."""
        self.assertAlmostEqual(report.config.target_mass, target, places=12)
        self.assertEqual(report.config.budget, CEILING)
        below = 0
        for layer, (kept, masses) in enumerate(zip(report.retained_per_layer, layer_masses(report))):
            self.assertLessEqual(kept, CEILING, "layer %d" % layer)
            self.assertGreaterEqual(kept, 1, "layer %d" % layer)
            if kept < CEILING and kept < report.context_tokens:
                below += 1
                for g, m in enumerate(masses):
                    self.assertGreaterEqual(m, target - 1e-6, "layer %d group %d" % (layer, g))
        return below

    def test_sessions(self):
        server, c = self.start("--state-dir", os.path.join(self.work, "state"))
        for policy in ("echokv", "snapkv"):
            for memory in ("evict", "tiered"):
                with self.subTest(policy=policy, memory=memory):
                    fixed = c.create(STORY, policy=policy, budget=CEILING, memory=memory)
                    self.assertEqual(list(fixed.last_report.retained_per_layer),
                                     [CEILING] * fixed.last_report.num_layers)
                    kept = {}
                    for target in (0.5, 0.8):
                        s = c.create(STORY, policy=policy, budget=CEILING, memory=memory, target_mass=target)
                        self.assertGreater(s.last_report.context_tokens, CEILING)
                        self.assertGreater(self.check_target(s.last_report, target), 0)
                        self.assertAlmostEqual(s.compression.target_mass, target, places=12)
                        self.assertAlmostEqual(c.get(s.id).compression.target_mass, target, places=12)
                        # The bytes are those of what each layer kept.
                        entries = sum(s.last_report.retained_per_layer) * s.last_report.num_kv_heads
                        self.assertEqual(s.retained_entries, entries)
                        self.assertEqual(s.retained_kv_bytes * fixed.retained_entries,
                                         fixed.retained_kv_bytes * entries)
                        layers = c.inspect(s.id).layers
                        self.assertEqual([l.groups[0].retained for l in layers], list(s.last_report.retained_per_layer))
                        kept[target] = s
                    # A lower target keeps fewer entries; both fewer than the fixed budget.
                    self.assertLess(kept[0.5].retained_entries, kept[0.8].retained_entries)
                    self.assertLess(kept[0.8].retained_entries, fixed.retained_entries)
                    # An append re-selects with the same target; a fork keeps it.
                    s = c.append(kept[0.8].id, MORE)
                    self.check_target(s.last_report, 0.8)
                    fork = c.fork(s.id)
                    self.assertAlmostEqual(fork.compression.target_mass, 0.8, places=12)
                    self.assertEqual(fork.retained_entries, s.retained_entries)
        ids = {s.id: (s.compression.target_mass, s.retained_entries) for s in c.list()}
        c.close()
        server.stop()
        # A restart brings the target back with every session.
        server, c = self.start("--state-dir", os.path.join(self.work, "state"))
        for sid, (target, entries) in ids.items():
            s = c.get(sid)
            self.assertEqual(s.retained_entries, entries)
            if target:
                self.assertAlmostEqual(s.compression.target_mass, target, places=12)
                self.assertAlmostEqual(s.last_report.config.target_mass, target, places=12)
        c.close()

    def test_refusals(self):
        server, c = self.start(http=True)
        for bad in (0.0, 1.5, -0.1, math.nan):
            with self.subTest(bad=bad):
                with self.assertRaises(echokv.errors.InvalidArgument) as e:
                    c.create(STORY, policy="echokv", budget=CEILING, target_mass=bad)
                self.assertIn("compression.target_mass", str(e.exception))
        with self.assertRaises(echokv.errors.InvalidArgument) as e:
            c.create(STORY, policy="h2o", budget=CEILING, target_mass=0.9)
        self.assertIn("compression.target_mass", str(e.exception))
        self.assertIn("h2o", str(e.exception))
        for bad in (0, "0.9", 2):
            with self.subTest(http=bad):
                status, _, body = harness.post_json(server.http_port, "/v1/completions",
                                                    {"model": "stories260K", "prompt": STORY, "max_tokens": 3,
                                                     "echokv": {"target_mass": bad, "budget": CEILING}})
                self.assertEqual(status, 400, body)
                self.assertEqual(body["error"]["param"], "echokv.target_mass")
        status, _, body = harness.post_json(server.http_port, "/v1/completions",
                                            {"model": "stories260K", "prompt": STORY, "max_tokens": 3,
                                             "echokv": {"target_mass": 0.7, "budget": CEILING}})
        self.assertEqual(status, 200, body)
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
