#!/usr/bin/python3
"""Tests of the echokv Python client (client/python/echokv) against in-process fake
servers (fake_server.py): request encoding of the whole API (tool calls, sampling
parity fields, logprobs, memory mode, Export/Import), error mapping, retries,
deadlines and idle timeouts, owner-aware routing over three replicas, TLS / mTLS /
bearer tokens, and Memory — sync and asyncio.

    /usr/bin/python3 tests/client/python/client_fake_test.py --client client/python

The real server is exercised by client_server_test.py; this file covers what the
server does not offer yet (replica-prefixed ids, owner hints, Export/Import, logprobs,
TLS, tokens) and failures a real server cannot be made to produce on demand.
"""

import argparse
import asyncio
import io
import json
import os
import socket
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "testdata")

if __name__ == "__main__":
    _parser = argparse.ArgumentParser()
    _parser.add_argument("--client", help="folder holding the echokv package (client/python)")
    _args, _rest = _parser.parse_known_args()
    if _args.client:
        sys.path.insert(0, _args.client)
    sys.argv[1:] = _rest

import grpc  # noqa: E402

import echokv  # noqa: E402
from echokv.v1 import echokv_pb2 as pb  # noqa: E402
from fake_server import FakeReplica, render_chat, text_ids  # noqa: E402

FAST = echokv.RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.002)
HEX = "0123456789abcdef" * 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeTestCase(unittest.TestCase):
    def start(self, **kwargs):
        fake = FakeReplica(**kwargs).start()
        self.addCleanup(fake.stop)
        return fake

    def client(self, target, **kwargs):
        kwargs.setdefault("retry", FAST)
        client = echokv.Client(target, **kwargs)
        self.addCleanup(client.close)
        return client


