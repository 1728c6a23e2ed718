"""An in-process fake echokv server (grpc Python) for the client's tests.

It implements the whole echokv.v1 API over toy state — a session is a list of "token
ids" (text: one id per character, ord(c) % 256; generation: previous id + 1), so tests
can compute every expected value by hand — and records every call it gets:

    fake = FakeReplica(name="echokv-1").start()      # ids "echokv-1.<hex>"
    client = echokv.Client(fake.address)
    ...
    assert [c.method for c in fake.calls] == ["CreateSession", "Generate"]

Failure injection: `fake.fail_next(method, code, message, trailing=())` makes the next
call(s) of `method` fail; `fake.owner_hint[session_id] = "echokv-2"` answers NOT_FOUND
with `x-echokv-owner` for it; `fake.hang_generate` (a threading.Event) makes Generate
send one delta and wait until the event is set or the client goes away
(`fake.generate_cancelled` is set then). `token=` requires "authorization: Bearer
<token>"; `server_credentials=` serves TLS.

It uses the stubs of the echokv package on sys.path (the source tree, or an installed
copy in the pip install test).
"""

import collections
import concurrent.futures
import hashlib
import json
import threading
import uuid

import grpc

from echokv.grpc_health.v1 import health_pb2, health_pb2_grpc
from echokv.v1 import echokv_pb2 as pb
from echokv.v1 import echokv_pb2_grpc as pb_grpc

Call = collections.namedtuple("Call", "method session_id header authorization time_remaining")

EXPORT_CHUNK = 7  # small, so snapshots take several messages


def text_ids(text):
    return [ord(c) % 256 for c in text]


def render_chat(chat):
    """The fake's "chat template": one line per message; the generation prompt adds
    "assistant:"; tools add a "tools:" line."""
    out = ""
    if chat.tools_json:
        out += "tools: %s\n" % chat.tools_json
    for m in chat.messages:
        out += "%s: %s" % (m.role, m.content)
        for c in m.tool_calls:
            out += " [call %s %s %s]" % (c.id, c.function_name, c.arguments_json)
        if m.tool_call_id:
            out += " [answers %s]" % m.tool_call_id
        out += "\n"
    if not chat.HasField("add_generation_prompt") or chat.add_generation_prompt:
        out += "assistant:"
    return out


