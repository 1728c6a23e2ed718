#!/usr/bin/python3
"""The Python client's walk over a session's heirs (client/python/echokv/_base.py
RouteWalk), against in-process fake replicas (tests/client/python/fake_server.py):
after a scale-down drain the sessions of pod j live on the first remaining of j/2,
j/4, ..., 0, and the client must still find them — directly (replicas=) or through
the chart's gateway (gateway=True: one more call with x-echokv-fallback: heirs) —
without ever sending a mutation twice to a server that may have run it.

    /usr/bin/python3 deploy/tests/routing_walk_test.py --client client/python \
        --fakes tests/client/python
"""

import argparse
import asyncio
import os
import sys
import threading
import unittest

if __name__ == "__main__":
    _parser = argparse.ArgumentParser()
    _parser.add_argument("--client", required=True, help="folder holding the echokv package")
    _parser.add_argument("--fakes", required=True, help="folder holding fake_server.py")
    _args, _rest = _parser.parse_known_args()
    sys.path.insert(0, _args.client)
    sys.path.insert(0, _args.fakes)
    sys.argv[1:] = _rest

import grpc  # noqa: E402

import echokv  # noqa: E402
import fake_server  # noqa: E402
from echokv.routing import heir_names  # noqa: E402
from fake_server import FakeReplica  # noqa: E402

FAST = echokv.RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002)

# A fake gateway: a FakeReplica that answers calls about `moved` sessions with the
# given code unless they carry x-echokv-fallback: heirs (what the chart's Envoy does
# when the owner pod is gone: its own route has no healthy host; the heirs route
# finds the session). Every call's fallback header is recorded.
_enter = fake_server._Servicer._enter


def _gateway_enter(self, method, request, context):
    md = dict(context.invocation_metadata())
    sid = getattr(request, "session_id", None)
    r = self.r
    with r.lock:
        r.fallbacks.append((method, md.get("x-echokv-fallback")))
    code = getattr(r, "moved", {}).get(sid)
    if code is not None and md.get("x-echokv-fallback") != "heirs":
        context.abort(code, "the owner pod of %s does not answer" % sid)
    return _enter(self, method, request, context)


fake_server._Servicer._enter = _gateway_enter


def fake(name):
    f = FakeReplica(name=name)
    f.fallbacks = []
    f.moved = {}
    return f.start()


def move(session, src, dst):
    """What the drain does: the session (its id kept) from one fake to another."""
    dst.sessions[session] = src.sessions.pop(session)


class HeirsTest(unittest.TestCase):
    def test_heir_names(self):
        self.assertEqual(heir_names("echokv-5"), ["echokv-2", "echokv-1", "echokv-0"])
        self.assertEqual(heir_names("echokv-1"), ["echokv-0"])
        self.assertEqual(heir_names("echokv-0"), [])
        self.assertEqual(heir_names("my-app-12"), ["my-app-6", "my-app-3", "my-app-1", "my-app-0"])
        self.assertEqual(heir_names("plain"), [])