class RequestEncodingTest(FakeTestCase):
    """Each client argument reaches the server as the proto field it names."""

    def test_create_generate_commit_round_trip(self):
        fake = self.start()
        client = self.client(fake.address)
        events = []
        session = client.create("hello", policy="echokv", budget=4, memory="evict",
                                ttl_seconds=60, on_progress=events.append)
        self.assertIsInstance(session, echokv.Session)
        self.assertEqual(session.tokens_seen, 5)
        self.assertEqual(session.compression, echokv.CompressionConfig(
            policy="echokv", budget=4, memory="evict"))
        self.assertEqual(session.memory, "evict")
        self.assertEqual(session.ttl_seconds, 60)
        self.assertEqual(events, [echokv.Progress("prefill", 5, 5, 0.0)])
        self.assertIsNone(session.owner)

        stream = client.generate(session.id, max_tokens=3, commit=True)
        deltas = list(stream)
        last = ord("o")
        expected = [(last + 1 + i) % 256 for i in range(3)]
        self.assertEqual([d.token_ids for d in deltas], [(t,) for t in expected])
        result = stream.result
        self.assertEqual(result.token_ids, tuple(expected))
        self.assertEqual(result.text, "".join(chr(ord("a") + t % 26) for t in expected))
        self.assertEqual(result.finish_reason, "length")
        self.assertEqual(result.generated_tokens, 3)
        self.assertEqual(result.prompt_tokens, 5)
        self.assertEqual(result.session.tokens_seen, 8)
        self.assertEqual(client.get(session.id).tokens_seen, 8)

    def test_sampling_parity_fields_and_logprobs(self):
        fake = self.start()
        client = self.client(fake.address)
        session = client.create(ids=[1, 2, 3])
        result = client.generate(
            session.id, max_tokens=2, temperature=0.7, top_p=0.9, top_k=5, seed=11,
            min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=-0.5,
            top_logprobs=3, stop=["zz"], stop_token_ids=[7], ignore_eos=True).collect()
        self.assertEqual(len(result.logprobs), 2)
        self.assertEqual(result.logprobs[0], echokv.TokenLogprob(4, -0.5, (
            echokv.TopLogprob(4, -0.5), echokv.TopLogprob(5, -1.5), echokv.TopLogprob(6, -2.5))))
        # top_logprobs alone turns logprobs on; unset sampling fields stay unset.
        request = echokv._requests.generate_request("x", top_logprobs=2, temperature=None)
        self.assertTrue(request.sampling.logprobs)
        self.assertFalse(request.sampling.HasField("temperature"))
        request = echokv._requests.generate_request(
            "x", min_p=0.1, repetition_penalty=1.2, presence_penalty=0.3,
            frequency_penalty=0.4, seed=9)
        self.assertAlmostEqual(request.sampling.min_p, 0.1, places=6)
        self.assertAlmostEqual(request.sampling.repetition_penalty, 1.2, places=6)
        self.assertAlmostEqual(request.sampling.presence_penalty, 0.3, places=6)
        self.assertAlmostEqual(request.sampling.frequency_penalty, 0.4, places=6)
        self.assertEqual(request.sampling.seed, 9)
        self.assertFalse(request.sampling.logprobs)
        with self.assertRaisesRegex(TypeError, "tempreature"):
            echokv._requests.generate_request("x", tempreature=1.0)

    def test_chat_tool_calls_and_tools(self):
        fake = self.start()
        client = self.client(fake.address)
        tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
        chat = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
            echokv.ChatMessage(role="tool", content="sunny", tool_call_id="c1", name="weather"),
        ]
        session = client.create(chat=chat, tools=tools, add_generation_prompt=True)
        sent = fake.last_chat
        self.assertEqual(json.loads(sent.tools_json), tools)
        self.assertTrue(sent.add_generation_prompt)
        call = sent.messages[1].tool_calls[0]
        self.assertEqual((call.id, call.type, call.function_name, json.loads(call.arguments_json)),
                         ("c1", "function", "weather", {"city": "Paris"}))
        self.assertEqual((sent.messages[2].tool_call_id, sent.messages[2].name), ("c1", "weather"))
        self.assertEqual(session.tokens_seen, len(render_chat(sent)))
        # The OpenAI dict survives a round trip through ChatMessage.
        self.assertEqual(echokv.ChatMessage.of(chat[1]).to_dict()["tool_calls"][0]["function"],
                         {"name": "weather", "arguments": '{"city": "Paris"}'})

    def test_bad_arguments_fail_before_sending(self):
        fake = self.start()
        client = self.client(fake.address)
        with self.assertRaisesRegex(ValueError, "exactly one of text=, ids=, chat= \\(got text, ids\\)"):
            client.create("a", ids=[1])
        with self.assertRaisesRegex(ValueError, "got none"):
            client.create()
        with self.assertRaisesRegex(TypeError, "unknown compression field\\(s\\) budgt"):
            client.create("a", budgt=3)
        with self.assertRaisesRegex(ValueError, "chat\\[1\\] needs a 'role'"):
            client.create(chat=[{"role": "user", "content": "a"}, {"content": "b"}])
        with self.assertRaisesRegex(ValueError, "tools= and add_generation_prompt= apply to chat"):
            client.create("a", tools=[])
        with self.assertRaisesRegex(ValueError, "timeout must be a positive number"):
            client.get("x", timeout=0)
        with self.assertRaisesRegex(ValueError, "RetryPolicy.max_attempts"):
            echokv.RetryPolicy(max_attempts=0)
        with self.assertRaisesRegex(ValueError, "both certificate_chain and private_key"):
            echokv.TLS(certificate_chain=b"x")
        self.assertEqual(fake.methods(), [])

    def test_fork_list_inspect_delete_compress_info_health(self):
        fake = self.start()
        client = self.client(fake.address)
        a = client.create("abcdef")
        b = client.fork(a.id, ttl_seconds=5)
        self.assertNotEqual(a.id, b.id)
        self.assertEqual((b.tokens_seen, b.ttl_seconds), (6, 5))
        self.assertEqual(sorted(s.id for s in client.list()), sorted([a.id, b.id]))
        inspection = client.inspect(a.id, positions=True)
        self.assertIsInstance(inspection, echokv.CacheInspection)
        self.assertEqual(inspection.layers[0].groups[0].positions, (2, 3, 4, 5))
        self.assertEqual(client.delete(b.id), 32)
        with self.assertRaises(echokv.NotFound):
            client.get(b.id)
        self.assertEqual(client.compress("xyz", policy="full").context_tokens, 3)
        self.assertEqual(client.info().version, "fake")
        self.assertEqual(client.health(), "SERVING")

    def test_export_import_bytes_file_iterator(self):
        fake = self.start()
        client = self.client(fake.address)
        session = client.create("snapshot me", budget=3)
        chunks = list(client.export(session.id))
        self.assertGreater(len(chunks), 3)
        blob = b"".join(chunks)
        copy = client.import_(blob)
        self.assertNotEqual(copy.id, session.id)
        self.assertEqual((copy.tokens_seen, copy.compression.budget), (11, 3))
        with self.assertRaises(echokv.AlreadyExists):
            client.import_(iter(chunks), keep_id=True)
        client.delete(session.id)
        self.assertEqual(client.import_(iter(chunks), keep_id=True, ttl_seconds=9).id, session.id)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.snap")
            self.assertEqual(client.export_to(copy.id, path), len(blob))
            self.assertEqual(client.import_(path).tokens_seen, 11)
            with open(path, "rb") as f:
                self.assertEqual(client.import_(f).tokens_seen, 11)
            # A failed export leaves no file behind (nor a .part).
            with self.assertRaises(echokv.NotFound):
                client.export_to("f" * 32, os.path.join(tmp, "missing.snap"))
            self.assertEqual(sorted(os.listdir(tmp)), ["s.snap"])
        buffer = io.BytesIO()
        client.export_to(copy.id, buffer)
        self.assertEqual(len(buffer.getvalue()), len(blob))
        corrupt = bytearray(blob)
        corrupt[-2] ^= 1
        with self.assertRaises(echokv.DataLoss):
            client.import_(bytes(corrupt))
        with self.assertRaises(FileNotFoundError):
            client.import_(os.path.join(HERE, "no-such-snapshot"))


