"""Typed values the client returns and accepts (plain dataclasses, no protobuf).

Results are built from the server's messages by `from_proto`; inputs
(`CompressionConfig`, `ChatMessage`, `ToolCall`) are turned into messages by
`to_proto`. Every field of echokv.proto's messages is here under the same name, except
timestamps (`created_unix_ms` -> `created_unix_ms` and a `created` datetime property)
and the finish reason (an enum name in lower case: "length", "eos", "stop_token",
"stop_string").
"""

import dataclasses
import datetime
import json
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from .v1 import echokv_pb2 as pb

__all__ = [
    "CompressionConfig", "ToolCall", "ChatMessage", "PhaseTime", "CompressionReport",
    "Session", "Progress", "ModelInfo", "Limits", "ServerInfo", "TopLogprob",
    "TokenLogprob", "GenerateDelta", "GenerateResult", "KvGroupCache", "LayerCache",
    "CacheInspection", "CompressResult", "session_owner", "SESSION_ID_RE",
]

# (<dns-label>.)?<32 lowercase hex>: echokv.proto's session id grammar.
SESSION_ID_RE = re.compile(r"^(?:([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)\.)?([0-9a-f]{32})$")


def session_owner(session_id):
    """The owner replica named by a session id's prefix ("echokv-2.<hex>" -> "echokv-2"),
    or None for an unprefixed (or malformed: the server will say so) id."""
    m = SESSION_ID_RE.match(session_id or "")
    return m.group(1) if m else None


def _opt(message, name):
    """The value of an `optional` proto field, or None when unset."""
    return getattr(message, name) if message.HasField(name) else None


@dataclass(frozen=True)
class CompressionConfig:
    """CompressionConfig of echokv.proto; None = the server default."""
    policy: Optional[str] = None
    budget: Optional[int] = None
    lookahead: Optional[int] = None
    workspace: Optional[int] = None
    window: Optional[int] = None
    bootstrap: Optional[str] = None
    repair: Optional[bool] = None
    snapkv_window: Optional[int] = None
    snapkv_kernel: Optional[int] = None
    memory: Optional[str] = None  # "tiered" or "evict"
    cache_dtype: Optional[str] = None  # "float32" or "int8": storage of the retained tier
    target_mass: Optional[float] = None  # (0, 1]: keep per layer the fewest entries holding this mass, <= budget

    FIELDS = ("policy", "budget", "lookahead", "workspace", "window", "bootstrap", "repair",
              "snapkv_window", "snapkv_kernel", "memory", "cache_dtype", "target_mass")

    @classmethod
    def of(cls, value=None, **overrides):
        """A config from None, a CompressionConfig or a mapping, with `overrides` (None
        values ignored) on top. Unknown names raise TypeError naming them."""
        if value is None:
            base = {}
        elif isinstance(value, CompressionConfig):
            base = dataclasses.asdict(value)
        elif isinstance(value, dict):
            base = dict(value)
        else:
            raise TypeError("compression must be a CompressionConfig or a dict, not %s"
                            % type(value).__name__)
        base.update({k: v for k, v in overrides.items() if v is not None})
        unknown = sorted(set(base) - set(cls.FIELDS))
        if unknown:
            raise TypeError("unknown compression field(s) %s; known: %s"
                            % (", ".join(unknown), ", ".join(cls.FIELDS)))
        return cls(**base)

    def to_proto(self):
        message = pb.CompressionConfig()
        for name in self.FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(message, name, value)
        return message

    @classmethod
    def from_proto(cls, m):
        return cls(**{name: _opt(m, name) for name in cls.FIELDS})


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant message (OpenAI shape)."""
    id: str = ""
    function_name: str = ""
    arguments_json: str = ""
    type: str = "function"

    @classmethod
    def of(cls, value):
        """From a ToolCall or an OpenAI dict {"id", "type", "function": {"name",
        "arguments"}} (arguments as a JSON text or an object)."""
        if isinstance(value, ToolCall):
            return value
        if not isinstance(value, dict):
            raise TypeError("a tool call must be a ToolCall or a dict, not %s"
                            % type(value).__name__)
        function = value.get("function") or {}
        arguments = function.get("arguments", value.get("arguments_json", ""))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return cls(id=value.get("id", ""), type=value.get("type", "function"),
                   function_name=function.get("name", value.get("function_name", "")),
                   arguments_json=arguments)

    def to_proto(self):
        return pb.ToolCall(id=self.id, type=self.type, function_name=self.function_name,
                           arguments_json=self.arguments_json)


@dataclass(frozen=True)
class ChatMessage:
    """One chat message (OpenAI shape), rendered by the model's chat template."""
    role: str
    content: str = ""
    name: str = ""
    tool_calls: Tuple[ToolCall, ...] = ()
    tool_call_id: str = ""

    @classmethod
    def of(cls, value, index=0):
        """From a ChatMessage or an OpenAI-style dict; errors name `chat[index]`."""
        if isinstance(value, ChatMessage):
            return value
        if not isinstance(value, dict):
            raise TypeError("chat[%d] must be a ChatMessage or a dict, not %s"
                            % (index, type(value).__name__))
        if not isinstance(value.get("role"), str) or not value["role"]:
            raise ValueError("chat[%d] needs a 'role'" % index)
        content = value.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ValueError("chat[%d].content must be a string (multi-part content is not "
                             "supported)" % index)
        return cls(role=value["role"], content=content, name=value.get("name") or "",
                   tool_calls=tuple(ToolCall.of(c) for c in value.get("tool_calls") or ()),
                   tool_call_id=value.get("tool_call_id") or "")

    @classmethod
    def from_proto(cls, m):
        return cls(role=m.role, content=m.content, name=m.name,
                   tool_calls=tuple(ToolCall(id=c.id, function_name=c.function_name,
                                             arguments_json=c.arguments_json, type=c.type or "function")
                                    for c in m.tool_calls),
                   tool_call_id=m.tool_call_id)

    def to_proto(self):
        return pb.ChatMessage(role=self.role, content=self.content, name=self.name,
                              tool_calls=[c.to_proto() for c in self.tool_calls],
                              tool_call_id=self.tool_call_id)

    def to_dict(self):
        """The OpenAI-style dict (what agent frameworks pass around)."""
        d = {"role": self.role, "content": self.content}
        if self.name:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function_name, "arguments": c.arguments_json}}
                for c in self.tool_calls]
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    seconds: float


