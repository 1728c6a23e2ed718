"""The asyncio client (grpc.aio): the same surface as echokv.Client, awaitable.

    import asyncio, echokv

    async def main():
        async with echokv.AsyncClient("localhost:50051") as client:
            session = await client.create(text=story, budget=64)
            async for delta in client.generate(session.id, max_tokens=32):
                print(delta.text, end="", flush=True)
            await client.delete(session.id)

    asyncio.run(main())

Use one AsyncClient per event loop (grpc.aio channels belong to the loop that made
them; they are created on first use).
"""

import asyncio
import inspect
import os

import grpc
import grpc.aio

from . import errors
from ._base import ClientBase
from ._requests import (aimport_requests, build_input, create_request, fork_request,
                        generate_request, import_header, open_import_source)
from .grpc_health.v1 import health_pb2, health_pb2_grpc
from .options import DEFAULT, NO_RETRY
from .types import (CacheInspection, CompressionConfig, CompressResult, GenerateDelta,
                    GenerateResult, Progress, ServerInfo, Session)
from .v1 import echokv_pb2 as pb
from .v1 import echokv_pb2_grpc as pb_grpc

__all__ = ["AsyncClient", "AsyncGenerateStream", "AsyncSessionStream", "AsyncExportStream"]


class _AsyncChannels:
    def __init__(self, tls, options):
        self._tls = tls
        self._options = options
        self._entries = {}  # address -> (channel, EchoKVStub, HealthStub)

    def get(self, address):
        entry = self._entries.get(address)
        if entry is None:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._tls.credentials(),
                                                  options=self._options)
            entry = (channel, pb_grpc.EchoKVStub(channel), health_pb2_grpc.HealthStub(channel))
            self._entries[address] = entry
        return entry

    async def close(self):
        entries, self._entries = self._entries, {}
        for channel, _, _ in entries.values():
            await channel.close()


class _AsyncServerStream:
    """The asyncio twin of client._ServerStream (routing, owner redirect before the
    first message, idle timeout by asyncio.wait_for per message, error mapping)."""

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

    async def messages(self):
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
            received = False
            finished = False
            error = None
            try:
                while True:
                    try:
                        if self._idle is None:
                            message = await call.read()
                        else:
                            message = await asyncio.wait_for(call.read(), self._idle)
                    except asyncio.TimeoutError:
                        finished = True
                        call.cancel()
                        error = errors.DeadlineExceeded(
                            "%s: no message from the server for %g s (idle_timeout)"
                            % (self._method, self._idle))
                        break
                    except asyncio.CancelledError:
                        if not self._cancelled:
                            raise  # the task itself is being cancelled
                        finished = True
                        error = errors.Cancelled("cancelled by the client")
                        break
                    if message is grpc.aio.EOF:
                        finished = True
                        return
                    if not received:
                        walk.found(address)
                    received = True
                    yield message
            except grpc.RpcError as e:
                finished = True
                error = (errors.Cancelled("cancelled by the client") if self._cancelled
                         else errors.error_from_rpc(e))
            finally:
                if not finished:
                    call.cancel()
            if not received:
                next_address = walk.next(error)
                if next_address is not None:
                    address = next_address
                    continue
                error = walk.final(error)
            raise error


async def _maybe_await(value):
    if inspect.isawaitable(value):
        await value


class AsyncSessionStream:
    """CreateSession / AppendToSession: `async for` Progress events; `session` once
    ended; `await result(on_progress)` consumes the rest (on_progress may be async)."""

    def __init__(self, stream, on_created=None):
        self._stream = stream
        self._messages = stream.messages()
        self._on_created = on_created
        self.session = None

    def __aiter__(self):
        return self

    async def __anext__(self):
        async for message in self._messages:
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
        raise StopAsyncIteration

    async def result(self, on_progress=None):
        async for event in self:
            if on_progress is not None:
                await _maybe_await(on_progress(event))
        return self.session

    def cancel(self):
        self._stream.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if self.session is None:
            self.cancel()
        await self._messages.aclose()


