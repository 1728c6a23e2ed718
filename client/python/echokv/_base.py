"""What the sync and asyncio clients share: configuration, metadata, routing decisions."""

import random

from . import errors
from .options import (DEFAULT, DEFAULT_STREAM_IDLE_TIMEOUT, DEFAULT_STREAM_TIMEOUT,
                      DEFAULT_UNARY_TIMEOUT, NO_RETRY, TLS, RetryPolicy, check_timeout)
from .routing import FALLBACK_METADATA, SESSION_METADATA, Router

# Unlimited message sizes: InspectCache with positions and snapshot chunks can be large.
BASE_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # Spread new sessions over every address a name resolves to (a headless Service).
    ("grpc.lb_policy_name", "round_robin"),
)


class ClientBase:
    """Configuration common to Client and AsyncClient (see Client for the arguments)."""

    def __init__(self, target=None, *, replicas=None, headless_service=None, port=50051, gateway=False,
                 timeout=DEFAULT_UNARY_TIMEOUT, stream_timeout=DEFAULT_STREAM_TIMEOUT,
                 stream_idle_timeout=DEFAULT_STREAM_IDLE_TIMEOUT, retry=None, tls=None,
                 token=None, metadata=(), channel_options=(), on_retry=None, rng=None):
        self._router = Router(targets=target or (), replicas=replicas,
                              headless_service=headless_service, port=port)
        self._gateway = bool(gateway)
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

    def _metadata(self, session_id=None, fallback=False):
        metadata = list(self._extra_metadata)
        if session_id:
            metadata.append((SESSION_METADATA, session_id))
        if fallback:
            metadata.append(FALLBACK_METADATA)
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

    def _walk(self, session_id, address, unavailable_ok):
        return RouteWalk(self._router, session_id, address, unavailable_ok, self._gateway)

    def _retry_delay(self, policy, method, attempt, error):
        """Seconds to wait before retrying, or None when `error` is final."""
        if attempt >= policy.max_attempts or error.code not in policy.retry_codes:
            return None
        delay = policy.backoff(attempt, self._rng)
        if self._on_retry is not None:
            self._on_retry(method, attempt, error, delay)
        return delay


class RouteWalk:
    """Where one call about a session goes after an error, before it gives up:

    1. a NOT_FOUND naming another owner (``x-echokv-owner``) goes to that owner;
    2. then the session's owner and its heirs in order (``Router.chain``: a scale-down
       drain moves the sessions of pod j to the first remaining of j/2, j/4, ..., 0),
       each tried once, on NOT_FOUND and, for calls that may be sent twice
       (`unavailable_ok`: idempotent calls, and streams before their first message,
       which the server undoes when cut), on UNAVAILABLE (the pod is gone);
    3. through the chart's gateway (``gateway=True``: no replica addresses here) one
       more call with ``x-echokv-fallback: heirs``: the gateway walks the owner and its
       heirs. (A plain single target gets no such call.)

    A NOT_FOUND at the end when the owner itself could not be reached is reported as
    that UNAVAILABLE (the owner may be restarting with the session on its volume).
    Where the walk found the session is remembered for the next calls.

        walk = client._walk(session_id, address, unavailable_ok=True)
        ... on error: address = walk.next(error); None -> raise walk.final(error)
        ... on success: walk.found(address)
    """

    def __init__(self, router, session_id, address, unavailable_ok, gateway=False):
        self._router = router
        self._gateway = gateway
        self._session_id = session_id
        self._tried = [address]
        self._unavailable_ok = unavailable_ok
        self.fallback = bool(session_id) and router.uses_fallback(session_id)
        self._unreachable = None  # the owner's UNAVAILABLE, when it could not be reached

    def next(self, error):
        """The address to try next, or None (then raise final(error))."""
        if not self._session_id:
            return None
        if isinstance(error, errors.Unavailable):
            if not self._unavailable_ok:
                return None
            if self._unreachable is None:
                self._unreachable = error
        elif not isinstance(error, errors.NotFound):
            return None
        if isinstance(error, errors.NotFound) and error.owner:
            owner = self._router.for_replica(error.owner)
            if owner is not None and owner not in self._tried:
                self._tried.append(owner)
                return owner
        chain = self._router.chain(self._session_id)
        if chain is None:
            if self.fallback or not self._gateway:
                return None
            self.fallback = True
            return self._tried[0]
        for address in chain:
            if address not in self._tried:
                self._tried.append(address)
                return address
        return None

    def final(self, error):
        if self._unreachable is not None and isinstance(error, errors.NotFound):
            return self._unreachable
        return error

    def found(self, address):
        """The call succeeded at `address`: remember it when the walk moved."""
        if not self._session_id:
            return
        if self.fallback:
            self._router.learn_fallback(self._session_id)
        elif len(self._tried) > 1:
            self._router.learn(self._session_id, address)