class ErrorMappingTest(FakeTestCase):
    def test_every_code_maps_to_its_class(self):
        fake = self.start()
        client = self.client(fake.address, retry=False)
        session = client.create("x")
        cases = [
            (grpc.StatusCode.CANCELLED, echokv.Cancelled),
            (grpc.StatusCode.UNKNOWN, echokv.UnknownError),
            (grpc.StatusCode.INVALID_ARGUMENT, echokv.InvalidArgument),
            (grpc.StatusCode.DEADLINE_EXCEEDED, echokv.DeadlineExceeded),
            (grpc.StatusCode.NOT_FOUND, echokv.NotFound),
            (grpc.StatusCode.ALREADY_EXISTS, echokv.AlreadyExists),
            (grpc.StatusCode.PERMISSION_DENIED, echokv.PermissionDenied),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, echokv.ResourceExhausted),
            (grpc.StatusCode.FAILED_PRECONDITION, echokv.FailedPrecondition),
            (grpc.StatusCode.ABORTED, echokv.Aborted),
            (grpc.StatusCode.OUT_OF_RANGE, echokv.OutOfRange),
            (grpc.StatusCode.UNIMPLEMENTED, echokv.Unimplemented),
            (grpc.StatusCode.INTERNAL, echokv.InternalError),
            (grpc.StatusCode.UNAVAILABLE, echokv.Unavailable),
            (grpc.StatusCode.DATA_LOSS, echokv.DataLoss),
            (grpc.StatusCode.UNAUTHENTICATED, echokv.Unauthenticated),
        ]
        for code, cls in cases:
            with self.subTest(code=code.name):
                for method, call in (("GetSession", lambda: client.get(session.id)),
                                     ("Generate", lambda: client.generate(session.id).collect())):
                    fake.fail_next(method, code, "the message for " + code.name)
                    with self.assertRaises(cls) as caught:
                        call()
                    e = caught.exception
                    self.assertIs(type(e), cls)
                    self.assertIsInstance(e, echokv.EchoKVError)
                    self.assertEqual(e.code, code)
                    self.assertEqual(e.message, "the message for " + code.name)
                    self.assertEqual(str(e), "%s: the message for %s" % (code.name, code.name))

    def test_busy_and_owner(self):
        fake = self.start()
        client = self.client(fake.address)
        session = client.create("x")
        fake.fail_next("AppendToSession", grpc.StatusCode.FAILED_PRECONDITION,
                       "session %s is busy: another mutation" % session.id)
        with self.assertRaises(echokv.SessionBusy) as caught:
            client.append(session.id, "y")
        self.assertIsInstance(caught.exception, echokv.FailedPrecondition)
        fake.fail_next("ImportSession", grpc.StatusCode.FAILED_PRECONDITION,
                       "snapshot is from a different model")
        with self.assertRaises(echokv.FailedPrecondition) as caught:
            client.import_(b"whatever")
        self.assertIsNot(type(caught.exception), echokv.SessionBusy)
        # A NOT_FOUND naming an owner the client cannot address keeps the hint.
        fake.owner_hint[session.id] = "elsewhere-3"
        with self.assertRaises(echokv.NotFound) as caught:
            client.get(session.id)
        self.assertEqual(caught.exception.owner, "elsewhere-3")

    def test_stream_without_final_is_a_protocol_error(self):
        # Streams that end without their last message (a Session / a final): the
        # wrappers are fed canned messages, no server involved.
        stream = echokv.client.SessionStream(_FakeStream([pb.SessionProgress(
            progress=pb.SessionProgress.Progress(phase="prefill"))]))
        with self.assertRaises(echokv.ProtocolError):
            stream.result()
        stream = echokv.client.GenerateStream(_FakeStream([pb.GenerateResponse(text="a")]))
        with self.assertRaises(echokv.ProtocolError):
            stream.collect()


class _FakeStream:
    def __init__(self, messages):
        self._messages = messages
        self._method = "Fake"
        self.address = "nowhere"

    def messages(self):
        yield from self._messages

    def cancel(self):
        pass