class AsyncGenerateStream:
    """`async for` GenerateDelta; `result` (GenerateResult) once ended; `await
    collect()` / `await text()` consume the rest; `cancel()` stops it."""

    def __init__(self, stream):
        self._stream = stream
        self._messages = stream.messages()
        self._text = []
        self._ids = []
        self._logprobs = []
        self.result = None

    def __aiter__(self):
        return self

    async def __anext__(self):
        async for message in self._messages:
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
        raise StopAsyncIteration

    async def collect(self):
        async for _ in self:
            pass
        return self.result

    async def text(self):
        return (await self.collect()).text

    def cancel(self):
        self._stream.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if self.result is None:
            self.cancel()
        await self._messages.aclose()


class AsyncExportStream:
    """`async for` snapshot byte chunks."""

    def __init__(self, stream):
        self._stream = stream
        self._messages = stream.messages()

    def __aiter__(self):
        return self

    async def __anext__(self):
        async for message in self._messages:
            if message.data:
                return message.data
        raise StopAsyncIteration

    def cancel(self):
        self._stream.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.cancel()
        await self._messages.aclose()


class AsyncClient(ClientBase):
    """asyncio echokv client; the arguments and methods are those of echokv.Client,
    with `await` on every call except generate() / create_stream() / append_stream() /
    export(), which return async iterators at once."""

    def __init__(self, target=None, **kwargs):
        super().__init__(target, **kwargs)
        self._channels = _AsyncChannels(self._tls, self._channel_options)

    async def close(self):
        await self._channels.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # ---- plumbing ----

    async def _unary(self, method, request, session_id=None, idempotent=False,
                     timeout=DEFAULT, replica=None, health=False, address=None):
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
                response = await rpc(request, timeout=deadline,
                                     metadata=self._metadata(session_id, walk.fallback))
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
            await asyncio.sleep(delay)

    def _stream(self, method, request, session_id, timeout, idle_timeout, replica=None):
        deadline, idle = self._stream_deadlines(timeout, idle_timeout)
        return _AsyncServerStream(self, method, request, session_id, deadline, idle, replica)

    def _learn_created(self, session, address):
        self._router.learn_created(session.id, address)

    # ---- RPCs ----

    async def info(self, *, replica=None, timeout=DEFAULT):
        response, _ = await self._unary("GetServerInfo", pb.GetServerInfoRequest(),
                                        idempotent=True, timeout=timeout, replica=replica)
        return ServerInfo.from_proto(response)

    async def health(self, service="", *, replica=None, timeout=DEFAULT):
        response, _ = await self._unary(
            "Check", health_pb2.HealthCheckRequest(service=service), idempotent=True,
            timeout=timeout, replica=replica, health=True)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def create_stream(self, text=None, *, ids=None, chat=None, tools=None,
                      add_generation_prompt=None, add_special_tokens=None, compression=None,
                      ttl_seconds=None, replica=None, timeout=DEFAULT, idle_timeout=DEFAULT,
                      **compression_fields):
        request = create_request(
            build_input(text, ids, chat, tools, add_generation_prompt, add_special_tokens),
            compression, compression_fields, ttl_seconds)
        return AsyncSessionStream(self._stream("CreateSession", request, None, timeout,
                                               idle_timeout, replica), self._learn_created)

    async def create(self, text=None, *, on_progress=None, **kwargs):
        return await self.create_stream(text, **kwargs).result(on_progress)

    def append_stream(self, session_id, text=None, *, ids=None, chat=None, tools=None,
                      add_generation_prompt=None, add_special_tokens=None, timeout=DEFAULT,
                      idle_timeout=DEFAULT):
        request = pb.AppendToSessionRequest(session_id=session_id, input=build_input(
            text, ids, chat, tools, add_generation_prompt, add_special_tokens))
        return AsyncSessionStream(self._stream("AppendToSession", request, session_id,
                                               timeout, idle_timeout))

    async def append(self, session_id, text=None, *, on_progress=None, **kwargs):
        return await self.append_stream(session_id, text, **kwargs).result(on_progress)

    def generate(self, session_id, *, max_tokens=None, temperature=None, top_p=None,
                 top_k=None, seed=None, min_p=None, repetition_penalty=None,
                 presence_penalty=None, frequency_penalty=None, logprobs=False,
                 top_logprobs=None, stop=(), stop_token_ids=(), ignore_eos=False,
                 commit=False, timeout=DEFAULT, idle_timeout=DEFAULT):
        request = generate_request(
            session_id, max_tokens=max_tokens, stop=stop, stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos, commit=commit, logprobs=logprobs, temperature=temperature,
            top_p=top_p, top_k=top_k, seed=seed, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, top_logprobs=top_logprobs)
        return AsyncGenerateStream(self._stream("Generate", request, session_id, timeout,
                                                idle_timeout))

    async def fork(self, session_id, *, ttl_seconds=None, timeout=DEFAULT):
        response, address = await self._unary(
            "ForkSession", fork_request(session_id, ttl_seconds), session_id, timeout=timeout)
        session = Session.from_proto(response)
        self._router.learn_created(session.id, address)
        return session

    async def get(self, session_id, *, include_tokens=False, timeout=DEFAULT):
        response, _ = await self._unary(
            "GetSession", pb.GetSessionRequest(session_id=session_id, include_tokens=include_tokens), session_id,
            idempotent=True, timeout=timeout)
        return Session.from_proto(response)

    async def list(self, *, replica=None, timeout=DEFAULT):
        response, _ = await self._unary(
            "ListSessions", pb.ListSessionsRequest(), idempotent=True, timeout=timeout,
            replica=replica, address=None if replica else self._router.targets[0])
        return [Session.from_proto(s) for s in response.sessions]

    async def delete(self, session_id, *, timeout=DEFAULT):
        response, _ = await self._unary("DeleteSession", pb.DeleteSessionRequest(
            session_id=session_id), session_id, timeout=timeout)
        self._router.forget(session_id)
        return response.freed_kv_bytes

    async def inspect(self, session_id, *, positions=False, timeout=DEFAULT):
        response, _ = await self._unary("InspectCache", pb.InspectCacheRequest(
            session_id=session_id, include_positions=positions), session_id, idempotent=True,
            timeout=timeout)
        return CacheInspection.from_proto(response)

    async def compress(self, text=None, *, ids=None, chat=None, tools=None,
                       add_generation_prompt=None, add_special_tokens=None, compression=None,
                       replica=None, timeout=DEFAULT, **compression_fields):
        request = pb.CompressRequest(
            input=build_input(text, ids, chat, tools, add_generation_prompt, add_special_tokens),
            compression=CompressionConfig.of(compression, **compression_fields).to_proto())
        response, _ = await self._unary("Compress", request, timeout=timeout, replica=replica)
        return CompressResult.from_proto(response)

    def export(self, session_id, *, timeout=DEFAULT, idle_timeout=DEFAULT):
        return AsyncExportStream(self._stream("ExportSession", pb.ExportSessionRequest(
            session_id=session_id), session_id, timeout, idle_timeout))

    async def export_to(self, session_id, destination, **kwargs):
        """As Client.export_to (file writes are blocking calls on the loop)."""
        total = 0
        if isinstance(destination, (str, os.PathLike)):
            partial = os.fspath(destination) + ".part"
            try:
                with open(partial, "wb") as f:
                    async with self.export(session_id, **kwargs) as chunks:
                        async for chunk in chunks:
                            f.write(chunk)
                            total += len(chunk)
                os.replace(partial, destination)
            except BaseException:
                if os.path.exists(partial):
                    os.remove(partial)
                raise
            return total
        async with self.export(session_id, **kwargs) as chunks:
            async for chunk in chunks:
                destination.write(chunk)
                total += len(chunk)
        return total

    async def import_(self, source, *, keep_id=False, ttl_seconds=None, replica=None,
                      timeout=DEFAULT):
        """As Client.import_; `source` may also be an async iterable of bytes."""
        deadline, _ = self._stream_deadlines(timeout, DEFAULT)
        chunks, opened = open_import_source(source)
        address = self._address(None, replica)
        error = None
        try:
            _, stub, _ = self._channels.get(address)
            try:
                response = await stub.ImportSession(
                    aimport_requests(import_header(keep_id, ttl_seconds), chunks),
                    timeout=deadline, metadata=self._metadata())
            except grpc.RpcError as e:
                error = errors.error_from_rpc(e)
        finally:
            if opened is not None:
                opened.close()
        if error is not None:
            raise error
        session = Session.from_proto(response)
        self._router.learn_created(session.id, address)
        return session