class _Servicer(pb_grpc.EchoKVServicer):
    def __init__(self, replica):
        self.r = replica

    # ---- helpers ----

    def _enter(self, method, request, context):
        """Records the call and applies auth / injected failures / owner hints."""
        r = self.r
        md = dict(context.invocation_metadata())
        remaining = context.time_remaining()
        if remaining is not None and remaining > 1e9:
            remaining = None  # grpc reports "no deadline" as ~9e18
        session_id = getattr(request, "session_id", None)
        with r.lock:
            r.calls.append(Call(method, session_id, md.get("x-echokv-session"),
                                md.get("authorization"), remaining))
            failure = r.failures[method].pop(0) if r.failures[method] else None
        if r.token is not None and md.get("authorization") != "Bearer " + r.token:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        if failure is not None:
            code, message, trailing = failure
            if trailing:
                context.set_trailing_metadata(trailing)
            context.abort(code, message)
        if session_id is not None and session_id in r.owner_hint:
            context.set_trailing_metadata((("x-echokv-owner", r.owner_hint[session_id]),))
            context.abort(grpc.StatusCode.NOT_FOUND, "session %s not found" % session_id)

    def _session(self, session_id, context):
        s = self.r.sessions.get(session_id)
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          "session %s not found (unknown, deleted or expired)" % session_id)
        return s

    def _ids(self, input_message, context):
        kind = input_message.WhichOneof("content")
        if kind == "text":
            if not input_message.text:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input.text: empty")
            return text_ids(input_message.text)
        if kind == "tokens":
            return list(input_message.tokens.ids)
        if kind == "chat":
            self.r.last_chat = input_message.chat
            return text_ids(render_chat(input_message.chat))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input: empty")

    def _new_id(self):
        hexid = uuid.uuid4().hex
        return "%s.%s" % (self.r.name, hexid) if self.r.name else hexid

    def _proto(self, s):
        return pb.Session(id=s["id"], tokens_seen=len(s["ids"]),
                          retained_entries=min(len(s["ids"]), 4),
                          retained_kv_bytes=8 * min(len(s["ids"]), 4),
                          full_kv_bytes=8 * len(s["ids"]), compression=s["compression"],
                          ttl_seconds=s["ttl"], memory=s["compression"].memory or "tiered")

    def _progress_then_session(self, s, n):
        yield pb.SessionProgress(progress=pb.SessionProgress.Progress(
            phase="prefill", done=n, total=n))
        yield pb.SessionProgress(session=self._proto(s))

    # ---- RPCs ----

    def GetServerInfo(self, request, context):
        self._enter("GetServerInfo", request, context)
        if self.r.hang_info is not None:  # outlives any short deadline, until released
            while not self.r.hang_info.wait(0.01):
                if not context.is_active():
                    break
        return pb.ServerInfo(version="fake", replica_id=self.r.name or "",
                             model=pb.ModelInfo(model_type="fake", chat_template=True),
                             policies=["full", "echokv"], live_sessions=len(self.r.sessions))

    def CreateSession(self, request, context):
        self._enter("CreateSession", request, context)
        ids = self._ids(request.input, context)
        s = {"id": self._new_id(), "ids": ids, "compression": request.compression,
             "ttl": request.ttl_seconds if request.HasField("ttl_seconds") else 1800}
        with self.r.lock:
            self.r.sessions[s["id"]] = s
        yield from self._progress_then_session(s, len(ids))

    def AppendToSession(self, request, context):
        self._enter("AppendToSession", request, context)
        s = self._session(request.session_id, context)
        ids = self._ids(request.input, context)
        s["ids"] = s["ids"] + ids
        yield from self._progress_then_session(s, len(ids))

    def Generate(self, request, context):
        self._enter("Generate", request, context)
        s = self._session(request.session_id, context)
        n = request.max_tokens if request.HasField("max_tokens") else 8
        sampling = request.sampling
        last = s["ids"][-1] if s["ids"] else 0
        generated = []
        completed = False
        try:
            for i in range(n):
                t = (last + 1 + i) % 256
                generated.append(t)
                message = pb.GenerateResponse(text=chr(ord("a") + t % 26), token_ids=[t])
                if sampling.logprobs:
                    top = [pb.TokenLogprob.Alternative(token_id=(t + k) % 256,
                                                       logprob=-0.5 - k)
                           for k in range(sampling.top_logprobs)]
                    message.logprobs.add(token_id=t, logprob=-0.5, top=top)
                yield message
                if i == 0 and self.r.hang_generate is not None:
                    cancelled = threading.Event()
                    context.add_callback(cancelled.set)
                    while not self.r.hang_generate.wait(0.01):
                        if cancelled.is_set() or not context.is_active():
                            return
            final = pb.GenerateResponse.Final(
                finish_reason=pb.GenerateResponse.Final.LENGTH, prompt_tokens=len(s["ids"]),
                generated_tokens=n)
            if request.commit:
                s["ids"] = s["ids"] + generated
                final.session.CopyFrom(self._proto(s))
            yield pb.GenerateResponse(final=final)
            completed = True
        finally:
            # A client that cancels shows up either here (the loop above) or as the
            # server dropping this generator when a send fails (GeneratorExit).
            if not completed and self.r.hang_generate is not None:
                self.r.generate_cancelled.set()

    def ForkSession(self, request, context):
        self._enter("ForkSession", request, context)
        src = self._session(request.session_id, context)
        s = dict(src, id=self._new_id(), ids=list(src["ids"]))
        if request.HasField("ttl_seconds"):
            s["ttl"] = request.ttl_seconds
        with self.r.lock:
            self.r.sessions[s["id"]] = s
        return self._proto(s)

    def GetSession(self, request, context):
        self._enter("GetSession", request, context)
        return self._proto(self._session(request.session_id, context))

    def ListSessions(self, request, context):
        self._enter("ListSessions", request, context)
        return pb.ListSessionsResponse(sessions=[self._proto(s) for s in self.r.sessions.values()])

    def DeleteSession(self, request, context):
        self._enter("DeleteSession", request, context)
        s = self._session(request.session_id, context)
        del self.r.sessions[request.session_id]
        return pb.DeleteSessionResponse(freed_kv_bytes=self._proto(s).retained_kv_bytes)

    def InspectCache(self, request, context):
        self._enter("InspectCache", request, context)
        s = self._session(request.session_id, context)
        positions = list(range(len(s["ids"])))[-4:] if request.include_positions else []
        return pb.InspectCacheResponse(
            session=self._proto(s), total_retained_entries=min(len(s["ids"]), 4),
            layers=[pb.LayerCache(layer=0, retained=min(len(s["ids"]), 4), groups=[
                pb.KvGroupCache(group=0, retained=min(len(s["ids"]), 4),
                                positions=positions)])])

    def Compress(self, request, context):
        self._enter("Compress", request, context)
        ids = self._ids(request.input, context)
        return pb.CompressResponse(context_tokens=len(ids))

    def ExportSession(self, request, context):
        self._enter("ExportSession", request, context)
        s = self._session(request.session_id, context)
        body = json.dumps({"id": s["id"], "ids": s["ids"], "ttl": s["ttl"],
                           "compression": s["compression"].SerializeToString().hex()}).encode()
        blob = hashlib.sha256(body).hexdigest().encode() + b"\n" + body
        for i in range(0, len(blob), EXPORT_CHUNK):
            yield pb.SessionSnapshotChunk(data=blob[i:i + EXPORT_CHUNK])

    def ImportSession(self, request_iterator, context):
        header = None
        data = b""
        for i, message in enumerate(request_iterator):
            if i == 0:
                if message.WhichOneof("part") != "header":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message: no header")
                header = message.header
            else:
                data += message.data
        self._enter("ImportSession", pb.GetServerInfoRequest(), context)
        if header is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty stream")
        digest, _, body = data.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            context.abort(grpc.StatusCode.DATA_LOSS, "snapshot checksum mismatch")
        snap = json.loads(body)
        sid = snap["id"] if header.keep_id else self._new_id()
        if sid in self.r.sessions:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "session %s exists" % sid)
        s = {"id": sid, "ids": snap["ids"],
             "ttl": header.ttl_seconds if header.HasField("ttl_seconds") else snap["ttl"],
             "compression": pb.CompressionConfig.FromString(bytes.fromhex(snap["compression"]))}
        with self.r.lock:
            self.r.sessions[sid] = s
        return self._proto(s)