class RetryTest(FakeTestCase):
    def test_idempotent_calls_retry_on_unavailable_and_deadline(self):
        fake = self.start()
        retries = []
        client = self.client(fake.address, on_retry=lambda *a: retries.append(a))
        session = client.create("x")
        idempotent = [
            ("GetServerInfo", lambda: client.info()),
            ("GetSession", lambda: client.get(session.id)),
            ("ListSessions", lambda: client.list()),
            ("InspectCache", lambda: client.inspect(session.id)),
            ("Check", lambda: client.health()),
        ]
        for method, call in idempotent:
            with self.subTest(method=method):
                fake.clear()
                del retries[:]
                fake.fail_next(method, grpc.StatusCode.UNAVAILABLE)
                fake.fail_next(method, grpc.StatusCode.DEADLINE_EXCEEDED)
                call()
                self.assertEqual(fake.methods(), [method] * 3)
                self.assertEqual([(r[0], r[1], r[2].code) for r in retries], [
                    (method, 1, grpc.StatusCode.UNAVAILABLE),
                    (method, 2, grpc.StatusCode.DEADLINE_EXCEEDED)])
                # Backoff grows and stays within the policy's jittered bounds.
                self.assertTrue(0.0008 <= retries[0][3] <= 0.0012, retries[0][3])
                self.assertTrue(0.0016 <= retries[1][3] <= 0.0024, retries[1][3])

    def test_attempts_are_bounded(self):
        fake = self.start()
        client = self.client(fake.address)
        fake.fail_next("GetServerInfo", grpc.StatusCode.UNAVAILABLE, times=10)
        with self.assertRaises(echokv.Unavailable):
            client.info()
        self.assertEqual(fake.methods(), ["GetServerInfo"] * FAST.max_attempts)

    def test_other_codes_are_not_retried(self):
        fake = self.start()
        client = self.client(fake.address)
        fake.fail_next("GetServerInfo", grpc.StatusCode.INTERNAL)
        with self.assertRaises(echokv.InternalError):
            client.info()
        self.assertEqual(fake.methods(), ["GetServerInfo"])

    def test_mutations_are_never_retried(self):
        fake = self.start()
        client = self.client(fake.address)
        session = client.create("x")
        mutations = [
            ("CreateSession", lambda: client.create("y")),
            ("AppendToSession", lambda: client.append(session.id, "y")),
            ("Generate", lambda: client.generate(session.id, commit=True).collect()),
            ("Generate", lambda: client.generate(session.id).collect()),
            ("ForkSession", lambda: client.fork(session.id)),
            ("DeleteSession", lambda: client.delete(session.id)),
            ("Compress", lambda: client.compress("y")),
            ("ImportSession", lambda: client.import_(b"x")),
            ("ExportSession", lambda: list(client.export(session.id))),
        ]
        for method, call in mutations:
            with self.subTest(method=method):
                fake.clear()
                fake.fail_next(method, grpc.StatusCode.UNAVAILABLE)
                with self.assertRaises(echokv.Unavailable):
                    call()
                self.assertEqual(fake.methods(), [method])

    def test_server_not_yet_up(self):
        """The first attempt finds nothing listening; the server starts during the
        backoff (from the on_retry hook, so no timing is involved); a later attempt
        succeeds."""
        port = free_port()
        fake = FakeReplica(port=port)
        self.addCleanup(fake.stop)
        seen = []

        def on_retry(method, attempt, error, delay):
            seen.append(error.code)
            if attempt == 1:
                fake.start()

        client = self.client(
            "127.0.0.1:%d" % port, on_retry=on_retry,
            retry=echokv.RetryPolicy(max_attempts=30, initial_backoff=0.02, max_backoff=0.2),
            channel_options=[("grpc.initial_reconnect_backoff_ms", 20),
                             ("grpc.min_reconnect_backoff_ms", 20),
                             ("grpc.max_reconnect_backoff_ms", 100)])
        self.assertEqual(client.health(), "SERVING")
        self.assertEqual(seen[0], grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(fake.methods(), ["Check"])
        # Without retries the same situation is an immediate Unavailable.
        with self.assertRaises(echokv.Unavailable):
            self.client("127.0.0.1:%d" % free_port(), retry=False).health()


class DeadlineTest(FakeTestCase):
    def test_unary_and_stream_defaults_are_separate(self):
        fake = self.start()
        client = self.client(fake.address, timeout=7.0)
        session = client.create("x")
        client.get(session.id)
        client.generate(session.id, max_tokens=1).collect()
        client.get(session.id, timeout=None)
        client.generate(session.id, max_tokens=1, timeout=3.0).collect()
        remaining = {}
        for c in fake.calls:
            remaining.setdefault(c.method, []).append(c.time_remaining)
        self.assertIsNone(remaining["CreateSession"][0])
        # (gRPC's deadline propagation rounds the remaining time up a little.)
        self.assertTrue(0 < remaining["GetSession"][0] <= 7.5, remaining)
        self.assertIsNone(remaining["GetSession"][1])
        self.assertIsNone(remaining["Generate"][0])
        self.assertTrue(0 < remaining["Generate"][1] <= 3.5, remaining)
        streaming = self.client(fake.address, stream_timeout=11.0)
        streaming.generate(session.id, max_tokens=1).collect()
        self.assertTrue(7.5 < fake.calls[-1].time_remaining <= 11.5, fake.calls[-1])

    def test_short_unary_deadline_fails_fast(self):
        fake = self.start()
        fake.hang_info = threading.Event()  # the call cannot finish within any deadline
        self.addCleanup(fake.hang_info.set)
        client = self.client(fake.address, timeout=1e-6, retry=False)
        with self.assertRaises(echokv.DeadlineExceeded):
            client.info()
        # ... while a stream on the same client has no deadline.
        session = client.create("abc")
        self.assertEqual(client.generate(session.id, max_tokens=2).collect().generated_tokens, 2)

    def test_idle_stream_is_cancelled(self):
        fake = self.start()
        fake.hang_generate = threading.Event()
        self.addCleanup(fake.hang_generate.set)
        client = self.client(fake.address, stream_idle_timeout=0.3)
        session = client.create("abc")
        stream = client.generate(session.id, max_tokens=5)
        first = next(stream)
        self.assertEqual(first.token_ids, (ord("c") + 1,))
        with self.assertRaisesRegex(echokv.DeadlineExceeded, "idle_timeout"):
            next(stream)
        self.assertTrue(fake.generate_cancelled.wait(10), "the server saw no cancellation")

    def test_slow_consumer_is_not_idle(self):
        """Time the caller spends between messages does not count as idle: a watchdog
        armed only while waiting for the server. Checked without clocks: the consumer
        blocks (on an event the test never sets) for longer than idle_timeout."""
        fake = self.start()
        client = self.client(fake.address, stream_idle_timeout=0.2)
        session = client.create("abc")
        total = 0
        for delta in client.generate(session.id, max_tokens=3):
            threading.Event().wait(0.4)  # the consumer is busy for 2x the idle timeout
            total += len(delta.token_ids)
        self.assertEqual(total, 3)

    def test_cancel(self):
        fake = self.start()
        fake.hang_generate = threading.Event()
        self.addCleanup(fake.hang_generate.set)
        client = self.client(fake.address)
        session = client.create("abc")
        stream = client.generate(session.id, max_tokens=5)
        next(stream)
        stream.cancel()
        with self.assertRaises(echokv.Cancelled):
            next(stream)
        self.assertTrue(fake.generate_cancelled.wait(10))


class RoutingTest(FakeTestCase):
    NAMES = ("echokv-0", "echokv-1", "echokv-2")

    def replicas(self):
        fakes = {name: self.start(name=name) for name in self.NAMES}
        return fakes, {name: fake.address for name, fake in fakes.items()}

    def test_every_request_of_20_sessions_reaches_its_owner(self):
        fakes, addresses = self.replicas()
        client = self.client(list(addresses.values()), replicas=addresses)
        sessions = [client.create("session %d" % i) for i in range(20)]
        owners = [s.owner for s in sessions]
        # New sessions go round robin over the targets.
        self.assertEqual(owners, [self.NAMES[i % 3] for i in range(20)])
        for s in sessions:
            client.append(s.id, " more")
            client.generate(s.id, max_tokens=2, commit=True).collect()
            client.get(s.id)
            client.inspect(s.id)
            fork = client.fork(s.id)
            self.assertEqual(fork.owner, s.owner)
            client.delete(fork.id)
            b"".join(client.export(s.id))
        for name, fake in fakes.items():
            for call in fake.calls:
                if call.method in ("CreateSession", "Check", "ListSessions"):
                    continue
                self.assertTrue(call.session_id.startswith(name + "."),
                                "%s got %s for %s" % (name, call.method, call.session_id))
                self.assertEqual(call.header, call.session_id, "x-echokv-session metadata")
            self.assertEqual(len(fake.sessions), 7 if name == "echokv-0" else
                             (7 if name == "echokv-1" else 6))
        # list() per replica.
        self.assertEqual(len(client.list(replica="echokv-2")), 6)

    def test_async_routing(self):
        fakes, addresses = self.replicas()

        async def run():
            async with echokv.AsyncClient(list(addresses.values()), replicas=addresses,
                                          retry=FAST) as client:
                sessions = [await client.create("s%d" % i) for i in range(6)]
                for s in sessions:
                    await client.append(s.id, "x")
                    await client.generate(s.id, max_tokens=1).collect()
                    await client.get(s.id)
                return sessions

        sessions = asyncio.run(run())
        self.assertEqual([s.owner for s in sessions], [self.NAMES[i % 3] for i in range(6)])
        for name, fake in fakes.items():
            ids = {c.session_id for c in fake.calls if c.method != "CreateSession"}
            self.assertEqual(ids, {s.id for s in sessions if s.owner == name})

    def test_owner_hint_is_followed_once(self):
        fakes, addresses = self.replicas()
        client = self.client(addresses["echokv-0"], replicas=addresses)
        # A session with echokv-0's prefix that echokv-1 holds (e.g. imported with keep_id).
        session = client.create("moved")
        sid = session.id
        fakes["echokv-1"].sessions[sid] = fakes["echokv-0"].sessions.pop(sid)
        fakes["echokv-0"].owner_hint[sid] = "echokv-1"
        self.assertEqual(client.get(sid).tokens_seen, 5)
        self.assertEqual([c.method for c in fakes["echokv-0"].calls],
                         ["CreateSession", "GetSession"])
        self.assertEqual([c.method for c in fakes["echokv-1"].calls], ["GetSession"])
        # The owner is remembered: later calls (streams too) go straight to echokv-1.
        client.generate(sid, max_tokens=1).collect()
        self.assertEqual(fakes["echokv-0"].methods(), ["CreateSession", "GetSession"])
        self.assertEqual(fakes["echokv-1"].methods(), ["GetSession", "Generate"])
        # A stream is redirected too (before any message), and a second hint is not
        # followed: no ping-pong.
        fakes["echokv-1"].owner_hint[sid] = "echokv-2"
        fakes["echokv-2"].owner_hint[sid] = "echokv-1"
        with self.assertRaises(echokv.NotFound) as caught:
            client.generate(sid, max_tokens=1).collect()
        self.assertEqual(caught.exception.owner, "echokv-1")
        self.assertEqual(fakes["echokv-1"].methods()[-1], "Generate")
        self.assertEqual(fakes["echokv-2"].methods(), ["Generate"])

    def test_unprefixed_sessions_stick_to_their_creator(self):
        a, b = self.start(), self.start()
        client = self.client([a.address, b.address])
        s1, s2 = client.create("one"), client.create("two")
        client.get(s1.id)
        client.get(s2.id)
        self.assertEqual(a.methods(), ["CreateSession", "GetSession"])
        self.assertEqual(b.methods(), ["CreateSession", "GetSession"])

    def test_headless_service_addresses(self):
        router = echokv.Router(headless_service="echokv-headless.ns.svc.cluster.local",
                               port=50051)
        self.assertEqual(router.for_session("echokv-2." + HEX),
                         "echokv-2.echokv-headless.ns.svc.cluster.local:50051")
        self.assertEqual(router.for_new(), "dns:///echokv-headless.ns.svc.cluster.local:50051")
        self.assertEqual(router.for_session(HEX), router.for_new())
        self.assertEqual(echokv.session_owner("echokv-2." + HEX), "echokv-2")
        self.assertIsNone(echokv.session_owner(HEX))
        self.assertIsNone(echokv.session_owner("Echokv-2." + HEX))  # not a DNS label
        self.assertIsNone(echokv.session_owner("echokv-2." + HEX[:-1]))
        with self.assertRaisesRegex(ValueError, "not a DNS label"):
            echokv.Router(replicas={"Bad_Name": "x:1"})
        with self.assertRaisesRegex(ValueError, "give a target"):
            echokv.Router()
        # An explicit map wins over the headless Service.
        router = echokv.Router(replicas={"echokv-2": "10.0.0.9:1"}, headless_service="h.ns")
        self.assertEqual(router.for_session("echokv-2." + HEX), "10.0.0.9:1")
        self.assertEqual(router.for_session("echokv-5." + HEX), "echokv-5.h.ns:50051")

    def test_replica_argument(self):
        fakes, addresses = self.replicas()
        client = self.client(addresses["echokv-0"], replicas=addresses)
        self.assertEqual(client.create("x", replica="echokv-2").owner, "echokv-2")
        self.assertEqual(client.info(replica="echokv-1").replica_id, "echokv-1")
        with self.assertRaisesRegex(ValueError, "replica 'nope'"):
            client.info(replica="nope")


class SecurityTest(FakeTestCase):
    def read(self, name):
        with open(os.path.join(TESTDATA, name), "rb") as f:
            return f.read()

    def tls_fake(self, require_client_auth, **kwargs):
        credentials = grpc.ssl_server_credentials(
            [(self.read("server.key"), self.read("server.pem"))],
            root_certificates=self.read("ca.pem") if require_client_auth else None,
            require_client_auth=require_client_auth)
        return self.start(server_credentials=credentials, **kwargs)

    def test_tls_with_root_ca(self):
        fake = self.tls_fake(False)
        client = self.client("localhost:%d" % fake.port,
                             tls=echokv.TLS(root_certificates=os.path.join(TESTDATA, "ca.pem")))
        self.assertEqual(client.health(), "SERVING")
        # The name in the certificate, reached through an IP address it does not list
        # under that name: server_name overrides the check.
        client = self.client("127.0.0.1:%d" % fake.port, tls=echokv.TLS(
            root_certificates=self.read("ca.pem"), server_name="echokv.test"))
        self.assertEqual(client.info().version, "fake")
        # A CA that did not sign the server's certificate: the handshake fails.
        client = self.client("localhost:%d" % fake.port, retry=False, tls=echokv.TLS(
            root_certificates=self.read("other_ca.pem")))
        with self.assertRaises(echokv.Unavailable):
            client.info()
        # Plaintext against a TLS server fails too.
        with self.assertRaises(echokv.Unavailable):
            self.client("localhost:%d" % fake.port, retry=False).info()

    def test_mutual_tls(self):
        fake = self.tls_fake(True)
        ca = os.path.join(TESTDATA, "ca.pem")
        client = self.client("localhost:%d" % fake.port, tls=echokv.TLS(
            root_certificates=ca, certificate_chain=os.path.join(TESTDATA, "client.pem"),
            private_key=os.path.join(TESTDATA, "client.key")))
        self.assertEqual(client.health(), "SERVING")
        no_cert = self.client("localhost:%d" % fake.port, retry=False,
                              tls=echokv.TLS(root_certificates=ca))
        with self.assertRaises(echokv.Unavailable):
            no_cert.health()

    def test_bearer_token(self):
        fake = self.tls_fake(False, token="s3cret")
        tls = echokv.TLS(root_certificates=self.read("ca.pem"))
        client = self.client("localhost:%d" % fake.port, tls=tls, token="s3cret")
        session = client.create("x")
        client.generate(session.id, max_tokens=1).collect()
        self.assertEqual({c.authorization for c in fake.calls}, {"Bearer s3cret"})
        with self.assertRaises(echokv.Unauthenticated) as caught:
            self.client("localhost:%d" % fake.port, tls=tls, token="wrong").get(session.id)
        self.assertIn("bearer token", caught.exception.message)
        with self.assertRaises(echokv.Unauthenticated):
            self.client("localhost:%d" % fake.port, tls=tls).info()
        tokens = iter(["s3cret", "s3cret"])
        refreshing = self.client("localhost:%d" % fake.port, tls=tls, token=lambda: next(tokens))
        self.assertEqual(refreshing.info().version, "fake")


class AsyncClientTest(FakeTestCase):
    def test_surface(self):
        fake = self.start()
        fake.fail_next("GetSession", grpc.StatusCode.UNAVAILABLE)

        async def run():
            async with echokv.AsyncClient(fake.address, retry=FAST, timeout=5) as client:
                self.assertEqual(await client.health(), "SERVING")
                self.assertEqual((await client.info()).version, "fake")
                events = []

                async def on_progress(p):
                    events.append(p)

                session = await client.create("hello", budget=2, on_progress=on_progress)
                self.assertEqual(events[0].phase, "prefill")
                stream = client.create_stream(ids=[1, 2])
                phases = [p.phase async for p in stream]
                self.assertEqual((phases, stream.session.tokens_seen), (["prefill"], 2))
                session = await client.append(session.id, " you")
                self.assertEqual(session.tokens_seen, 9)
                stream = client.generate(session.id, max_tokens=3, logprobs=True, commit=True)
                deltas = [d async for d in stream]
                self.assertEqual(len(deltas), 3)
                self.assertEqual(len(stream.result.logprobs), 3)
                self.assertEqual(stream.result.session.tokens_seen, 12)
                self.assertEqual((await client.get(session.id)).tokens_seen, 12)  # retried
                fork = await client.fork(session.id)
                self.assertEqual(len(await client.list()), 3)
                self.assertEqual((await client.inspect(fork.id)).total_retained_entries, 4)
                self.assertEqual((await client.compress("abcd")).context_tokens, 4)
                blob = b"".join([c async for c in client.export(session.id)])

                async def chunks():
                    for i in range(0, len(blob), 5):
                        yield blob[i:i + 5]

                copy = await client.import_(chunks())
                self.assertEqual(copy.tokens_seen, 12)
                self.assertEqual((await client.import_(blob)).tokens_seen, 12)
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "s")
                    self.assertEqual(await client.export_to(copy.id, path), len(blob))
                    self.assertEqual((await client.import_(path)).tokens_seen, 12)
                self.assertEqual(await client.delete(fork.id), 32)
                with self.assertRaises(echokv.NotFound):
                    await client.get(fork.id)
                with self.assertRaises(echokv.NotFound):
                    await client.generate(fork.id).collect()
                fake.fail_next("Generate", grpc.StatusCode.RESOURCE_EXHAUSTED, "max_concurrent_streams")
                with self.assertRaises(echokv.ResourceExhausted) as caught:
                    await client.generate(session.id).text()
                self.assertEqual(caught.exception.message, "max_concurrent_streams")

        asyncio.run(run())
        # get(session) failed once with UNAVAILABLE and was retried; get(fork) NotFound.
        self.assertEqual(fake.methods().count("GetSession"), 3)

    def test_deadlines_and_idle_timeout(self):
        fake = self.start()
        fake.hang_generate = threading.Event()
        self.addCleanup(fake.hang_generate.set)
        fake.hang_info = threading.Event()
        self.addCleanup(fake.hang_info.set)

        async def run():
            async with echokv.AsyncClient(fake.address, retry=False, timeout=1e-6,
                                          stream_idle_timeout=0.3) as client:
                with self.assertRaises(echokv.DeadlineExceeded):
                    await client.info()
                session = await client.create("abc")  # streams ignore the unary deadline
                stream = client.generate(session.id, max_tokens=4)
                await stream.__anext__()
                with self.assertRaisesRegex(echokv.DeadlineExceeded, "idle_timeout"):
                    await stream.__anext__()

        asyncio.run(run())
        self.assertTrue(fake.generate_cancelled.wait(10))

    def test_cancel(self):
        fake = self.start()
        fake.hang_generate = threading.Event()
        self.addCleanup(fake.hang_generate.set)
        fake.hang_info = threading.Event()
        self.addCleanup(fake.hang_info.set)

        async def run():
            async with echokv.AsyncClient(fake.address) as client:
                session = await client.create("abc")
                stream = client.generate(session.id, max_tokens=4)
                await stream.__anext__()
                stream.cancel()
                with self.assertRaises(echokv.Cancelled):
                    await stream.__anext__()

        asyncio.run(run())
        self.assertTrue(fake.generate_cancelled.wait(10))