@dataclass(frozen=True)
class CompressionReport:
    """What one compression did (echokv.proto CompressionReport)."""
    config: CompressionConfig
    context_tokens: int
    num_layers: int
    num_kv_heads: int
    retained_per_layer: Tuple[int, ...]
    retained_entries: int
    total_entries: int
    retained_kv_bytes: int
    full_kv_bytes: int
    phases: Tuple[PhaseTime, ...]
    forward_passes: int
    scoring_passes: int
    evicted: bool
    overlap_w1_w2: float
    overlap_w1_final: float
    overlap_w2_final: float
    lookahead_tokens: Tuple[int, ...]
    total_seconds: float
    lookahead_seconds: float
    # The fidelity signal (docs/ALGORITHM.md §7): per layer and KV group
    # (retained_mass[layer * num_kv_heads + group]) the share of the probe queries'
    # attention mass on the kept entries; 1 = all kept, -1 = not measured.
    retained_mass: Tuple[float, ...] = ()
    retained_mass_mean: float = -1.0
    retained_mass_min: float = -1.0

    @classmethod
    def from_proto(cls, m):
        return cls(
            config=CompressionConfig.from_proto(m.config), context_tokens=m.context_tokens,
            num_layers=m.num_layers, num_kv_heads=m.num_kv_heads,
            retained_per_layer=tuple(m.retained_per_layer),
            retained_entries=m.retained_entries, total_entries=m.total_entries,
            retained_kv_bytes=m.retained_kv_bytes, full_kv_bytes=m.full_kv_bytes,
            phases=tuple(PhaseTime(p.phase, p.seconds) for p in m.phases),
            forward_passes=m.forward_passes, scoring_passes=m.scoring_passes,
            evicted=m.evicted, overlap_w1_w2=m.overlap_w1_w2,
            overlap_w1_final=m.overlap_w1_final, overlap_w2_final=m.overlap_w2_final,
            lookahead_tokens=tuple(m.lookahead_tokens), total_seconds=m.total_seconds,
            lookahead_seconds=m.lookahead_seconds, retained_mass=tuple(m.retained_mass),
            retained_mass_mean=m.retained_mass_mean, retained_mass_min=m.retained_mass_min)


