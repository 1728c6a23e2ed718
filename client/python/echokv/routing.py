"""Owner-aware routing: which address each request goes to.

A session id may name its owner replica: ``echokv-2.<32 hex>`` lives on replica
``echokv-2`` (echokv.proto, ``--replica_id``). Given the headless Service of a
StatefulSet, the owner's address is its per-pod DNS name::

    Router(headless_service="echokv-headless.ns.svc.cluster.local", port=50051)
    # "echokv-2.0f3c...": "echokv-2.echokv-headless.ns.svc.cluster.local:50051"

or an explicit map (tests, a fixed fleet): ``Router(replicas={"echokv-0": "10.0.0.5:50051"})``.

* A request for a session goes to (in this order) the owner learned from an
  ``x-echokv-owner`` hint, the replica its id's prefix names, the address that created
  it (unprefixed ids created through this client), else the first default target.
* A new session (CreateSession, ImportSession) goes to the default targets in turn
  (round robin). With a headless Service and no targets, the default target is
  ``dns:///<headless>:<port>`` with gRPC's round_robin balancing over its pods.
* Every request for a session carries the ``x-echokv-session: <id>`` metadata, so a
  gateway in front (Envoy, issue 11) can route on it too.
* After a scale-down a session may live on an *heir* of its owner (the drain of
  ``echokv-cli drain`` moves the sessions of pod ``name-j`` to the first remaining of
  ``name-(j/2)``, ``name-(j/4)``, ..., ``name-0``, ids kept): ``chain(id)`` lists the
  owner's and its heirs' addresses in that order, for the client to walk when the owner
  answers NOT_FOUND or cannot be reached. Through a gateway (no replica addresses) the
  walk is one more call with ``x-echokv-fallback: heirs``, and the gateway walks them.
"""

import collections
import itertools
import re
import threading

from .types import SESSION_ID_RE, session_owner

__all__ = ["Router", "SESSION_METADATA", "FALLBACK_METADATA", "heir_names"]

SESSION_METADATA = "x-echokv-session"
FALLBACK_METADATA = ("x-echokv-fallback", "heirs")
_ORDINAL_RE = re.compile(r"^(.+)-([0-9]+)$")


def heir_names(owner):
    """``"echokv-5"`` -> ``["echokv-2", "echokv-1", "echokv-0"]``: the pods a scale-down
    drain may have moved its sessions to, in the order they are tried ([] for a name
    without an ordinal)."""
    m = _ORDINAL_RE.match(owner or "")
    if not m:
        return []
    base, j = m.group(1), int(m.group(2))
    out = []
    while j > 0:
        j //= 2
        out.append("%s-%d" % (base, j))
    return out


class Router:
    """Maps session ids and replica names to addresses. Thread-safe."""

    LEARNED_CAPACITY = 4096  # sessions whose address is remembered (LRU)

    def __init__(self, targets=(), replicas=None, headless_service=None, port=50051):
        if isinstance(targets, str):
            targets = [targets]
        self._targets = list(targets)
        self._replicas = dict(replicas or {})
        for name in self._replicas:
            if not SESSION_ID_RE.match(name + "." + "0" * 32):
                raise ValueError("replicas: %r is not a DNS label (lowercase letters, digits, "
                                 "'-')" % (name,))
        self._headless = headless_service.strip(".") if headless_service else None
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError("port must be in 1..65535, not %r" % (port,))
        self._port = port
        self.round_robin_service = False
        if not self._targets:
            if self._headless:
                self._targets = ["dns:///%s:%d" % (self._headless, port)]
                self.round_robin_service = True
            elif self._replicas:
                self._targets = [self._replicas[k] for k in sorted(self._replicas)]
            else:
                raise ValueError("give a target address, replicas= or headless_service=")
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._learned = collections.OrderedDict()  # session id -> address
        self._fallback = collections.OrderedDict()  # session ids found through a gateway's heirs

    @property
    def targets(self):
        return list(self._targets)

    def for_new(self):
        """The address for a new session: the default targets in turn."""
        return self._targets[next(self._next) % len(self._targets)]

    def for_replica(self, name):
        """The address of replica `name`, or None when neither the map nor a headless
        Service names it."""
        if name in self._replicas:
            return self._replicas[name]
        if self._headless:
            return "%s.%s:%d" % (name, self._headless, self._port)
        return None

    def for_session(self, session_id):
        with self._lock:
            learned = self._learned.get(session_id)
            if learned is not None:
                self._learned.move_to_end(session_id)
                return learned
        owner = session_owner(session_id)
        if owner is not None:
            address = self.for_replica(owner)
            if address is not None:
                return address
        return self._targets[0]

    def learn(self, session_id, address):
        """Remembers where a session lives (an owner hint, or where an unprefixed id was
        created)."""
        with self._lock:
            self._learned[session_id] = address
            self._learned.move_to_end(session_id)
            while len(self._learned) > self.LEARNED_CAPACITY:
                self._learned.popitem(last=False)

    def learn_created(self, session_id, address):
        """After Create/Fork/Import at `address`: remembered unless the id's prefix names
        a replica this router can address (then the prefix is authoritative, and
        `address` may be a load-balanced name)."""
        owner = session_owner(session_id)
        if owner is None or self.for_replica(owner) is None:
            self.learn(session_id, address)

    def forget(self, session_id):
        with self._lock:
            self._learned.pop(session_id, None)
            self._fallback.pop(session_id, None)

    def chain(self, session_id):
        """The addresses of the id's owner and its heirs, in walking order; None when
        this router cannot address replicas (a gateway or a plain Service: the walk
        is then the gateway's, asked for with FALLBACK_METADATA)."""
        owner = session_owner(session_id)
        if owner is None or self.for_replica(owner) is None:
            return None
        out = []
        for name in [owner] + heir_names(owner):
            address = self.for_replica(name)
            if address is not None and address not in out:
                out.append(address)
        return out

    def learn_fallback(self, session_id):
        """Remembers that a session was found through a gateway's heirs: its calls then
        carry FALLBACK_METADATA from the start."""
        with self._lock:
            self._fallback[session_id] = True
            self._fallback.move_to_end(session_id)
            while len(self._fallback) > self.LEARNED_CAPACITY:
                self._fallback.popitem(last=False)

    def uses_fallback(self, session_id):
        with self._lock:
            return session_id in self._fallback
