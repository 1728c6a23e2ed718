"""The synchronous client.

    import echokv

    with echokv.Client("localhost:50051") as client:
        session = client.create(text=story, policy="echokv", budget=64,
                                on_progress=lambda p: print(p.phase, p.done, p.total))
        for delta in client.generate(session.id, max_tokens=32):
            print(delta.text, end="", flush=True)
        print(client.inspect(session.id).total_kv_bytes)
        client.delete(session.id)
"""

import os
import threading
import time

import grpc

from . import errors
from ._base import ClientBase
from ._requests import (build_input, create_request, fork_request, generate_request,
                        import_header, import_requests, open_import_source)
from .grpc_health.v1 import health_pb2, health_pb2_grpc
from .options import DEFAULT, NO_RETRY
from .types import (CacheInspection, CompressionConfig, CompressResult, GenerateDelta,
                    GenerateResult, Progress, ServerInfo, Session)
from .v1 import echokv_pb2 as pb
from .v1 import echokv_pb2_grpc as pb_grpc

__all__ = ["Client", "GenerateStream", "SessionStream", "ExportStream"]


class _Channels:
    """One channel (and its stubs) per address, created on first use."""

    def __init__(self, tls, options):
        self._tls = tls
        self._options = options
        self._lock = threading.Lock()
        self._entries = {}  # address -> (channel, EchoKVStub, HealthStub)

    def get(self, address):
        with self._lock:
            entry = self._entries.get(address)
            if entry is None:
                if self._tls is None:
                    channel = grpc.insecure_channel(address, options=self._options)
                else:
                    channel = grpc.secure_channel(address, self._tls.credentials(),
                                                  options=self._options)
                entry = (channel, pb_grpc.EchoKVStub(channel),
                         health_pb2_grpc.HealthStub(channel))
                self._entries[address] = entry
            return entry

    def close(self):
        with self._lock:
            entries, self._entries = self._entries, {}
        for channel, _, _ in entries.values():
            channel.close()


class _IdleWatchdog:
    """Cancels a call when the caller waits longer than `idle` seconds for a message.

    arm() before blocking for the next message, disarm() once it arrived: only time
    spent waiting on the server counts. One daemon thread per stream, woken only at
    deadlines and arms.
    """

    def __init__(self, call, idle):
        self._call = call
        self._idle = idle
        self._cond = threading.Condition()
        self._deadline = None  # monotonic seconds while armed
        self._stopped = False
        self.fired = False
        self._thread = threading.Thread(target=self._run, name="echokv-idle", daemon=True)
        self._thread.start()

    def arm(self):
        with self._cond:
            self._deadline = time.monotonic() + self._idle
            self._cond.notify()

    def disarm(self):
        with self._cond:
            self._deadline = None

    def stop(self):
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self):
        with self._cond:
            while not self._stopped:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self.fired = True
                    break
                self._cond.wait(remaining)
        if self.fired:
            self._call.cancel()


