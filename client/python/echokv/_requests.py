"""Request builders shared by the sync and asyncio clients (no I/O here)."""

import json
import os

from .types import ChatMessage, CompressionConfig
from .v1 import echokv_pb2 as pb

IMPORT_CHUNK_BYTES = 1 << 20  # ImportSession data message size


def build_input(text=None, ids=None, chat=None, tools=None, add_generation_prompt=None,
                add_special_tokens=None):
    """echokv.v1.Input from exactly one of text, ids (token ids) or chat (messages)."""
    given = [name for name, value in (("text", text), ("ids", ids), ("chat", chat))
             if value is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of text=, ids=, chat= (got %s)"
                         % (", ".join(given) or "none"))
    message = pb.Input()
    if text is not None:
        if not isinstance(text, str):
            raise TypeError("text must be a str, not %s" % type(text).__name__)
        message.text = text
    elif ids is not None:
        message.tokens.ids.extend(int(i) for i in ids)
    else:
        if isinstance(chat, (dict, ChatMessage)):
            chat = [chat]
        messages = [ChatMessage.of(m, i) for i, m in enumerate(chat)]
        message.chat.messages.extend(m.to_proto() for m in messages)
        if add_generation_prompt is not None:
            message.chat.add_generation_prompt = bool(add_generation_prompt)
        if tools is not None:
            message.chat.tools_json = tools if isinstance(tools, str) else json.dumps(
                list(tools), ensure_ascii=False)
    if chat is None and (tools is not None or add_generation_prompt is not None):
        raise ValueError("tools= and add_generation_prompt= apply to chat= input only")
    if add_special_tokens is not None:
        message.add_special_tokens = bool(add_special_tokens)
    return message


def create_request(input_message, compression, compression_fields, ttl_seconds):
    request = pb.CreateSessionRequest(
        input=input_message,
        compression=CompressionConfig.of(compression, **compression_fields).to_proto())
    if ttl_seconds is not None:
        request.ttl_seconds = int(ttl_seconds)
    return request


_SAMPLING = ("temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty",
             "presence_penalty", "frequency_penalty", "top_logprobs")


def generate_request(session_id, max_tokens=None, stop=(), stop_token_ids=(),
                     ignore_eos=False, commit=False, logprobs=False, **sampling):
    """GenerateRequest; `sampling` takes the SamplingParams fields (None = unset)."""
    unknown = sorted(set(sampling) - set(_SAMPLING))
    if unknown:
        raise TypeError("generate() got unknown argument(s) %s" % ", ".join(unknown))
    if isinstance(stop, str):
        stop = [stop]
    request = pb.GenerateRequest(session_id=session_id, stop=list(stop),
                                 stop_token_ids=[int(i) for i in stop_token_ids],
                                 ignore_eos=bool(ignore_eos), commit=bool(commit))
    if max_tokens is not None:
        request.max_tokens = int(max_tokens)
    request.sampling.logprobs = bool(logprobs or sampling.get("top_logprobs"))
    for name, value in sampling.items():
        if value is not None:
            setattr(request.sampling, name, value)
    return request


def fork_request(session_id, ttl_seconds):
    request = pb.ForkSessionRequest(session_id=session_id)
    if ttl_seconds is not None:
        request.ttl_seconds = int(ttl_seconds)
    return request


def import_header(keep_id, ttl_seconds):
    header = pb.ImportSessionRequest.Header(keep_id=bool(keep_id))
    if ttl_seconds is not None:
        header.ttl_seconds = int(ttl_seconds)
    return pb.ImportSessionRequest(header=header)


def open_import_source(source):
    """Normalises an import source to (iterable of bytes, file to close or None).

    bytes-like: sent in IMPORT_CHUNK_BYTES pieces; a str / PathLike: that file (opened
    now, so a missing file fails before the call); a binary file object: read in
    pieces; any other iterable: its bytes chunks as they come.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        return (bytes(view[i:i + IMPORT_CHUNK_BYTES])
                for i in range(0, len(view), IMPORT_CHUNK_BYTES)), None
    if isinstance(source, (str, os.PathLike)):
        f = open(source, "rb")
        return _read_chunks(f), f
    if hasattr(source, "read"):
        return _read_chunks(source), None
    if hasattr(source, "__iter__") or hasattr(source, "__aiter__"):
        return source, None
    raise TypeError("import source must be bytes, a file path, a binary file or an iterable "
                    "of bytes, not %s" % type(source).__name__)


def _read_chunks(f):
    while True:
        chunk = f.read(IMPORT_CHUNK_BYTES)
        if not chunk:
            return
        if not isinstance(chunk, bytes):
            raise TypeError("import source file must be opened in binary mode")
        yield chunk


def import_requests(header, chunks):
    yield header
    for chunk in chunks:
        yield pb.ImportSessionRequest(data=bytes(chunk))


async def aimport_requests(header, chunks):
    yield header
    if hasattr(chunks, "__aiter__"):
        async for chunk in chunks:
            yield pb.ImportSessionRequest(data=bytes(chunk))
    else:
        for chunk in chunks:
            yield pb.ImportSessionRequest(data=bytes(chunk))
