"""Connection options: deadlines, retries, TLS and bearer tokens.

Deadlines (seconds; None = no deadline), set per client and overridable per call:

* ``timeout`` (default 30 s) — every unary call (GetServerInfo, GetSession, Fork, ...),
  and per attempt when the call is retried.
* ``stream_timeout`` (default None) — the whole of a server stream (CreateSession,
  AppendToSession, Generate, ExportSession) and of ImportSession's upload: a long
  prefill or a long generation is not cut by the unary default.
* ``stream_idle_timeout`` (default 300 s) — a server stream that delivers no message for
  this long while the caller waits for the next one is cancelled and raises
  DeadlineExceeded. The server sends progress events per prefill chunk and one message
  per token, so a healthy stream is never idle for long; a hung server or a dead
  connection does not block the caller forever. Time the caller spends between two
  messages (processing a delta) does not count.

Retries (`RetryPolicy`): only idempotent calls are retried — GetServerInfo, GetSession,
ListSessions, InspectCache and health — on UNAVAILABLE and DEADLINE_EXCEEDED (a unary
call that timed out received no byte), with exponential backoff and jitter. Mutations
(CreateSession, AppendToSession, Generate, Fork, Delete, Import) are never retried:
resending one could apply it twice.
"""

import os
import random
from dataclasses import dataclass, field
from typing import FrozenSet, Optional, Union

import grpc

__all__ = ["RetryPolicy", "NO_RETRY", "TLS", "DEFAULT_UNARY_TIMEOUT",
           "DEFAULT_STREAM_TIMEOUT", "DEFAULT_STREAM_IDLE_TIMEOUT"]

DEFAULT_UNARY_TIMEOUT = 30.0
DEFAULT_STREAM_TIMEOUT = None
DEFAULT_STREAM_IDLE_TIMEOUT = 300.0


class _Default:
    """Sentinel: "use the client's default" (None means "no deadline")."""

    def __repr__(self):
        return "DEFAULT"


DEFAULT = _Default()


def check_timeout(name, value):
    """None or a positive number; anything else raises ValueError naming `name`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError("%s must be a positive number of seconds or None, not %r"
                         % (name, value))
    return float(value)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for idempotent calls.

    Attempt n (1-based) that fails with a code in `retry_codes` waits
    min(max_backoff, initial_backoff * multiplier**(n-1)) * uniform(1 - jitter, 1 + jitter)
    seconds and tries again, up to `max_attempts` attempts in all.
    """
    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2
    retry_codes: FrozenSet[grpc.StatusCode] = field(default_factory=lambda: frozenset(
        {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}))

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be an integer >= 1, not %r"
                             % (self.max_attempts,))
        for name in ("initial_backoff", "max_backoff"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError("RetryPolicy.%s must be >= 0, not %r" % (name, value))
        if self.max_backoff < self.initial_backoff:
            raise ValueError("RetryPolicy.max_backoff (%r) < initial_backoff (%r)"
                             % (self.max_backoff, self.initial_backoff))
        if not self.multiplier >= 1:
            raise ValueError("RetryPolicy.multiplier must be >= 1, not %r" % (self.multiplier,))
        if not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy.jitter must be in [0, 1], not %r" % (self.jitter,))

    def backoff(self, attempt, rng=random):
        """Seconds to wait after failed attempt `attempt` (1-based)."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return base * rng.uniform(1 - self.jitter, 1 + self.jitter)


NO_RETRY = RetryPolicy(max_attempts=1)


def _pem(name, value):
    """PEM bytes from bytes (the PEM itself) or a str / PathLike (a file to read)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (str, os.PathLike)):
        try:
            with open(value, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError("TLS.%s: cannot read %s: %s" % (name, value, e)) from None
    raise TypeError("TLS.%s must be PEM bytes or a file path, not %s"
                    % (name, type(value).__name__))


@dataclass(frozen=True)
class TLS:
    """TLS for the channel: `root_certificates` (None = the system roots), and for
    mutual TLS `certificate_chain` + `private_key`. Each is PEM bytes or a file path.
    `server_name` overrides the name checked against the server certificate (when the
    address is an IP or a per-pod DNS name the certificate does not list)."""
    root_certificates: Union[bytes, str, None] = None
    certificate_chain: Union[bytes, str, None] = None
    private_key: Union[bytes, str, None] = None
    server_name: Optional[str] = None

    def __post_init__(self):
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("TLS: give both certificate_chain and private_key (mutual TLS) "
                             "or neither")

    def credentials(self):
        return grpc.ssl_channel_credentials(
            root_certificates=_pem("root_certificates", self.root_certificates),
            private_key=_pem("private_key", self.private_key),
            certificate_chain=_pem("certificate_chain", self.certificate_chain))

    def channel_options(self):
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []
