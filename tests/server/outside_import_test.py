#!/usr/bin/python3
"""ImportSession and error messages as a client or an attacker meets them (issue 25
points 6, 7 and 8), against the real echokv-server on stories260K with two tenants (a
tokens file), over gRPC only:

  6  every client string a refusal names (compression.policy, .bootstrap, .memory on
     CreateSession and Compress, a stop string, a session id on each RPC that takes one,
     chat role / name / tool_call_id / tools) is sent as a 1 MB value: the call fails
     with INVALID_ARGUMENT where the value is refused (never the RESOURCE_EXHAUSTED a
     stock client reports for an oversized status message) and every message is short.
  7  tenant B rewrites the id in its own exported snapshot to tenant A's live id, to A's
     deleted id, to an id B made up, recomputes every checksum and imports with keep_id:
     each answer is ALREADY_EXISTS with the message B gets for its own taken id (the id
     aside), so nothing tells A's ids from others; B's own id, once free, is kept.
  8  forged snapshots with recomputed checksums are refused with INVALID_ARGUMENT naming
     the field, on an in-memory and on a durable server (--state-dir): a ttl of 10^9 s
     (max_session_ttl is 24 h; with a header ttl_seconds of 60 the same bytes import), a
     budget of 0, an out-of-vocabulary token id, kept positions past the tokens, kept
     positions not strictly increasing, and evict-mode K of the wrong shape. Nothing is
     created by any of them: the tenant's sessions are unchanged, no session directory
     appears, and none comes back after a restart. The unforged snapshot, re-encoded by
     the same code, imports and continues with the original's greedy tokens (the forger
     is right, so a refusal is the check's).

The snapshot stream is re-encoded from docs/ARCHITECTURE.md's tables ("Snapshot
stream", "Manifest file", "Segment file"; tests/server/state_format_oracle.py reads the
same), checksums XXH3-64 (python3-xxhash).

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 tests/server/outside_import_test.py \\
        --server-binary build/bin/echokv-server --client client/python

Needs $ECHOKV_TEST_DATA (models/stories260K); exits 77 (ctest: skipped) when unset.
No assertion depends on timing: waits poll with a generous ceiling against hangs.
"""

import hashlib
import json
import os
import struct
import sys
import tempfile
import unittest

import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MB = 1 << 20
SHORT = 300  # longest message allowed back for a 1 MB value
STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside."
TOKENS = {"alice": "token-of-alice", "bob": "token-of-bob"}
DTYPES = {1: 4, 2: 2, 3: 2, 4: 8, 5: 1, 6: 1, 7: 4, 8: 8, 9: 1}  # dtype code -> bytes

ARGS = None
echokv = None
grpc = None
pb = None
pb_grpc = None


def h64(b):
    return xxhash.xxh3_64_intdigest(b)


def align(n, a):
    return (n + a - 1) // a * a