class _ServerStream:
    """Runs one server-streaming RPC: routing, the owner redirect (a NOT_FOUND naming
    another owner before any message is retried there once), the idle watchdog, error
    mapping. `messages()` yields the response messages."""

    def __init__(self, client, method, request, session_id, timeout, idle_timeout,
                 replica=None):
        self._client = client
        self._method = method
        self._request = request
        self._session_id = session_id
        self._timeout = timeout
        self._idle = idle_timeout
        self._replica = replica
        self._call = None
        self._cancelled = False
        self.address = None

    def cancel(self):
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    def messages(self):
        client = self._client
        address = client._address(self._session_id, self._replica)
        # Before its first message a cut stream changed nothing (the server undoes an
        # unfinished turn), so it may walk on UNAVAILABLE too.
        walk = client._walk(self._session_id, address, True)
        while True:
            if self._cancelled:
                raise errors.Cancelled("cancelled by the client", grpc.StatusCode.CANCELLED)
            _, stub, _ = client._channels.get(address)
            call = getattr(stub, self._method)(self._request, timeout=self._timeout,
                                               metadata=client._metadata(self._session_id, walk.fallback))
            self._call = call
            self.address = address
            watchdog = _IdleWatchdog(call, self._idle) if self._idle is not None else None
            received = False
            finished = False
            error = None
            try:
                iterator = iter(call)
                while True:
                    if watchdog is not None:
                        watchdog.arm()
                    try:
                        message = next(iterator)
                    except StopIteration:
                        finished = True
                        return
                    finally:
                        if watchdog is not None:
                            watchdog.disarm()
                    if not received:
                        walk.found(address)
                    received = True
                    yield message
            except grpc.RpcError as e:
                finished = True
                if watchdog is not None and watchdog.fired:
                    error = errors.DeadlineExceeded(
                        "%s: no message from the server for %g s (idle_timeout)"
                        % (self._method, self._idle))
                elif self._cancelled:
                    error = errors.Cancelled("cancelled by the client")
                else:
                    error = errors.error_from_rpc(e)
            finally:
                if watchdog is not None:
                    watchdog.stop()
                if not finished:  # the consumer stopped early (break, close, GC)
                    call.cancel()
            if not received:
                next_address = walk.next(error)
                if next_address is not None:
                    address = next_address
                    continue
                error = walk.final(error)
            raise error


class SessionStream:
    """CreateSession / AppendToSession as an iterator of `Progress` events; `session`
    holds the resulting Session once the stream ended. `result()` consumes the rest and
    returns it. `cancel()` stops the work (the session is left as it was)."""

    def __init__(self, stream, on_created=None):
        self._stream = stream
        self._messages = stream.messages()
        self._on_created = on_created
        self.session = None

    def __iter__(self):
        return self

    def __next__(self):
        for message in self._messages:
            kind = message.WhichOneof("event")
            if kind == "progress":
                return Progress.from_proto(message.progress)
            if kind == "session":
                self.session = Session.from_proto(message.session)
                if self._on_created is not None:
                    self._on_created(self.session, self._stream.address)
        if self.session is None:
            raise errors.ProtocolError("%s: the stream ended without a Session"
                                       % self._stream._method)
        raise StopIteration

    def result(self, on_progress=None):
        for event in self:
            if on_progress is not None:
                on_progress(event)
        return self.session

    def cancel(self):
        self._stream.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.session is None:
            self.cancel()
        self._messages.close()


class GenerateStream:
    """A streaming generation: iterate for `GenerateDelta`s (text, token ids, logprobs).
    Once the stream ended, `result` is the `GenerateResult` (whole text and ids, finish
    reason, counts, timings, the committed Session). `collect()` / `text()` consume the
    rest. `cancel()` stops it (nothing is committed)."""

    def __init__(self, stream):
        self._stream = stream
        self._messages = stream.messages()
        self._text = []
        self._ids = []
        self._logprobs = []
        self.result = None

    def __iter__(self):
        return self

    def __next__(self):
        for message in self._messages:
            delta = GenerateDelta.from_proto(message)
            self._text.append(delta.text)
            self._ids.extend(delta.token_ids)
            self._logprobs.extend(delta.logprobs)
            if message.HasField("final"):
                self.result = GenerateResult.from_parts(
                    "".join(self._text), self._ids, self._logprobs, message.final)
            if delta.text or delta.token_ids or delta.logprobs:
                return delta
        if self.result is None:
            raise errors.ProtocolError("Generate: the stream ended without a final message")
        raise StopIteration

    def collect(self):
        for _ in self:
            pass
        return self.result

    def text(self):
        return self.collect().text

    def cancel(self):
        self._stream.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.result is None:
            self.cancel()
        self._messages.close()


class ExportStream:
    """ExportSession as an iterator of snapshot byte chunks. `cancel()` stops it."""

    def __init__(self, stream):
        self._stream = stream
        self._messages = stream.messages()

    def __iter__(self):
        return self

    def __next__(self):
        for message in self._messages:
            if message.data:
                return message.data
        raise StopIteration

    def cancel(self):
        self._stream.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()
        self._messages.close()


