"""`Memory`: a conversation held in one echokv session, for agent frameworks.

    import echokv

    client = echokv.Client("localhost:50051")
    memory = echokv.Memory(client, compression={"policy": "echokv", "budget": 256},
                           memory="tiered")
    memory.add([{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Hello Ada."}])
    for text in memory.ask("What is my name?"):        # streamed; committed to the session
        print(text, end="", flush=True)
    branch = memory.fork()                            # explore without touching `memory`
    snapshot = memory.export()                        # bytes (or export(path))
    restored = echokv.Memory.import_(client, snapshot)

The session is created on the first add() / ask() (chat messages rendered by the
model's chat template, so the server must have one: ServerInfo.model.chat_template).
add() appends chat messages without a generation prompt; ask() appends the question as
a user message with the assistant header and generates with commit=True, so the answer
becomes part of the session too. `messages` is the local transcript (OpenAI-shaped
dicts) of what this object added and received; a forked Memory copies it, an imported
one starts empty.

AsyncMemory is the same over an AsyncClient (`await memory.add(...)`,
`async for text in await memory.ask(...)`).
"""

from .types import ChatMessage

__all__ = ["Memory", "AsyncMemory"]


def _messages(messages):
    """A list of ChatMessage from one message (dict / ChatMessage / str = user) or many."""
    if isinstance(messages, (str, dict, ChatMessage)):
        messages = [messages]
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, str):
            m = {"role": "user", "content": m}
        out.append(ChatMessage.of(m, i))
    if not out:
        raise ValueError("add(): no messages")
    return out


class _MemoryBase:
    def __init__(self, client, compression=None, memory="tiered", ttl_seconds=None,
                 session_id=None, tools=None, generate=None, **compression_fields):
        self._client = client
        self._compression = compression
        self._compression_fields = dict(compression_fields)
        if memory is not None:
            self._compression_fields["memory"] = memory
        self._ttl_seconds = ttl_seconds
        self._tools = tools
        self._generate = dict(generate or {})  # default Generate arguments of ask()
        self._session_id = session_id
        self.messages = []

    @property
    def session_id(self):
        """The session's id (None until the first add() / ask())."""
        return self._session_id

    def _create_kwargs(self, chat, add_generation_prompt):
        kwargs = dict(chat=chat, add_generation_prompt=add_generation_prompt,
                      compression=self._compression, ttl_seconds=self._ttl_seconds,
                      **self._compression_fields)
        if self._tools is not None:
            kwargs["tools"] = self._tools
        return kwargs

    def _append_kwargs(self, chat, add_generation_prompt):
        kwargs = dict(chat=chat, add_generation_prompt=add_generation_prompt)
        if self._tools is not None:
            kwargs["tools"] = self._tools
        return kwargs

    def _generate_kwargs(self, overrides):
        kwargs = dict(self._generate)
        kwargs.update(overrides)
        kwargs["commit"] = True
        return kwargs

    def _require_session(self, what):
        if self._session_id is None:
            raise ValueError("Memory.%s(): no session yet (call add() or ask() first)" % what)

    def _child(self, session_id):
        child = type(self).__new__(type(self))
        child.__dict__.update(self.__dict__)
        child._session_id = session_id
        child.messages = [dict(m) for m in self.messages]
        return child


class _Answer:
    """ask(stream=True): iterate for text; `result` is the GenerateResult at the end."""

    def __init__(self, memory, stream):
        self._memory = memory
        self._stream = stream
        self.result = None

    def __iter__(self):
        for delta in self._stream:
            if delta.text:
                yield delta.text
        self.result = self._stream.result
        self._memory.messages.append({"role": "assistant", "content": self.result.text})

    def cancel(self):
        self._stream.cancel()


