"""Python client of echokv-server (gRPC service echokv.v1.EchoKV).

    import echokv

    with echokv.Client("localhost:50051") as client:
        session = client.create(text="Once upon a time", policy="echokv", budget=64)
        for delta in client.generate(session.id, max_tokens=32):
            print(delta.text, end="", flush=True)
        print(client.inspect(session.id).total_retained_entries)

* `Client` (sync) and `AsyncClient` (asyncio, grpc.aio): the same methods — info,
  health, create / create_stream, append / append_stream, generate, fork, get, list,
  delete, inspect, compress, export / export_to, import_.
* Typed results (`echokv.types`), one exception hierarchy (`echokv.errors`).
* Deadlines, retries, TLS and bearer tokens (`echokv.options`); owner-aware routing
  across replicas (`echokv.routing`).
* `Memory` / `AsyncMemory`: a chat conversation in one session for agent frameworks.

Installs offline on Debian (python3-grpcio, python3-protobuf); see client/python/README.md.
"""

from . import errors, options, routing, types
from .aio import AsyncClient, AsyncExportStream, AsyncGenerateStream, AsyncSessionStream
from .client import Client, ExportStream, GenerateStream, SessionStream
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,
                     EchoKVError, FailedPrecondition, InternalError, InvalidArgument, NotFound,
                     OutOfRange, PermissionDenied, ProtocolError, ResourceExhausted,
                     SessionBusy, Unauthenticated, Unavailable, Unimplemented, UnknownError)
from .memory import AsyncMemory, Memory
from .options import NO_RETRY, TLS, RetryPolicy
from .routing import Router
from .types import (CacheInspection, ChatMessage, CompressionConfig, CompressionReport,
                    CompressResult, GenerateDelta, GenerateResult, KvGroupCache, LayerCache,
                    Limits, ModelInfo, PhaseTime, Progress, ServerInfo, Session, TokenLogprob,
                    ToolCall, TopLogprob, session_owner)

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "Memory", "AsyncMemory", "RetryPolicy", "NO_RETRY", "TLS",
    "Router", "GenerateStream", "SessionStream", "ExportStream", "AsyncGenerateStream",
    "AsyncSessionStream", "AsyncExportStream",
    "EchoKVError", "Cancelled", "UnknownError", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "SessionBusy", "Aborted", "OutOfRange", "Unimplemented",
    "InternalError", "Unavailable", "DataLoss", "Unauthenticated", "ProtocolError",
    "CacheInspection", "ChatMessage", "CompressionConfig", "CompressionReport",
    "CompressResult", "GenerateDelta", "GenerateResult", "KvGroupCache", "LayerCache",
    "Limits", "ModelInfo", "PhaseTime", "Progress", "ServerInfo", "Session",
    "TokenLogprob", "ToolCall", "TopLogprob", "session_owner",
    "errors", "options", "routing", "types",
]