class Client(ClientBase):
    """Synchronous echokv client (thread-safe; one channel per address).

    Args:
      target: "host:port" or a list of them (new sessions go to each in turn). Optional
        with `replicas` or `headless_service`.
      replicas: {"echokv-0": "host:port", ...}: the address of each owner replica.
      headless_service, port: derive an owner's address as "<name>.<headless>:<port>".
      gateway: True when `target` is the Helm chart's Envoy gateway: a call about a
        session its owner pod cannot answer for (gone after a scale-down, or not
        holding it) is sent once more with `x-echokv-fallback: heirs`, and the gateway
        tries the owner's heirs, where the scale-down drain moved its sessions.
      timeout: unary deadline in seconds (default 30; None = none), per attempt.
      stream_timeout: whole-stream deadline (default None: a long prefill is not cut).
      stream_idle_timeout: longest wait for a stream's next message (default 300 s).
      retry: RetryPolicy for idempotent calls (default RetryPolicy(); False = never).
      tls: a TLS (root CA, client cert/key), True for the system roots, None = plaintext.
      token: bearer token (str, or a callable returning the current one), sent as
        "authorization: Bearer <token>" on every call (use with TLS).
      metadata: extra (key, value) metadata on every call.
      channel_options: extra gRPC channel options.
      on_retry: called as on_retry(method, attempt, error, delay) before each retry.

    Every method takes `timeout=` (and streams `idle_timeout=`) to override the
    defaults for that call; None there means no deadline. Errors raise
    `echokv.EchoKVError` subclasses.
    """

    def __init__(self, target=None, **kwargs):
        super().__init__(target, **kwargs)
        self._channels = _Channels(self._tls, self._channel_options)

    def close(self):
        self._channels.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- plumbing ----

    def _unary(self, method, request, session_id=None, idempotent=False, timeout=DEFAULT,
               replica=None, health=False, address=None):
        deadline = self._unary_deadline(timeout)
        if address is None:
            address = self._address(session_id, replica)
        policy = self._retry if idempotent else NO_RETRY
        attempt = 0
        start = address
        walk = self._walk(session_id, address, idempotent)
        while True:
            attempt += 1
            _, stub, health_stub = self._channels.get(address)
            rpc = getattr(health_stub if health else stub, method)
            try:
                response = rpc(request, timeout=deadline, metadata=self._metadata(session_id, walk.fallback))
                walk.found(address)
                return response, address
            except grpc.RpcError as e:
                error = errors.error_from_rpc(e)
            next_address = walk.next(error)
            if next_address is not None:
                address = next_address
                attempt -= 1  # a step of the walk is not a retry
                continue
            error = walk.final(error)
            delay = self._retry_delay(policy, method, attempt, error)
            if delay is None:
                raise error
            address, walk = start, self._walk(session_id, start, idempotent)
            time.sleep(delay)

    def _stream(self, method, request, session_id, timeout, idle_timeout, replica=None):
        deadline, idle = self._stream_deadlines(timeout, idle_timeout)
        return _ServerStream(self, method, request, session_id, deadline, idle, replica)

    def _learn_created(self, session, address):
        self._router.learn_created(session.id, address)

    # ---- RPCs ----

    def info(self, *, replica=None, timeout=DEFAULT):
        """ServerInfo: model, device, policies, defaults, limits (of `replica`, or the
        default target)."""
        response, _ = self._unary("GetServerInfo", pb.GetServerInfoRequest(), idempotent=True,
                                  timeout=timeout, replica=replica)
        return ServerInfo.from_proto(response)

    def health(self, service="", *, replica=None, timeout=DEFAULT):
        """grpc.health.v1 status name: "SERVING", "NOT_SERVING", ... Service "" is the
        whole server, "echokv.v1.EchoKV" the engine."""
        response, _ = self._unary("Check", health_pb2.HealthCheckRequest(service=service),
                                  idempotent=True, timeout=timeout, replica=replica,
                                  health=True)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def create_stream(self, text=None, *, ids=None, chat=None, tools=None,
                      add_generation_prompt=None, add_special_tokens=None, compression=None,
                      ttl_seconds=None, replica=None, timeout=DEFAULT, idle_timeout=DEFAULT,
                      **compression_fields):
        """CreateSession as a SessionStream of Progress events (see create())."""
        request = create_request(
            build_input(text, ids, chat, tools, add_generation_prompt, add_special_tokens),
            compression, compression_fields, ttl_seconds)
        return SessionStream(self._stream("CreateSession", request, None, timeout,
                                          idle_timeout, replica), self._learn_created)

    def create(self, text=None, *, on_progress=None, **kwargs):
        """Creates a session from exactly one of `text`, `ids=` (token ids) or `chat=`
        (messages: dicts in OpenAI shape or ChatMessage; with `tools=` (a list or JSON
        text) and `add_generation_prompt=`). Compression: `compression=`
        (CompressionConfig or dict) and/or its fields as keywords (policy=, budget=,
        lookahead=, workspace=, window=, bootstrap=, repair=, snapkv_window=,
        snapkv_kernel=, memory="tiered"|"evict"). `on_progress(Progress)` sees each
        event. `replica=` creates it on that replica. Returns the Session."""
        return self.create_stream(text, **kwargs).result(on_progress)

    def append_stream(self, session_id, text=None, *, ids=None, chat=None, tools=None,
                      add_generation_prompt=None, add_special_tokens=None, timeout=DEFAULT,
                      idle_timeout=DEFAULT):
        """AppendToSession as a SessionStream of Progress events (see append())."""
        request = pb.AppendToSessionRequest(session_id=session_id, input=build_input(
            text, ids, chat, tools, add_generation_prompt, add_special_tokens))
        return SessionStream(self._stream("AppendToSession", request, session_id, timeout,
                                          idle_timeout))

    def append(self, session_id, text=None, *, on_progress=None, **kwargs):
        """Prefills more input (text / ids= / chat=) into the session and re-compresses.
        Returns the updated Session."""
        return self.append_stream(session_id, text, **kwargs).result(on_progress)

    def generate(self, session_id, *, max_tokens=None, temperature=None, top_p=None,
                 top_k=None, seed=None, min_p=None, repetition_penalty=None,
                 presence_penalty=None, frequency_penalty=None, logprobs=False,
                 top_logprobs=None, stop=(), stop_token_ids=(), ignore_eos=False,
                 commit=False, timeout=DEFAULT, idle_timeout=DEFAULT):
        """Starts a generation; returns a GenerateStream (iterate for GenerateDelta, or
        .collect() for the GenerateResult). commit=True appends the generated tokens
        to the session (result.session is the updated Session)."""
        request = generate_request(
            session_id, max_tokens=max_tokens, stop=stop, stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos, commit=commit, logprobs=logprobs, temperature=temperature,
            top_p=top_p, top_k=top_k, seed=seed, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, top_logprobs=top_logprobs)
        return GenerateStream(self._stream("Generate", request, session_id, timeout,
                                           idle_timeout))

    def fork(self, session_id, *, ttl_seconds=None, timeout=DEFAULT):
        """A new session with a deep copy of the source's cache (on the same replica)."""
        response, address = self._unary("ForkSession", fork_request(session_id, ttl_seconds),
                                        session_id, timeout=timeout)
        session = Session.from_proto(response)
        self._router.learn_created(session.id, address)
        return session

    def get(self, session_id, *, include_tokens=False, timeout=DEFAULT):
        """The session's current state (refreshes its idle timer)."""
        response, _ = self._unary("GetSession", pb.GetSessionRequest(session_id=session_id, include_tokens=include_tokens),
                                  session_id, idempotent=True, timeout=timeout)
        return Session.from_proto(response)

    def list(self, *, replica=None, timeout=DEFAULT):
        """Every live session of one server (`replica`, or the first default target)."""
        response, _ = self._unary(
            "ListSessions", pb.ListSessionsRequest(), idempotent=True, timeout=timeout,
            replica=replica, address=None if replica else self._router.targets[0])
        return [Session.from_proto(s) for s in response.sessions]

    def delete(self, session_id, *, timeout=DEFAULT):
        """Frees the session; returns the freed KV bytes."""
        response, _ = self._unary("DeleteSession", pb.DeleteSessionRequest(
            session_id=session_id), session_id, timeout=timeout)
        self._router.forget(session_id)
        return response.freed_kv_bytes

    def inspect(self, session_id, *, positions=False, timeout=DEFAULT):
        """CacheInspection: per layer and KV group what is retained (positions too when
        `positions=True`), bytes, the last report."""
        response, _ = self._unary("InspectCache", pb.InspectCacheRequest(
            session_id=session_id, include_positions=positions), session_id, idempotent=True,
            timeout=timeout)
        return CacheInspection.from_proto(response)

    def compress(self, text=None, *, ids=None, chat=None, tools=None,
                 add_generation_prompt=None, add_special_tokens=None, compression=None,
                 replica=None, timeout=DEFAULT, **compression_fields):
        """Stateless compression: which positions each layer/group keeps. Not retried
        (it costs a prefill); its deadline is the unary one."""
        request = pb.CompressRequest(
            input=build_input(text, ids, chat, tools, add_generation_prompt, add_special_tokens),
            compression=CompressionConfig.of(compression, **compression_fields).to_proto())
        response, _ = self._unary("Compress", request, timeout=timeout, replica=replica)
        return CompressResult.from_proto(response)

    def export(self, session_id, *, timeout=DEFAULT, idle_timeout=DEFAULT):
        """ExportSession: an ExportStream of snapshot byte chunks."""
        return ExportStream(self._stream("ExportSession", pb.ExportSessionRequest(
            session_id=session_id), session_id, timeout, idle_timeout))

    def export_to(self, session_id, destination, **kwargs):
        """Writes the session's snapshot to `destination` (a path: written to
        "<path>.part" and renamed when complete; or a binary file object). Returns the
        number of bytes written."""
        total = 0
        if isinstance(destination, (str, os.PathLike)):
            partial = os.fspath(destination) + ".part"
            try:
                with open(partial, "wb") as f, self.export(session_id, **kwargs) as chunks:
                    for chunk in chunks:
                        f.write(chunk)
                        total += len(chunk)
                os.replace(partial, destination)
            except BaseException:
                if os.path.exists(partial):
                    os.remove(partial)
                raise
            return total
        with self.export(session_id, **kwargs) as chunks:
            for chunk in chunks:
                destination.write(chunk)
                total += len(chunk)
        return total

    def import_(self, source, *, keep_id=False, ttl_seconds=None, replica=None,
                timeout=DEFAULT):
        """ImportSession from a snapshot: bytes, a file path, a binary file or an
        iterable of byte chunks (what export() yields). keep_id=True keeps the
        snapshot's id (AlreadyExists when taken). Goes to `replica`, or like a new
        session. Not retried; its deadline is the stream one (an upload can be long).
        Returns the new Session."""
        deadline, _ = self._stream_deadlines(timeout, DEFAULT)
        chunks, opened = open_import_source(source)
        address = self._address(None, replica)
        try:
            _, stub, _ = self._channels.get(address)
            try:
                response = stub.ImportSession(
                    import_requests(import_header(keep_id, ttl_seconds), chunks),
                    timeout=deadline, metadata=self._metadata())
            except grpc.RpcError as e:
                error = errors.error_from_rpc(e)
            else:
                error = None
        finally:
            if opened is not None:
                opened.close()
        if error is not None:
            raise error
        session = Session.from_proto(response)
        self._router.learn_created(session.id, address)
        return session