class Memory(_MemoryBase):
    """A conversation in one session over a sync echokv.Client.

    Args:
      client: an echokv.Client.
      compression: CompressionConfig or dict for the session (policy, budget, ...);
        its fields may also be given as keywords.
      memory: "tiered" (default) or "evict" (CompressionConfig.memory).
      ttl_seconds: the session's idle expiry (server default when None).
      session_id: continue an existing session instead of creating one.
      tools: tool definitions (a list or JSON text) passed to the chat template.
      generate: default keyword arguments of ask()'s generation (max_tokens, ...).
    """

    def add(self, messages, *, on_progress=None):
        """Adds chat messages (one or a list; a str is a user message). Creates the
        session on the first call. Returns the Session."""
        chat = _messages(messages)
        if self._session_id is None:
            session = self._client.create(on_progress=on_progress,
                                          **self._create_kwargs(chat, False))
            self._session_id = session.id
        else:
            session = self._client.append(self._session_id, on_progress=on_progress,
                                          **self._append_kwargs(chat, False))
        self.messages.extend(m.to_dict() for m in chat)
        return session

    def ask(self, question, stream=True, **generate_kwargs):
        """Appends `question` as a user message (with the assistant header) and
        generates the answer with commit=True. stream=True: an iterator of text pieces
        (its `.result` is the GenerateResult once consumed); stream=False: the text."""
        chat = _messages({"role": "user", "content": question})
        if self._session_id is None:
            session = self._client.create(**self._create_kwargs(chat, True))
            self._session_id = session.id
        else:
            self._client.append(self._session_id, **self._append_kwargs(chat, True))
        self.messages.append(chat[0].to_dict())
        answer = _Answer(self, self._client.generate(
            self._session_id, **self._generate_kwargs(generate_kwargs)))
        if stream:
            return answer
        for _ in answer:
            pass
        return answer.result.text

    def fork(self, *, ttl_seconds=None):
        """A new Memory on a fork of this session (same transcript so far)."""
        self._require_session("fork")
        return self._child(self._client.fork(self._session_id, ttl_seconds=ttl_seconds).id)

    def export(self, path=None):
        """The session's snapshot: bytes, or written to `path` (returns its size)."""
        self._require_session("export")
        if path is not None:
            return self._client.export_to(self._session_id, path)
        return b"".join(self._client.export(self._session_id))

    @classmethod
    def import_(cls, client, source, *, keep_id=False, ttl_seconds=None, replica=None,
                **kwargs):
        """A Memory on a session imported from a snapshot (bytes, path, file, chunks)."""
        session = client.import_(source, keep_id=keep_id, ttl_seconds=ttl_seconds,
                                 replica=replica)
        return cls(client, session_id=session.id, **kwargs)

    def session(self):
        """The session's current state."""
        self._require_session("session")
        return self._client.get(self._session_id)

    def delete(self):
        """Deletes the session (the Memory can start a new one with add())."""
        if self._session_id is not None:
            self._client.delete(self._session_id)
            self._session_id = None


class _AsyncAnswer:
    def __init__(self, memory, stream):
        self._memory = memory
        self._stream = stream
        self.result = None

    async def __aiter__(self):
        async for delta in self._stream:
            if delta.text:
                yield delta.text
        self.result = self._stream.result
        self._memory.messages.append({"role": "assistant", "content": self.result.text})

    def cancel(self):
        self._stream.cancel()


class AsyncMemory(_MemoryBase):
    """Memory over an echokv.AsyncClient; the same methods, awaitable."""

    async def add(self, messages, *, on_progress=None):
        chat = _messages(messages)
        if self._session_id is None:
            session = await self._client.create(on_progress=on_progress,
                                                **self._create_kwargs(chat, False))
            self._session_id = session.id
        else:
            session = await self._client.append(self._session_id, on_progress=on_progress,
                                                **self._append_kwargs(chat, False))
        self.messages.extend(m.to_dict() for m in chat)
        return session

    async def ask(self, question, stream=True, **generate_kwargs):
        """stream=True: returns an async iterable of text pieces; else the text."""
        chat = _messages({"role": "user", "content": question})
        if self._session_id is None:
            session = await self._client.create(**self._create_kwargs(chat, True))
            self._session_id = session.id
        else:
            await self._client.append(self._session_id, **self._append_kwargs(chat, True))
        self.messages.append(chat[0].to_dict())
        answer = _AsyncAnswer(self, self._client.generate(
            self._session_id, **self._generate_kwargs(generate_kwargs)))
        if stream:
            return answer
        async for _ in answer:
            pass
        return answer.result.text

    async def fork(self, *, ttl_seconds=None):
        self._require_session("fork")
        session = await self._client.fork(self._session_id, ttl_seconds=ttl_seconds)
        return self._child(session.id)

    async def export(self, path=None):
        self._require_session("export")
        if path is not None:
            return await self._client.export_to(self._session_id, path)
        return b"".join([chunk async for chunk in self._client.export(self._session_id)])

    @classmethod
    async def import_(cls, client, source, *, keep_id=False, ttl_seconds=None, replica=None,
                      **kwargs):
        session = await client.import_(source, keep_id=keep_id, ttl_seconds=ttl_seconds,
                                       replica=replica)
        return cls(client, session_id=session.id, **kwargs)

    async def session(self):
        self._require_session("session")
        return await self._client.get(self._session_id)

    async def delete(self):
        if self._session_id is not None:
            await self._client.delete(self._session_id)
            self._session_id = None

