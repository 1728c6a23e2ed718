"""One exception hierarchy for every failed call.

Every gRPC status the server (or the channel) returns becomes an `EchoKVError`
subclass chosen by its code; `.code` is the `grpc.StatusCode`, `.message` the server's
message (it names the bad field or limit), `.owner` the replica named by the
`x-echokv-owner` trailing metadata of a NOT_FOUND (else None)::

    try:
        client.generate(session_id, max_tokens=10_000).collect()
    except echokv.InvalidArgument as e:   # "max_tokens ... exceeds max_new_tokens"
        print(e.code.name, e.message)
    except echokv.SessionBusy:            # FAILED_PRECONDITION "session ... is busy"
        ...                               # retry later
    except echokv.EchoKVError as e:       # anything else
        ...

Arguments the client itself rejects before sending (two inputs at once, an unknown
compression field) raise ValueError / TypeError: those are programming errors.
"""

import grpc

__all__ = [
    "EchoKVError", "Cancelled", "UnknownError", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "SessionBusy", "Aborted", "OutOfRange", "Unimplemented",
    "InternalError", "Unavailable", "DataLoss", "Unauthenticated", "ProtocolError",
    "error_from_rpc",
]

OWNER_METADATA = "x-echokv-owner"


class EchoKVError(Exception):
    """A call failed. `code`: grpc.StatusCode; `message`: the server's message."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None, owner=None, trailing_metadata=()):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.owner = owner
        self.trailing_metadata = tuple(trailing_metadata or ())

    def __str__(self):
        return "%s: %s" % (self.code.name, self.message)

    # Older name of `message` (echokv_client.EchoKVError had `.details`).
    @property
    def details(self):
        return self.message


class Cancelled(EchoKVError):
    code = grpc.StatusCode.CANCELLED


class UnknownError(EchoKVError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(EchoKVError):
    """A request field is bad; the message names it."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(EchoKVError):
    """The call's deadline passed (or a stream sent nothing for its idle timeout)."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(EchoKVError):
    """The session is unknown, deleted or expired (`.owner`: the replica that holds it,
    when a non-owner answered)."""
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(EchoKVError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(EchoKVError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(EchoKVError):
    """A server limit refused admission (max_sessions, max_kv_bytes, ...)."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(EchoKVError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class SessionBusy(FailedPrecondition):
    """FAILED_PRECONDITION because another mutation of the session is in progress."""


class Aborted(EchoKVError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(EchoKVError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(EchoKVError):
    """The server does not offer this (e.g. chat input without a chat template)."""
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(EchoKVError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(EchoKVError):
    """Nothing answers at the address, or the server is shutting down."""
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(EchoKVError):
    """A snapshot checksum did not match (ImportSession)."""
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(EchoKVError):
    """No or a wrong bearer token / client certificate."""
    code = grpc.StatusCode.UNAUTHENTICATED


class ProtocolError(EchoKVError):
    """The server answered something the API does not allow (e.g. a CreateSession
    stream that ended without a Session)."""
    code = grpc.StatusCode.INTERNAL


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, UnknownError, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
    Unimplemented, InternalError, Unavailable, DataLoss, Unauthenticated)}


def _metadata_value(metadata, key):
    for entry in metadata or ():
        k, v = entry[0], entry[1]
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return None


def error_from_status(code, message, trailing_metadata=()):
    """The EchoKVError subclass for a status code (SessionBusy for a busy session)."""
    cls = _BY_CODE.get(code, EchoKVError)
    if cls is FailedPrecondition and " is busy" in (message or ""):
        cls = SessionBusy
    owner = _metadata_value(trailing_metadata, OWNER_METADATA) if cls is NotFound else None
    return cls(message or "", code=code, owner=owner, trailing_metadata=trailing_metadata)


def error_from_rpc(error):
    """Maps a grpc.RpcError (sync) or grpc.aio.AioRpcError to an EchoKVError."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    trailing = ()
    getter = getattr(error, "trailing_metadata", None)
    if callable(getter):
        try:
            trailing = getter() or ()
        except Exception:  # pragma: no cover - some errors carry no metadata
            trailing = ()
    return error_from_status(code, details, trailing)