class _Health(health_pb2_grpc.HealthServicer):
    def __init__(self, replica):
        self.r = replica

    def Check(self, request, context):
        _Servicer(self.r)._enter("Check", request, context)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class FakeReplica:
    def __init__(self, name=None, port=0, token=None, server_credentials=None):
        self.name = name
        self.port = port
        self.token = token
        self.server_credentials = server_credentials
        self.lock = threading.Lock()
        self.calls = []
        self.sessions = {}
        self.failures = collections.defaultdict(list)
        self.owner_hint = {}
        self.hang_generate = None
        self.hang_info = None  # a threading.Event: GetServerInfo waits for it
        self.generate_cancelled = threading.Event()
        self.last_chat = None
        self._server = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_EchoKVServicer_to_server(_Servicer(self), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(_Health(self), self._server)
        bind = "127.0.0.1:%d" % self.port
        if self.server_credentials is None:
            self.port = self._server.add_insecure_port(bind)
        else:
            self.port = self._server.add_secure_port(bind, self.server_credentials)
        if not self.port:
            raise RuntimeError("fake server: cannot bind " + bind)
        self._server.start()
        return self

    def stop(self):
        """Stops the fake and waits until its shutdown completed, so the port is closed
        when this returns. (The client's own channel may still be READY a moment longer:
        deploy_routing_walk's `gone` waits for that.)"""
        if self._server is not None:
            if not self._server.stop(grace=None).wait(timeout=30):
                raise RuntimeError("fake replica %s did not shut down in 30 s" % self.name)
            self._server = None

    def fail_next(self, method, code, message="injected", trailing=(), times=1):
        with self.lock:
            self.failures[method].extend([(code, message, tuple(trailing))] * times)

    def methods(self):
        with self.lock:
            return [c.method for c in self.calls]

    def clear(self):
        with self.lock:
            self.calls.clear()