def _datetime(unix_ms):
    return datetime.datetime.fromtimestamp(unix_ms / 1000.0, tz=datetime.timezone.utc)


@dataclass(frozen=True)
class Session:
    """A session's state (echokv.proto Session)."""
    id: str
    tokens_seen: int
    retained_entries: int
    retained_kv_bytes: int
    full_kv_bytes: int
    bytes_saved: int
    compression_ratio: float
    compression: CompressionConfig
    last_report: Optional[CompressionReport]
    created_unix_ms: int
    last_used_unix_ms: int
    ttl_seconds: int
    busy: bool
    memory: str
    hot_kv_bytes: int
    cold_kv_bytes: int
    # Chat sessions: the conversation so far (chat input and committed replies).
    messages: Tuple["ChatMessage", ...] = ()
    # get(include_tokens=True): every token the session holds, in order.
    tokens: Tuple[int, ...] = ()
    # last_report.retained_mass_mean (-1 = not measured).
    retained_mass: float = -1.0

    @property
    def owner(self):
        """The replica named by the id's prefix, or None."""
        return session_owner(self.id)

    @property
    def created(self):
        return _datetime(self.created_unix_ms)

    @property
    def last_used(self):
        return _datetime(self.last_used_unix_ms)

    @classmethod
    def from_proto(cls, m):
        return cls(
            id=m.id, tokens_seen=m.tokens_seen, retained_entries=m.retained_entries,
            retained_kv_bytes=m.retained_kv_bytes, full_kv_bytes=m.full_kv_bytes,
            bytes_saved=m.bytes_saved, compression_ratio=m.compression_ratio,
            compression=CompressionConfig.from_proto(m.compression),
            last_report=(CompressionReport.from_proto(m.last_report)
                         if m.HasField("last_report") else None),
            created_unix_ms=m.created_unix_ms, last_used_unix_ms=m.last_used_unix_ms,
            ttl_seconds=m.ttl_seconds, busy=m.busy, memory=m.memory,
            hot_kv_bytes=m.hot_kv_bytes, cold_kv_bytes=m.cold_kv_bytes,
            messages=tuple(ChatMessage.from_proto(x) for x in m.messages),
            tokens=tuple(m.tokens), retained_mass=m.retained_mass)


@dataclass(frozen=True)
class Progress:
    """One progress event of CreateSession / AppendToSession."""
    phase: str  # "tokenize", "prefill" (done/total in tokens) or a policy phase
    done: int
    total: int
    elapsed_seconds: float

    @classmethod
    def from_proto(cls, m):
        return cls(m.phase, m.done, m.total, m.elapsed_seconds)