class MemoryTest(FakeTestCase):
    def test_add_ask_fork_export_import(self):
        fake = self.start()
        client = self.client(fake.address)
        memory = echokv.Memory(client, compression={"policy": "echokv", "budget": 64},
                               generate={"max_tokens": 3})
        self.assertIsNone(memory.session_id)
        memory.add([{"role": "system", "content": "Be terse."}, "My name is Ada."])
        self.assertEqual(fake.methods(), ["CreateSession"])
        self.assertFalse(fake.last_chat.add_generation_prompt)
        created = fake.sessions[memory.session_id]
        self.assertEqual((created["compression"].policy, created["compression"].budget,
                          created["compression"].memory), ("echokv", 64, "tiered"))
        memory.add({"role": "assistant", "content": "Hello Ada."})
        self.assertEqual(fake.methods(), ["CreateSession", "AppendToSession"])

        before = list(fake.sessions[memory.session_id]["ids"])
        answer = memory.ask("What is my name?")
        pieces = list(answer)
        self.assertEqual(fake.methods()[2:], ["AppendToSession", "Generate"])
        self.assertEqual([m.role for m in fake.last_chat.messages], ["user"])
        self.assertTrue(fake.last_chat.add_generation_prompt)
        question_ids = text_ids("user: What is my name?\nassistant:")
        expected = [(question_ids[-1] + 1 + i) % 256 for i in range(3)]
        self.assertEqual("".join(pieces), "".join(chr(ord("a") + t % 26) for t in expected))
        # commit=True: the answer is in the session.
        self.assertEqual(fake.sessions[memory.session_id]["ids"], before + question_ids + expected)
        self.assertEqual(answer.result.session.tokens_seen, len(before) + len(question_ids) + 3)
        self.assertEqual([m["role"] for m in memory.messages],
                         ["system", "user", "assistant", "user", "assistant"])
        self.assertEqual(memory.messages[-1]["content"], "".join(pieces))
        self.assertEqual(memory.ask("Again?", stream=False, max_tokens=1), chr(
            ord("a") + (text_ids("user: Again?\nassistant:")[-1] + 1) % 26))

        branch = memory.fork()
        self.assertNotEqual(branch.session_id, memory.session_id)
        self.assertEqual(branch.messages, memory.messages)
        branch.add("Only in the branch.")
        self.assertEqual(len(branch.messages), len(memory.messages) + 1)

        snapshot = memory.export()
        restored = echokv.Memory.import_(client, snapshot)
        self.assertEqual(restored.session().tokens_seen, memory.session().tokens_seen)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "memory.snap")
            self.assertEqual(memory.export(path), len(snapshot))
            self.assertEqual(echokv.Memory.import_(client, path).session().tokens_seen,
                             memory.session().tokens_seen)
        memory.delete()
        self.assertIsNone(memory.session_id)
        with self.assertRaisesRegex(ValueError, "no session yet"):
            memory.fork()

    def test_ask_first_creates_the_session(self):
        fake = self.start()
        client = self.client(fake.address)
        memory = echokv.Memory(client, memory="evict")
        text = memory.ask("Hi?", stream=False, max_tokens=2)
        self.assertEqual(len(text), 2)
        self.assertEqual(fake.methods(), ["CreateSession", "Generate"])
        self.assertTrue(fake.last_chat.add_generation_prompt)
        self.assertEqual(fake.sessions[memory.session_id]["compression"].memory, "evict")

    def test_async_memory(self):
        fake = self.start()

        async def run():
            async with echokv.AsyncClient(fake.address) as client:
                memory = echokv.AsyncMemory(client, generate={"max_tokens": 2})
                await memory.add("I like tea.")
                pieces = [p async for p in await memory.ask("What do I like?")]
                self.assertEqual(len(pieces), 2)
                branch = await memory.fork()
                snapshot = await memory.export()
                restored = await echokv.AsyncMemory.import_(client, snapshot)
                self.assertEqual((await restored.session()).tokens_seen,
                                 (await memory.session()).tokens_seen)
                answer = await branch.ask("Tea?", stream=False, max_tokens=1)
                self.assertEqual(len(answer), 1)
                self.assertEqual(branch.messages[-1], {"role": "assistant", "content": answer})
                self.assertEqual(len(branch.messages), len(memory.messages) + 2)
                return memory

        memory = asyncio.run(run())
        self.assertEqual([m["role"] for m in memory.messages], ["user", "user", "assistant"])
        self.assertEqual(fake.methods()[:4], ["CreateSession", "AppendToSession", "Generate",
                                              "ForkSession"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