class Snapshot:
    """A parsed snapshot stream that re-encodes itself with fresh checksums."""

    def __init__(self, data):
        b = bytes(data)
        assert b[0:8] == b"ECHOKVSN", "snapshot magic"
        (self.version, self.flags, self.fp_lo, self.fp_hi, mbytes, nseg, _, _) = struct.unpack_from(
            "<IIQQQQQQ", b, 8)
        m = b[64:64 + mbytes]
        assert m[0:8] == b"ECHOKVMF", "manifest magic"
        self.m_version, self.m_flags = struct.unpack_from("<II", m, 8)
        json_len, ntok = struct.unpack_from("<QQ", m, 32)
        self.doc = json.loads(m[64:64 + json_len].decode("utf-8"))
        self.tokens = list(struct.unpack_from("<%di" % ntok, m, 64 + align(json_len, 4)))
        pos = 64 + mbytes
        self.segments = []
        for entry in self.doc["segments"]:
            seg = b[pos:pos + entry["file_bytes"]]
            pos += entry["file_bytes"]
            fields = list(struct.unpack_from("<IIQQQqqIIQQQQ", seg, 8))
            tbytes, poff, plen = fields[8], fields[9], fields[10]
            table = seg[128:128 + tbytes]
            payload = bytearray(seg[poff:poff + plen])
            blobs, p = [], 0
            for _ in range(fields[7]):
                (nlen,) = struct.unpack_from("<H", table, p)
                name = table[p + 2:p + 2 + nlen].decode("ascii")
                p += 2 + nlen
                dtype, rank = table[p], table[p + 1]
                p += 2
                dims = list(struct.unpack_from("<%dq" % rank, table, p))
                p += 8 * rank
                off, nbytes = struct.unpack_from("<QQ", table, p)
                p += 16
                blobs.append({"name": name, "dtype": dtype, "dims": dims, "data": bytes(payload[off:off + nbytes])})
            self.segments.append({"fields": fields, "blobs": blobs})
        assert b[pos:pos + 8] == b"ECHOKVEN" and len(b) == pos + 32, "trailer"

    def blob(self, name):
        """The newest segment's blob `name` (what the loader uses for hot.*)."""
        found = None
        for seg in self.segments:
            for blob in seg["blobs"]:
                if blob["name"] == name:
                    found = blob
        assert found is not None, name
        return found

    def encode(self):
        segs = []
        for seg, entry in zip(self.segments, self.doc["segments"]):
            table, payload = b"", b""
            for blob in seg["blobs"]:
                count = 1
                for d in blob["dims"]:
                    count *= d
                assert len(blob["data"]) == count * DTYPES[blob["dtype"]], blob["name"]
                off = align(len(payload), 64)
                payload += b"\0" * (off - len(payload)) + blob["data"]
                name = blob["name"].encode("ascii")
                table += struct.pack("<H", len(name)) + name + bytes([blob["dtype"], len(blob["dims"])])
                table += struct.pack("<%dq" % len(blob["dims"]), *blob["dims"])
                table += struct.pack("<QQ", off, len(blob["data"]))
            f = list(seg["fields"])
            poff = align(128 + len(table), 64)
            f[7], f[8], f[9], f[10], f[11], f[12] = len(seg["blobs"]), len(table), poff, len(payload), h64(
                payload), h64(table)
            head = b"ECHOKVSG" + struct.pack("<IIQQQqqIIQQQQ", *f)
            head += b"\0" * (120 - len(head))
            hsum = h64(head)
            head += struct.pack("<Q", hsum)
            data = head + table + b"\0" * (poff - 128 - len(table)) + payload
            entry["payload_bytes"], entry["file_bytes"] = len(payload), len(data)
            entry["payload_xxh3"], entry["header_xxh3"] = "%016x" % h64(payload), "%016x" % hsum
            segs.append(data)
        text = json.dumps(self.doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")
        mhead = b"ECHOKVMF" + struct.pack("<IIQQQQQ", self.m_version, self.m_flags, self.fp_lo, self.fp_hi,
                                          len(text), len(self.tokens), 0)
        mhead += struct.pack("<Q", h64(mhead))
        body = text + b"\0" * (align(len(text), 4) - len(text)) + struct.pack("<%di" % len(self.tokens),
                                                                               *self.tokens)
        manifest = mhead + body + struct.pack("<Q", h64(body))
        shead = b"ECHOKVSN" + struct.pack("<IIQQQQQ", self.version, self.flags, self.fp_lo, self.fp_hi,
                                          len(manifest), len(segs), 0)
        shead += struct.pack("<Q", h64(shead))
        out = shead + manifest + b"".join(segs)
        trailer = b"ECHOKVEN" + struct.pack("<QQ", len(out), h64(out))
        return out + trailer + struct.pack("<Q", h64(trailer))


def int64s(blob):
    return list(struct.unpack("<%dq" % (len(blob["data"]) // 8), blob["data"]))


def set_int64s(blob, values):
    blob["data"] = struct.pack("<%dq" % len(values), *values)


class Server(harness.Server):
    """echokv-server on loopback with the two tenants; ports from --port-file."""

    def __init__(self, work, name, extra=()):
        super().__init__(ARGS.server_binary, ARGS.model, insecure=False, metrics=False, http=False, work=work,
                         name=name, poll_s=0.02,
                         extra=["--auth-tokens-file", ARGS.tokens_file, "--replica-id", "r1"] + list(extra))

    def start(self):
        super().start()
        self.port = self.grpc_port
        self.clients = {t: echokv.Client(self.address, token=tok, retry=False, timeout=60, stream_timeout=60)
                        for t, tok in TOKENS.items()}
        self.channel = grpc.insecure_channel(self.address, options=[("grpc.max_send_message_length", 16 * MB)])
        self.stub = pb_grpc.EchoKVStub(self.channel)
        return self

    def stop(self):
        for c in self.clients.values():
            c.close()
        self.channel.close()
        super().stop(check_exit=False)

    def restart(self):
        self.stop()
        self.start()


def metadata(tenant):
    return [("authorization", "Bearer " + TOKENS[tenant])]


class OutsideTestCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory(prefix="echokv-outside-")
        cls.state = os.path.join(cls.work.name, "state")
        # A chat template, so that chat fields reach the renderer (stories260K has none).
        cls.memory = Server(cls.work.name, "memory", ["--chat-template", "builtin:qwen2.5"])
        cls.durable = Server(cls.work.name, "durable", ["--state-dir", cls.state])

    @classmethod
    def tearDownClass(cls):
        cls.memory.stop()
        cls.durable.stop()
        cls.work.cleanup()

    def session_dirs(self):
        return sorted(os.listdir(os.path.join(self.state, "sessions")))

    def ids(self, server, tenant):
        return sorted(s.id for s in server.clients[tenant].list())

    # ---- 6: client strings in messages ----

    def call(self, fn, may_succeed=False):
        """(code, message) of a failing gRPC call (OK, "" when it may succeed)."""
        try:
            result = fn()
            if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
                for _ in result:
                    pass
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
        if not may_succeed:
            self.fail("the call succeeded")
        return grpc.StatusCode.OK, ""

    def test_6_huge_client_strings_are_echoed_short(self):
        server = self.memory
        huge = "x" * MB
        md = metadata("alice")
        session = server.clients["alice"].create(STORY, budget=8)

        def create(**compression):
            return server.stub.CreateSession(pb.CreateSessionRequest(
                input=pb.Input(text=STORY), compression=pb.CompressionConfig(**compression)), metadata=md)

        def compress(**compression):
            return server.stub.Compress(pb.CompressRequest(
                input=pb.Input(text=STORY), compression=pb.CompressionConfig(**compression)), metadata=md)

        refused = {
            "CreateSession compression.policy": lambda: create(policy=huge),
            "CreateSession compression.bootstrap": lambda: create(bootstrap=huge),
            "CreateSession compression.memory": lambda: create(memory=huge),
            "Compress compression.policy": lambda: compress(policy=huge),
            "Compress compression.bootstrap": lambda: compress(bootstrap=huge),
            "Generate stop[0]": lambda: server.stub.Generate(pb.GenerateRequest(
                session_id=session.id, max_tokens=2, stop=[huge]), metadata=md),
            "GetSession session_id": lambda: server.stub.GetSession(
                pb.GetSessionRequest(session_id=huge), metadata=md),
            "DeleteSession session_id": lambda: server.stub.DeleteSession(
                pb.DeleteSessionRequest(session_id=huge), metadata=md),
            "InspectCache session_id": lambda: server.stub.InspectCache(
                pb.InspectCacheRequest(session_id=huge), metadata=md),
            "AppendToSession session_id": lambda: server.stub.AppendToSession(pb.AppendToSessionRequest(
                session_id=huge, input=pb.Input(text="x")), metadata=md),
            "Generate session_id": lambda: server.stub.Generate(
                pb.GenerateRequest(session_id=huge, max_tokens=2), metadata=md),
            "ForkSession session_id": lambda: server.stub.ForkSession(
                pb.ForkSessionRequest(session_id=huge), metadata=md),
            "ExportSession session_id": lambda: server.stub.ExportSession(
                pb.ExportSessionRequest(session_id=huge), metadata=md),
        }
        for what, fn in refused.items():
            code, message = self.call(fn)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, "%s: %s %.200s" % (what, code, message))
            self.assertLess(len(message), SHORT, "%s: %.200s" % (what, message))
            if "stop" not in what:  # a stop string is refused by its length alone
                self.assertIn("xxxx", message, what)  # the prefix is there
        # Chat fields and tools: whatever the render or the tokenizer answers, it is short.
        chat = {
            "role": pb.ChatMessage(role=huge, content="hi"),
            "name": pb.ChatMessage(role="user", content="hi", name=huge),
            "tool_call_id": pb.ChatMessage(role="tool", content="hi", tool_call_id=huge),
            "tool_calls.function_name": pb.ChatMessage(role="assistant", content="",
                                                       tool_calls=[pb.ToolCall(function_name=huge)]),
        }
        for what, message in chat.items():
            code, text = self.call(lambda: server.stub.CreateSession(pb.CreateSessionRequest(
                input=pb.Input(chat=pb.ChatMessages(messages=[message]))), metadata=md), may_succeed=True)
            self.assertLess(len(text), SHORT, "%s: %s %.200s" % (what, code, text))
        code, text = self.call(lambda: server.stub.CreateSession(pb.CreateSessionRequest(
            input=pb.Input(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")],
                                             tools_json="[" + huge))), metadata=md), may_succeed=True)
        self.assertLess(len(text), SHORT, "tools_json: %s %.200s" % (code, text))

    # ---- 7: keep_id across tenants ----

    def test_7_keep_id_is_no_oracle_across_tenants(self):
        for server in (self.memory, self.durable):
            with self.subTest(durable=server is self.durable):
                alice, bob = server.clients["alice"], server.clients["bob"]
                a_live = alice.create(STORY, budget=8).id
                a_gone = alice.create(STORY, budget=8).id
                alice.delete(a_gone)
                b_own = bob.create(STORY, budget=8).id
                snap = b"".join(bob.export(b_own))

                def keep(session_id):
                    s = Snapshot(snap)
                    s.doc["id"] = session_id
                    try:
                        imported = bob.import_(s.encode(), keep_id=True)
                    except echokv.EchoKVError as e:
                        return e.code, e.message.replace(session_id, "<id>")
                    return "OK", imported.id

                taken = keep(b_own)
                self.assertEqual(taken[0], grpc.StatusCode.ALREADY_EXISTS, taken)
                made_up = "r1." + hashlib.sha256(b"made up").hexdigest()[:32]
                for other in (a_live, a_gone, made_up):
                    self.assertEqual(keep(other), taken, other)
                self.assertEqual(alice.get(a_live).id, a_live)
                with self.assertRaises(echokv.NotFound):
                    bob.get(a_live)
                # B's own id, once free, is B's to keep (the feature still works).
                bob.delete(b_own)
                self.assertEqual(keep(b_own), ("OK", b_own))
                self.assertEqual(bob.get(b_own).tokens_seen, alice.get(a_live).tokens_seen)

    # ---- 8: snapshot contents are checked like a CreateSession ----

    def forgeries(self, snap):
        """(what, expected substring, forged bytes, header ttl) for each forgery."""
        out = []

        def forged(edit):
            s = Snapshot(snap)
            edit(s)
            return s.encode()

        def ttl(s):
            s.doc["ttl_us"] = 10 ** 9 * 10 ** 6

        out.append(("ttl of 1e9 s", "ttl_seconds", forged(ttl), None))

        def budget(s):
            s.doc["compression"]["report"]["budget"] = 0

        out.append(("budget 0", "budget", forged(budget), None))

        def token(s):
            s.tokens[1] = 100000

        out.append(("out-of-vocabulary token", "tokens[1]", forged(token), None))

        def past_the_tokens(s):
            blob = s.blob("hot.pos.0")
            values = int64s(blob)
            values[-1] = len(s.tokens) + 5
            set_int64s(blob, values)

        out.append(("kept position past the tokens", "hot.pos.0", forged(past_the_tokens), None))

        def not_increasing(s):
            blob = s.blob("hot.pos.1")
            values = int64s(blob)
            values[1] = values[0]
            set_int64s(blob, values)

        out.append(("kept positions not increasing", "hot.pos.1", forged(not_increasing), None))
        return out

    def test_8_forged_snapshot_contents_are_refused(self):
        for server in (self.memory, self.durable):
            with self.subTest(durable=server is self.durable):
                bob = server.clients["bob"]
                source = bob.create(STORY, budget=8, policy="echokv", memory="tiered")
                greedy = bob.generate(source.id, max_tokens=6, ignore_eos=True).collect().token_ids
                snap = b"".join(bob.export(source.id))
                before = self.ids(server, "bob")
                dirs = self.session_dirs()
                for what, expected, data, header_ttl in self.forgeries(snap):
                    with self.assertRaises(echokv.InvalidArgument, msg=what) as caught:
                        bob.import_(data, ttl_seconds=header_ttl)
                    self.assertIn(expected, caught.exception.message, what)
                    self.assertEqual(self.ids(server, "bob"), before, what)
                    self.assertEqual(self.session_dirs(), dirs, what)
                # The ttl is the one that applies: the header's replaces the saved one.
                ttl_forged = self.forgeries(snap)[0][2]
                fixed = bob.import_(ttl_forged, ttl_seconds=60)
                self.assertEqual(int(fixed.ttl_seconds), 60)
                bob.delete(fixed.id)
                # The forger is right: the unforged snapshot, re-encoded, imports and
                # continues exactly as the original.
                same = bob.import_(Snapshot(snap).encode())
                self.assertEqual(bob.generate(same.id, max_tokens=6, ignore_eos=True).collect().token_ids, greedy)
                bob.delete(same.id)
        # Nothing refused comes back after a restart of the durable server.
        before = self.ids(self.durable, "bob")
        self.durable.restart()
        self.assertEqual(self.ids(self.durable, "bob"), before)

    def test_8_evict_snapshot_with_misshapen_kv_is_refused(self):
        for server in (self.memory, self.durable):
            with self.subTest(durable=server is self.durable):
                bob = server.clients["bob"]
                source = bob.create(STORY, budget=8, memory="evict")
                bob.generate(source.id, max_tokens=3, ignore_eos=True, commit=True).collect()
                snap = b"".join(bob.export(source.id))
                before = self.ids(server, "bob")

                def misshapen(s):
                    blob = s.blob("hot.k.0")
                    blob["dims"][2] //= 2  # half the head dimension
                    blob["data"] = blob["data"][:len(blob["data"]) // 2]

                s = Snapshot(snap)
                misshapen(s)
                with self.assertRaises(echokv.InvalidArgument) as caught:
                    bob.import_(s.encode())
                self.assertIn("hot.k.0", caught.exception.message)
                s = Snapshot(snap)
                blob = s.blob("hot.pos.0")
                values = int64s(blob)
                values[-1] = len(s.tokens)
                set_int64s(blob, values)
                with self.assertRaises(echokv.InvalidArgument) as caught:
                    bob.import_(s.encode())
                self.assertIn("hot.pos.0", caught.exception.message)
                self.assertEqual(self.ids(server, "bob"), before)
                ok = bob.import_(Snapshot(snap).encode())
                bob.delete(ok.id)


def main():
    global ARGS, echokv, grpc, pb, pb_grpc
    args, rest = harness.arguments(__doc__).parse_known_args()
    args.model = harness.stories260k()
    with tempfile.NamedTemporaryFile("w", prefix="echokv-tokens-", delete=False) as f:
        for tenant, token in TOKENS.items():
            f.write("%s %s\n" % (tenant, hashlib.sha256(token.encode()).hexdigest()))
        args.tokens_file = f.name
    ARGS = args
    echokv = harness.import_client(args.client)
    import grpc as grpc_module
    from echokv.v1 import echokv_pb2, echokv_pb2_grpc
    grpc, pb, pb_grpc = grpc_module, echokv_pb2, echokv_pb2_grpc
    try:
        return harness.run_tests(rest)
    finally:
        os.remove(args.tokens_file)


if __name__ == "__main__":
    sys.exit(main())
