"""What the sync and asyncio clients share: configuration, metadata, routing decisions."""

import random

from . import errors
from .options import (DEFAULT, DEFAULT_STREAM_IDLE_TIMEOUT, DEFAULT_STREAM_TIMEOUT,
                      DEFAULT_UNARY_TIMEOUT, NO_RETRY, TLS, RetryPolicy, check_timeout)
from .routing import SESSION_METADATA, Router

# Unlimited message sizes: InspectCache with positions and snapshot chunks can be large.
BASE_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # Spread new sessions over every address a name resolves to (a headless Service).
    ("grpc.lb_policy_name", "round_robin"),
)


class ClientBase:
    """Configuration common to Client and AsyncClient (see Client for the arguments)."""

    def __init__(self, target=None, *, replicas=None, headless_service=None, port=50051,
                 timeout=DEFAULT_UNARY_TIMEOUT, stream_timeout=DEFAULT_STREAM_TIMEOUT,
                 stream_idle_timeout=DEFAULT_STREAM_IDLE_TIMEOUT, retry=None, tls=None,
                 token=None, metadata=(), channel_options=(), on_retry=None, rng=None):
        self._router = Router(targets=target or (), replicas=replicas,
                              headless_service=headless_service, port=port)
        self._timeout = check_timeout("timeout", timeout)
        self._stream_timeout = check_timeout("stream_timeout", stream_timeout)
        self._stream_idle_timeout = check_timeout("stream_idle_timeout", stream_idle_timeout)
        if retry is None:
            retry = RetryPolicy()
        elif retry is False:
            retry = NO_RETRY
        if not isinstance(retry, RetryPolicy):
            raise TypeError("retry must be a RetryPolicy, None (default) or False, not %s"
                            % type(retry).__name__)
        self._retry = retry
        if tls is True:
            tls = TLS()
        if tls is not None and not isinstance(tls, TLS):
            raise TypeError("tls must be a TLS, True (system roots) or None, not %s"
                            % type(tls).__name__)
        self._tls = tls
        if token is not None and not (isinstance(token, str) or callable(token)):
            raise TypeError("token must be a str or a callable returning one")
        self._token = token
        self._extra_metadata = tuple(metadata)
        options = dict(BASE_CHANNEL_OPTIONS)
        options.update(dict(channel_options))
        if tls is not None:
            options.update(dict(tls.channel_options()))
        self._channel_options = list(options.items())
        self._on_retry = on_retry
        self._rng = rng or random.Random()

    @property
    def router(self):
        return self._router

    def _metadata(self, session_id=None):
        metadata = list(self._extra_metadata)
        if session_id:
            metadata.append((SESSION_METADATA, session_id))
        if self._token is not None:
            token = self._token() if callable(self._token) else self._token
            metadata.append(("authorization", "Bearer " + token))
        return metadata

    def _unary_deadline(self, timeout):
        return self._timeout if timeout is DEFAULT else check_timeout("timeout", timeout)

    def _stream_deadlines(self, timeout, idle_timeout):
        t = self._stream_timeout if timeout is DEFAULT else check_timeout("timeout", timeout)
        i = (self._stream_idle_timeout if idle_timeout is DEFAULT
             else check_timeout("idle_timeout", idle_timeout))
        return t, i

    def _address(self, session_id=None, replica=None):
        if replica is not None:
            address = self._router.for_replica(replica)
            if address is None:
                raise ValueError("replica %r: not in replicas= and no headless_service= to "
                                 "derive its address" % (replica,))
            return address
        if session_id:
            return self._router.for_session(session_id)
        return self._router.for_new()

    def _redirect(self, error, session_id, address, redirected):
        """The owner's address when `error` is a NOT_FOUND naming another owner and the
        call has not been redirected yet; else None. Remembers the owner."""
        if redirected or not session_id or not isinstance(error, errors.NotFound):
            return None
        if not error.owner:
            return None
        owner_address = self._router.for_replica(error.owner)
        if owner_address is None or owner_address == address:
            return None
        self._router.learn(session_id, owner_address)
        return owner_address

    def _retry_delay(self, policy, method, attempt, error):
        """Seconds to wait before retrying, or None when `error` is final."""
        if attempt >= policy.max_attempts or error.code not in policy.retry_codes:
            return None
        delay = policy.backoff(attempt, self._rng)
        if self._on_retry is not None:
            self._on_retry(method, attempt, error, delay)
        return delay