@dataclass(frozen=True)
class ModelInfo:
    model_type: str
    path: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_context: int
    tokenizer: str
    chat_template: bool
    kv_bytes_per_token: int

    @classmethod
    def from_proto(cls, m):
        return cls(**{f.name: getattr(m, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Limits:
    max_context_tokens: int
    max_new_tokens: int
    max_sessions: int
    max_kv_bytes: int
    session_ttl_seconds: int
    max_session_ttl_seconds: int
    max_concurrent_streams: int
    max_request_bytes: int
    max_cold_bytes: int

    @classmethod
    def from_proto(cls, m):
        return cls(**{f.name: getattr(m, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ServerInfo:
    version: str
    model: ModelInfo
    device: str
    dtype: str
    policies: Tuple[str, ...]
    default_compression: CompressionConfig
    limits: Limits
    live_sessions: int
    live_retained_kv_bytes: int
    live_cold_kv_bytes: int
    replica_id: str
    durable: bool

    @classmethod
    def from_proto(cls, m):
        return cls(
            version=m.version, model=ModelInfo.from_proto(m.model), device=m.device,
            dtype=m.dtype, policies=tuple(m.policies),
            default_compression=CompressionConfig.from_proto(m.default_compression),
            limits=Limits.from_proto(m.limits), live_sessions=m.live_sessions,
            live_retained_kv_bytes=m.live_retained_kv_bytes,
            live_cold_kv_bytes=m.live_cold_kv_bytes, replica_id=m.replica_id,
            durable=m.durable)


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log-probability and the `top_logprobs` best alternatives."""
    token_id: int
    logprob: float
    top: Tuple[TopLogprob, ...] = ()

    @classmethod
    def from_proto(cls, m):
        return cls(m.token_id, m.logprob, tuple(TopLogprob(a.token_id, a.logprob) for a in m.top))


@dataclass(frozen=True)
class GenerateDelta:
    """One streamed Generate message: a text delta (complete UTF-8 characters), the ids
    it came from and (when asked) their logprobs."""
    text: str
    token_ids: Tuple[int, ...]
    logprobs: Tuple[TokenLogprob, ...] = ()

    @classmethod
    def from_proto(cls, m):
        return cls(m.text, tuple(m.token_ids),
                   tuple(TokenLogprob.from_proto(x) for x in m.logprobs))


_FINISH = {
    pb.GenerateResponse.Final.LENGTH: "length",
    pb.GenerateResponse.Final.EOS: "eos",
    pb.GenerateResponse.Final.STOP_TOKEN: "stop_token",
    pb.GenerateResponse.Final.STOP_STRING: "stop_string",
}


@dataclass(frozen=True)
class GenerateResult:
    """A whole generation: the concatenated deltas plus the final summary."""
    text: str
    token_ids: Tuple[int, ...]
    logprobs: Tuple[TokenLogprob, ...]
    finish_reason: str  # "length", "eos", "stop_token", "stop_string" ("" = unspecified)
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_seconds: float
    tokens_per_second: float
    total_seconds: float
    session: Optional[Session]  # commit=True: the updated session

    @classmethod
    def from_parts(cls, text, token_ids, logprobs, final):
        return cls(
            text=text, token_ids=tuple(token_ids), logprobs=tuple(logprobs),
            finish_reason=_FINISH.get(final.finish_reason, ""),
            prompt_tokens=final.prompt_tokens, generated_tokens=final.generated_tokens,
            time_to_first_token_seconds=final.time_to_first_token_seconds,
            tokens_per_second=final.tokens_per_second, total_seconds=final.total_seconds,
            session=Session.from_proto(final.session) if final.HasField("session") else None)


@dataclass(frozen=True)
class KvGroupCache:
    group: int
    retained: int
    positions: Tuple[int, ...]
    kv_bytes: int
    retained_mass: float = -1.0  # the last compression's, for this layer and group


@dataclass(frozen=True)
class LayerCache:
    layer: int
    groups: Tuple[KvGroupCache, ...]
    retained: int
    kv_bytes: int

    @classmethod
    def from_proto(cls, m):
        return cls(m.layer, tuple(KvGroupCache(g.group, g.retained, tuple(g.positions),
                                               g.kv_bytes, g.retained_mass) for g in m.groups),
                   m.retained, m.kv_bytes)


@dataclass(frozen=True)
class CacheInspection:
    """InspectCache: what each layer and KV group holds."""
    session: Session
    layers: Tuple[LayerCache, ...]
    total_retained_entries: int
    total_kv_bytes: int
    full_equivalent_kv_bytes: int
    position_bytes: int
    last_report: Optional[CompressionReport]
    memory: str
    cold_kv_bytes: int

    @classmethod
    def from_proto(cls, m):
        return cls(
            session=Session.from_proto(m.session),
            layers=tuple(LayerCache.from_proto(x) for x in m.layers),
            total_retained_entries=m.total_retained_entries, total_kv_bytes=m.total_kv_bytes,
            full_equivalent_kv_bytes=m.full_equivalent_kv_bytes,
            position_bytes=m.position_bytes,
            last_report=(CompressionReport.from_proto(m.last_report)
                         if m.HasField("last_report") else None),
            memory=m.memory, cold_kv_bytes=m.cold_kv_bytes)


@dataclass(frozen=True)
class CompressResult:
    """Compress: the positions each layer/group keeps, and the report."""
    layers: Tuple[LayerCache, ...]
    report: CompressionReport
    context_tokens: int

    @classmethod
    def from_proto(cls, m):
        return cls(tuple(LayerCache.from_proto(x) for x in m.layers),
                   CompressionReport.from_proto(m.report), m.context_tokens)