class DirectTest(unittest.TestCase):
    """replicas={name: address}: the client walks the heirs itself."""

    def setUp(self):
        self.fakes = {n: fake(n) for n in ("echokv-0", "echokv-1", "echokv-2")}
        for f in self.fakes.values():
            self.addCleanup(f.stop)
        self.client = echokv.Client(replicas={n: f.address for n, f in self.fakes.items()}, retry=FAST)
        self.addCleanup(self.client.close)

    def create_on(self, name, text="Once"):
        return self.client.create(text, replica=name)

    def gone(self, name):
        """The pod is scaled away: its fake stops, and the test goes on once the client's
        channel to it has seen the connection close. A call started while that
        connection is being torn down can stay unanswered past its deadline (grpcio
        1.51; 1 run in ~20 of this test hung there until ctest's timeout), a race of the
        test's making: a pod's removal and the next call are not microseconds apart."""
        address = self.fakes[name].address
        self.fakes[name].stop()
        channel = self.client._channels.get(address)[0]
        closed = threading.Event()

        def on_state(state):
            if state != grpc.ChannelConnectivity.READY:
                closed.set()

        channel.subscribe(on_state, try_to_connect=False)
        try:
            self.assertTrue(closed.wait(10), "the client's channel to %s stayed READY after its stop" % name)
        finally:
            channel.unsubscribe(on_state)

    def test_gone_owner_is_walked_for_reads_and_streams(self):
        s = self.create_on("echokv-2")
        self.assertTrue(s.id.startswith("echokv-2."))
        before = self.client.generate(s.id, max_tokens=3).collect().token_ids
        move(s.id, self.fakes["echokv-2"], self.fakes["echokv-1"])  # 2 -> 2/2 = 1
        self.gone("echokv-2")                                        # scaled away
        for f in self.fakes.values():
            f.clear()
        self.assertEqual(self.client.get(s.id).id, s.id)
        self.assertEqual(self.fakes["echokv-1"].methods(), ["GetSession"])
        # Learned: the stream goes straight to the heir, and continues identically.
        self.assertEqual(self.client.generate(s.id, max_tokens=3).collect().token_ids, before)
        self.assertEqual(self.fakes["echokv-1"].methods(), ["GetSession", "Generate"])
        self.assertEqual(self.fakes["echokv-0"].methods(), [])

    def test_stream_walks_before_learning(self):
        s = self.create_on("echokv-2")
        move(s.id, self.fakes["echokv-2"], self.fakes["echokv-0"])  # after two scale-downs
        self.gone("echokv-2")
        out = self.client.generate(s.id, max_tokens=2).collect()
        self.assertEqual(len(out.token_ids), 2)
        # 2 is gone (UNAVAILABLE), 1 answers NOT_FOUND, 0 holds it.
        self.assertEqual(self.fakes["echokv-1"].methods(), ["Generate"])
        self.assertEqual(self.fakes["echokv-0"].methods()[-1], "Generate")

    def test_owner_up_but_not_holding(self):
        """After a scale-up the owner pod exists again but its drained sessions are on
        an heir: its NOT_FOUND sends the call on to the heirs."""
        s = self.create_on("echokv-2")
        move(s.id, self.fakes["echokv-2"], self.fakes["echokv-1"])
        self.client.append(s.id, " upon")  # a mutation: NOT_FOUND did nothing, so it walks
        self.assertEqual(self.fakes["echokv-2"].methods()[-1], "AppendToSession")
        self.assertEqual(self.fakes["echokv-1"].methods(), ["AppendToSession"])
        self.assertEqual(self.client.get(s.id).tokens_seen, len("Once upon"))

    def test_unary_mutation_is_not_resent_after_unavailable(self):
        s = self.create_on("echokv-2")
        move(s.id, self.fakes["echokv-2"], self.fakes["echokv-1"])
        self.gone("echokv-2")
        with self.assertRaises(echokv.Unavailable):
            self.client.fork(s.id)  # may have run on the owner: never sent elsewhere
        self.assertEqual(self.fakes["echokv-1"].methods(), [])

    def test_restarting_owner_is_unavailable_not_not_found(self):
        """The owner is down with the session on its volume (a rolling update): the heirs
        answer NOT_FOUND, and the client reports the owner's UNAVAILABLE (retry later)."""
        s = self.create_on("echokv-2")
        self.gone("echokv-2")
        with self.assertRaises(echokv.Unavailable):
            self.client.get(s.id, timeout=5)
        with self.assertRaises(echokv.Unavailable):
            self.client.generate(s.id, max_tokens=1).collect()

    def test_deleted_session_is_not_found(self):
        s = self.create_on("echokv-2")
        self.client.delete(s.id)
        with self.assertRaises(echokv.NotFound):
            self.client.get(s.id)
        # The owner answered, then each heir once.
        self.assertEqual(self.fakes["echokv-1"].methods(), ["GetSession"])
        self.assertEqual(self.fakes["echokv-0"].methods(), ["GetSession"])


    def test_async_client_walks_the_same(self):
        s = self.create_on("echokv-2")
        move(s.id, self.fakes["echokv-2"], self.fakes["echokv-0"])
        self.gone("echokv-2")

        async def run():
            async with echokv.AsyncClient(replicas={n: f.address for n, f in self.fakes.items()},
                                          retry=FAST) as c:
                self.assertEqual((await c.get(s.id)).id, s.id)
                out = await c.generate(s.id, max_tokens=2).collect()
                self.assertEqual(len(out.token_ids), 2)
                fork = await c.fork(s.id)  # learned: the heir, which holds it
                self.assertTrue(fork.id.startswith("echokv-0."))
        asyncio.run(run())
        self.assertEqual(self.fakes["echokv-0"].methods()[-3:], ["GetSession", "Generate", "ForkSession"])
        self.assertEqual(self.fakes["echokv-1"].methods(), ["GetSession"])  # walked once, then learned


class GatewayTest(unittest.TestCase):
    """gateway=True: one target, the walk is the gateway's (x-echokv-fallback: heirs)."""

    def setUp(self):
        self.gw = fake("echokv-2")
        self.addCleanup(self.gw.stop)

    def client(self, **kwargs):
        c = echokv.Client(self.gw.address, retry=FAST, **kwargs)
        self.addCleanup(c.close)
        return c

    def test_read_and_stream_after_scale_down(self):
        c = self.client(gateway=True)
        s = c.create("Once")
        self.gw.moved[s.id] = grpc.StatusCode.UNAVAILABLE  # the owner pod is gone
        del self.gw.fallbacks[:]
        self.assertEqual(c.get(s.id).id, s.id)
        self.assertEqual(self.gw.fallbacks, [("GetSession", None), ("GetSession", "heirs")])
        # Learned: later calls carry the header from the start.
        c.generate(s.id, max_tokens=2).collect()
        self.assertEqual(self.gw.fallbacks[-1], ("Generate", "heirs"))

    def test_not_found_of_a_mutation_stream_is_walked(self):
        c = self.client(gateway=True)
        s = c.create("Once")
        self.gw.moved[s.id] = grpc.StatusCode.NOT_FOUND  # owner back, session on an heir
        del self.gw.fallbacks[:]
        c.append(s.id, " upon")
        self.assertEqual(self.gw.fallbacks, [("AppendToSession", None), ("AppendToSession", "heirs")])

    def test_unary_mutation_is_not_resent(self):
        c = self.client(gateway=True)
        s = c.create("Once")
        self.gw.moved[s.id] = grpc.StatusCode.UNAVAILABLE
        del self.gw.fallbacks[:]
        with self.assertRaises(echokv.Unavailable):
            c.fork(s.id)
        self.assertEqual(self.gw.fallbacks, [("ForkSession", None)])

    def test_plain_target_does_not_walk(self):
        c = self.client()
        s = c.create("Once")
        self.gw.moved[s.id] = grpc.StatusCode.NOT_FOUND
        del self.gw.fallbacks[:]
        with self.assertRaises(echokv.NotFound):
            c.get(s.id)
        self.assertEqual(self.gw.fallbacks, [("GetSession", None)])


if __name__ == "__main__":
    unittest.main(verbosity=2)
