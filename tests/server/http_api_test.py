#!/usr/bin/python3
"""The OpenAI-compatible HTTP API of echokv-server (server/doors/http/openai_server.h) and its
/metrics listener, against the real binary on stories260K, with Python's standard
library only (http.client, socket, urllib) for HTTP and the echokv Python client
(client/python, generated stubs) for the gRPC side:

  every endpoint and its OpenAI shapes; SSE parsing (every event is JSON, [DONE] last,
  streamed deltas == the non-streamed text, greedy); usage; logprobs in both shapes,
  equal to the gRPC API's for the same session state; malformed JSON and wrong types
  (400 naming the param), unknown model / session / route, 409 conversation mismatch,
  413; sessions: "new", continued with the whole conversation; a session created over
  gRPC continued by a streamed /v1/chat/completions call and a session created over
  HTTP continued over gRPC, each compared with the other door on a twin session;
  a client that disconnects mid-stream (the generation stops: its commit is rolled
  back, the request counts as 499, the server keeps serving); /metrics and the API
  answering while 30 idle connections are held open; max_concurrent_streams (429) and
  draining on SIGTERM (503); chat on a model without a chat template (400 on messages).

The served model is stories260K from a folder that adds a chat_template.jinja (the
model ships none).

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 tests/server/http_api_test.py \\
        --server-binary build/bin/echokv-server --client client/python

Needs $ECHOKV_TEST_DATA (models/stories260K); exits 77 (ctest: skipped) when unset.
No assertion depends on timing: waits poll for a state with a generous ceiling that
only guards against hangs.
"""

import hashlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import HANG_GUARD_S, wait_until  # noqa: E402

STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in "
    "the park with her friends. One day, she found a small red ball under a big tree.")
IDLE_SCRAPE_CEILING_S = 30
SMALL_SNDBUF = 16384  # --http-send-buffer-bytes: a stalled reader holds its stream back

ARGS = None
SERVER = None
echokv = None


def start_server(extra=(), model=None):
    """echokv-server on loopback with all three doors (insecure unless a tokens file)."""
    return harness.Server(ARGS.server_binary, model or ARGS.model, name="http",
                          insecure="--auth_tokens_file" not in extra,
                          extra=["--http-send-buffer-bytes", str(SMALL_SNDBUF),
                                 "--http-max-body-bytes", "262144"] + list(extra))


# ---- HTTP helpers (standard library only, harness.py) ----

def request(method, path, body=None, headers=None, raw=None, server=None, timeout=HANG_GUARD_S):
    """One request; returns (status, headers {lower-case name: value}, bytes)."""
    return harness.request((server or SERVER).http_port, method, path, body, headers, raw, timeout)


def post(path, body, headers=None, server=None):
    return harness.post_json((server or SERVER).http_port, path, body, headers)


def sse(path, body, headers=None):
    """A streamed request: returns (headers, [event data strings]) after checking the
    SSE framing: every event is one `data:` line followed by a blank line, and the
    stream ends right after `data: [DONE]`."""
    return harness.sse(SERVER.http_port, path, body, headers)


def chunks(events):
    """Every event but [DONE] parsed as JSON (fails on any that is not)."""
    return [json.loads(e) for e in events]


def metric(name, labels=None, server=None):
    return (server or SERVER).metric(name, labels)


def stalled_stream(body, server=None, path="/v1/chat/completions"):
    """Starts a streamed request on a raw socket with a tiny receive buffer and reads
    only the response head and the first event; the caller stops reading (the server
    holds the stream back) and eventually closes the socket."""
    return harness.stalled_stream((server or SERVER).http_port, path, body)[0]


def chat_body(messages, **kw):
    body = {"model": "stories260K", "messages": messages, "temperature": 0}
    body.update(kw)
    return body


def stream_text(events, kind="chat"):
    out = []
    for c in chunks(events):
        for choice in c["choices"]:
            out.append(choice["delta"].get("content", "") if kind == "chat" else choice["text"])
    return "".join(out)


MODEL_DIR = None  # the TemporaryDirectory holding the served model folder


def setUpModule():
    global SERVER, MODEL_DIR
    MODEL_DIR = tempfile.TemporaryDirectory(prefix="echokv-http-model-")
    ARGS.model = harness.model_with_chat_template(ARGS.source_model, MODEL_DIR.name)
    SERVER = start_server()


def tearDownModule():
    SERVER.stop()
    MODEL_DIR.cleanup()


class HttpTestCase(harness.LogOnFailure, unittest.TestCase):
    def failure_server(self):
        return SERVER

    def grpc(self):
        client = echokv.Client("127.0.0.1:%d" % SERVER.grpc_port)
        self.addCleanup(client.close)
        return client

    def assertOpenAiError(self, status, body, want_status, param=None, code=None):
        self.assertEqual(status, want_status, body)
        self.assertEqual(set(body), {"error"}, body)
        err = body["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, err)
        self.assertTrue(err["message"], err)
        self.assertIsInstance(err["type"], str)
        if param is not None:
            self.assertEqual(err["param"], param, err)
        if code is not None:
            self.assertEqual(err["code"], code, err)
        return err


class ModelsTest(HttpTestCase):
    def test_models(self):
        status, _, payload = request("GET", "/v1/models")
        self.assertEqual(status, 200)
        body = json.loads(payload)
        self.assertEqual(body["object"], "list")
        self.assertEqual(len(body["data"]), 1)
        model = body["data"][0]
        self.assertEqual(set(model), {"id", "object", "created", "owned_by"})
        self.assertEqual((model["id"], model["object"]), ("stories260K", "model"))
        for name in ("stories260K", "echokv"):
            status, _, payload = request("GET", "/v1/models/" + name)
            self.assertEqual((status, json.loads(payload)["id"]), (200, "stories260K"))
        status, _, payload = request("GET", "/v1/models/gpt-4")
        self.assertOpenAiError(status, json.loads(payload), 404, "model", "model_not_found")
        status, _, payload = request("GET", "/health")
        self.assertEqual((status, json.loads(payload)), (200, {"status": "ok"}))


class CompletionsTest(HttpTestCase):
    def test_non_streamed_equals_streamed_and_grpc(self):
        body = {"model": "stories260K", "prompt": STORY, "max_tokens": 16, "temperature": 0}
        status, heads, full = post("/v1/completions", body)
        self.assertEqual(status, 200, full)
        self.assertNotIn("x-echokv-session", heads)  # stateless
        self.assertNotIn("session_id", full)
        self.assertTrue(full["id"].startswith("cmpl-"))
        self.assertEqual(full["object"], "text_completion")
        self.assertEqual(full["model"], "stories260K")
        self.assertIsInstance(full["created"], int)
        self.assertEqual(len(full["choices"]), 1)
        choice = full["choices"][0]
        self.assertEqual(set(choice), {"index", "text", "logprobs", "finish_reason"})
        self.assertEqual((choice["index"], choice["logprobs"], choice["finish_reason"]),
                         (0, None, "length"))
        usage = full["usage"]
        self.assertEqual(usage["completion_tokens"], 16)
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + 16)

        # The same prompt over gRPC: the same tokens prefilled, the same greedy text.
        client = self.grpc()
        session = client.create(STORY)
        self.addCleanup(client.delete, session.id)
        self.assertEqual(usage["prompt_tokens"], session.tokens_seen)
        ref = client.generate(session.id, max_tokens=16).collect()
        self.assertEqual(choice["text"], ref.text)

        _, events = sse("/v1/completions", dict(body, stream=True,
                                                stream_options={"include_usage": True}))
        parsed = chunks(events)
        self.assertEqual(len({c["id"] for c in parsed}), 1)
        for c in parsed:
            self.assertEqual((c["object"], c["model"]), ("text_completion", "stories260K"))
            self.assertIn("usage", c)
        *deltas, last_choice, usage_chunk = parsed
        for c in deltas:
            self.assertIsNone(c["choices"][0]["finish_reason"])
            self.assertIsNone(c["usage"])
        self.assertEqual(last_choice["choices"][0]["finish_reason"], "length")
        self.assertEqual(usage_chunk["choices"], [])
        self.assertEqual(usage_chunk["usage"], usage)
        self.assertEqual(stream_text(events[:-1], "completion"), choice["text"])

    def test_token_prompt_and_stop(self):
        client = self.grpc()
        ids = [1, 403, 407, 261, 378]  # BOS + a few stories260K ids
        session = client.create(ids=ids)
        self.addCleanup(client.delete, session.id)
        ref = client.generate(session.id, max_tokens=12).collect()
        status, _, full = post("/v1/completions", {"model": "echokv", "prompt": ids,
                                                   "max_tokens": 12, "temperature": 0})
        self.assertEqual(status, 200, full)
        self.assertEqual(full["choices"][0]["text"], ref.text)
        self.assertEqual(full["usage"]["prompt_tokens"], len(ids))
        # [[ids]] is the same single prompt.
        status, _, nested = post("/v1/completions", {"model": "echokv", "prompt": [ids],
                                                     "max_tokens": 12, "temperature": 0})
        self.assertEqual(nested["choices"][0]["text"], ref.text)
        # A stop string cuts the text before it and finishes with "stop".
        words = ref.text.split()
        self.assertGreater(len(words), 2, ref.text)
        stop = " " + words[2]
        status, _, stopped = post("/v1/completions", {"model": "echokv", "prompt": ids,
                                                      "max_tokens": 12, "temperature": 0,
                                                      "stop": [stop, "zzzz"]})
        self.assertEqual(stopped["choices"][0]["finish_reason"], "stop")
        self.assertEqual(stopped["choices"][0]["text"], ref.text[:ref.text.index(stop)])

    def test_default_max_tokens_is_16(self):
        status, _, full = post("/v1/completions", {"model": "echokv", "prompt": STORY,
                                                   "temperature": 0, "ignore_eos": True})
        self.assertEqual(status, 200, full)
        self.assertEqual(full["usage"]["completion_tokens"], 16)

    def test_seeded_sampling_is_reproducible(self):
        body = {"model": "echokv", "prompt": STORY, "max_tokens": 24, "temperature": 1.0,
                "top_p": 0.9, "top_k": 40, "min_p": 0.01, "presence_penalty": 0.5,
                "frequency_penalty": 0.5, "repetition_penalty": 1.1, "seed": 1234}
        texts = {post("/v1/completions", body)[2]["choices"][0]["text"] for _ in range(2)}
        self.assertEqual(len(texts), 1)


class ChatTest(HttpTestCase):
    MESSAGES = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about Lily and the red ball."}]

    def test_streamed_equals_non_streamed(self):
        body = chat_body(self.MESSAGES, max_tokens=20)
        status, _, full = post("/v1/chat/completions", body)
        self.assertEqual(status, 200, full)
        self.assertTrue(full["id"].startswith("chatcmpl-"))
        self.assertEqual(full["object"], "chat.completion")
        choice = full["choices"][0]
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertIn(choice["finish_reason"], ("stop", "length"))
        text = choice["message"]["content"]
        self.assertTrue(text)
        self.assertEqual(full["usage"]["total_tokens"],
                         full["usage"]["prompt_tokens"] + full["usage"]["completion_tokens"])

        _, events = sse("/v1/chat/completions", dict(body, stream=True))
        parsed = chunks(events)
        self.assertEqual(len({c["id"] for c in parsed}), 1)
        for c in parsed:
            self.assertEqual(c["object"], "chat.completion.chunk")
            self.assertNotIn("usage", c)  # only with stream_options.include_usage
            self.assertEqual(len(c["choices"]), 1)
            self.assertEqual(set(c["choices"][0]), {"index", "delta", "logprobs", "finish_reason"})
        self.assertEqual(parsed[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertEqual(parsed[-1]["choices"][0]["delta"], {})
        self.assertEqual(parsed[-1]["choices"][0]["finish_reason"], choice["finish_reason"])
        for c in parsed[:-1]:
            self.assertIsNone(c["choices"][0]["finish_reason"])
        self.assertEqual(stream_text(events), text)

    def test_content_parts_and_developer_role(self):
        plain = post("/v1/chat/completions", chat_body(self.MESSAGES, max_tokens=8))[2]
        parts = [{"role": "developer", "content": [{"type": "text", "text": "You tell stories."}]},
                 {"role": "user", "content": [{"type": "text", "text": "Tell me about Lily and the red ball."}]}]
        status, _, same = post("/v1/chat/completions", chat_body(parts, max_tokens=8))
        self.assertEqual(status, 200, same)
        self.assertEqual(same["choices"][0]["message"]["content"],
                         plain["choices"][0]["message"]["content"])

    def test_logprobs_shapes_match_grpc(self):
        k = 3
        body = chat_body(self.MESSAGES, max_tokens=10, logprobs=True, top_logprobs=k)
        status, _, full = post("/v1/chat/completions", body)
        self.assertEqual(status, 200, full)
        content = full["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), full["usage"]["completion_tokens"])
        for entry in content:
            self.assertEqual(set(entry), {"token", "logprob", "bytes", "top_logprobs"})
            self.assertLessEqual(entry["logprob"], 0.0)
            self.assertTrue(all(isinstance(b, int) and 0 <= b < 256 for b in entry["bytes"]))
            if not entry["token"].startswith("bytes:"):
                self.assertEqual(bytes(entry["bytes"]).decode("utf-8"), entry["token"])
            tops = entry["top_logprobs"]
            self.assertEqual(len(tops), k)
            self.assertEqual([t["logprob"] for t in tops],
                             sorted((t["logprob"] for t in tops), reverse=True))
            # Greedy: the chosen token is the most likely one.
            self.assertEqual((tops[0]["token"], tops[0]["logprob"]), (entry["token"], entry["logprob"]))
        self.assertEqual(bytes(b for e in content for b in e["bytes"]).decode("utf-8").lstrip(" "),
                         full["choices"][0]["message"]["content"].lstrip(" "))

        # The same numbers as the gRPC API for the same conversation.
        client = self.grpc()
        session = client.create(chat=self.MESSAGES)
        self.addCleanup(client.delete, session.id)
        ref = client.generate(session.id, max_tokens=10, logprobs=True, top_logprobs=k).collect()
        self.assertEqual(len(ref.logprobs), len(content))
        for mine, theirs in zip(content, ref.logprobs):
            self.assertAlmostEqual(mine["logprob"], theirs.logprob, places=6)
            self.assertEqual([round(t["logprob"], 6) for t in mine["top_logprobs"]],
                             [round(t.logprob, 6) for t in theirs.top])

        # Streamed: the chunks' logprobs concatenated equal the non-streamed ones.
        _, events = sse("/v1/chat/completions", dict(body, stream=True))
        streamed = []
        for c in chunks(events):
            lp = c["choices"][0]["logprobs"]
            if lp is not None:
                streamed.extend(lp["content"])
        self.assertEqual(streamed, content)

    def test_completions_logprobs_legacy_shape(self):
        body = {"model": "echokv", "prompt": STORY, "max_tokens": 8, "temperature": 0, "logprobs": 2}
        status, _, full = post("/v1/completions", body)
        self.assertEqual(status, 200, full)
        lp = full["choices"][0]["logprobs"]
        self.assertEqual(set(lp), {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        n = full["usage"]["completion_tokens"]
        for field in lp.values():
            self.assertEqual(len(field), n)
        for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            self.assertIsInstance(top, dict)
            self.assertLessEqual(len(top), 2)
            self.assertEqual(max(top.values()), logprob)  # greedy
            self.assertEqual(top[token], logprob)
        self.assertEqual(lp["text_offset"], sorted(lp["text_offset"]))
        self.assertEqual(lp["text_offset"][0], 0)
        # The tokens' own text is the text, the first token's leading SentencePiece
        # space included (issue 25: it used to be dropped), and text_offset indexes it.
        self.assertEqual("".join(lp["tokens"]), full["choices"][0]["text"])
        self.assertEqual(lp["text_offset"], [len("".join(lp["tokens"][:i])) for i in range(n)])
        _, events = sse("/v1/completions", dict(body, stream=True))
        merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for c in chunks(events):
            part = c["choices"][0]["logprobs"]
            if part is not None:
                for key in merged:
                    merged[key].extend(part[key])
        self.assertEqual(merged, lp)


class ErrorsTest(HttpTestCase):
    def test_malformed_json(self):
        for raw in (b"{not json", b"", b"[1, 2]", b'"text"'):
            status, _, payload = request("POST", "/v1/chat/completions", raw=raw)
            err = self.assertOpenAiError(status, json.loads(payload), 400, code="invalid_json")
            self.assertIsNone(err["param"])

    def test_wrong_types_and_values_name_the_param(self):
        good = chat_body([{"role": "user", "content": "Hi"}], max_tokens=4)
        cases = [
            ({"temperature": "hot"}, "temperature"),
            ({"temperature": 3}, "temperature"),
            ({"top_p": 0}, "top_p"),
            ({"max_tokens": 1.5}, "max_tokens"),
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_completion_tokens": "4"}, "max_completion_tokens"),
            ({"max_tokens": 10 ** 6}, "max_tokens"),
            ({"stream": "yes"}, "stream"),
            ({"stream_options": {"include_usage": True}}, "stream_options"),
            ({"stop": 5}, "stop"),
            ({"stop": ["ok", 3]}, "stop[1]"),
            ({"seed": "x"}, "seed"),
            ({"n": 2}, "n"),
            ({"logprobs": "yes"}, "logprobs"),
            ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
            ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
            ({"presence_penalty": 2.5}, "presence_penalty"),
            ({"messages": "Hi"}, "messages"),
            ({"messages": []}, "messages"),
            ({"messages": [{"role": 3, "content": "Hi"}]}, "messages[0].role"),
            ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
            ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
            ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "messages[0].content[0].type"),
            ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
            ({"tools": [{"type": "function"}]}, "tools"),
            ({"response_format": {"type": "json_object"}}, "response_format.type"),
            ({"logit_bias": {"5": 10}}, "logit_bias"),
            ({"model": 5}, "model"),
            ({"echokv": {"budget": "big"}}, "echokv.budget"),
            ({"echokv": {"policy": "nope"}}, "echokv.policy"),
            ({"echokv": {"memory": "forever"}}, "echokv.memory"),
            ({"session_id": 12}, "session_id"),
            ({"stop_token_ids": [100000]}, "stop_token_ids"),
        ]
        for change, param in cases:
            with self.subTest(change=change):
                status, _, body = post("/v1/chat/completions", dict(good, **change))
                self.assertOpenAiError(status, body, 400, param)
        missing = dict(good)
        del missing["model"]
        self.assertOpenAiError(*post("/v1/chat/completions", missing)[::2], 400, "model")
        for change, param in [({"prompt": {}}, "prompt"), ({"prompt": ["a", 5]}, "prompt[1]"),
                              ({"echo": True}, "echo"), ({"best_of": 2}, "best_of"),
                              ({"logprobs": True}, "logprobs"), ({"prompt": [1, "x"]}, "prompt[1]")]:
            with self.subTest(change=change):
                body = dict({"model": "echokv", "prompt": "Hi", "max_tokens": 2}, **change)
                self.assertOpenAiError(*post("/v1/completions", body)[::2], 400, param)

    def test_unknown_fields_are_ignored(self):
        status, _, body = post("/v1/chat/completions",
                               chat_body([{"role": "user", "content": "Hi", "name": "bob"}],
                                         max_tokens=2, user="u1", metadata={"a": 1},
                                         something_new={"x": [1]}, parallel_tool_calls=False))
        self.assertEqual(status, 200, body)

    def test_not_found_and_too_large(self):
        status, _, body = post("/v1/chat/completions", dict(chat_body([{"role": "user", "content": "Hi"}]),
                                                            model="gpt-4o"))
        self.assertOpenAiError(status, body, 404, "model", "model_not_found")
        status, _, body = post("/v1/chat/completions", chat_body([{"role": "user", "content": "Hi"}]),
                               headers={"x-echokv-session": "0123456789abcdef0123456789abcdef"})
        self.assertOpenAiError(status, body, 404, code="session_not_found")
        status, _, payload = request("GET", "/v1/nothing")
        self.assertOpenAiError(status, json.loads(payload), 404, code="not_found")
        status, _, payload = request("POST", "/v1/completions",
                                     raw=json.dumps({"model": "echokv", "prompt": "x" * 300000}).encode())
        self.assertOpenAiError(status, json.loads(payload), 413, code="request_too_large")
        # Context too long for the model (stories260K: 512 tokens): 400 on the input field.
        status, _, body = post("/v1/completions", {"model": "echokv", "prompt": "Lily " * 2000})
        self.assertOpenAiError(status, body, 400, "prompt")
        # The header and the body field name the same thing; different -> 400.
        status, _, body = post("/v1/chat/completions", chat_body([{"role": "user", "content": "Hi"}], max_tokens=2),
                               headers={"x-echokv-session": "new"})
        self.assertEqual(status, 200, body)
        self.addCleanup(self.grpc().delete, body["session_id"])
        status, _, body = post("/v1/chat/completions",
                               dict(chat_body([{"role": "user", "content": "Hi"}]), session_id="new"),
                               headers={"x-echokv-session": body["session_id"]})
        self.assertOpenAiError(status, body, 400, "session_id")


class SessionsTest(HttpTestCase):
    USER1 = {"role": "user", "content": "Tell me a story about a cat named Tom."}
    USER2 = {"role": "user", "content": "What did Tom do next?"}

    def test_new_session_continued_with_the_whole_conversation(self):
        client = self.grpc()
        status, heads, first = post("/v1/chat/completions",
                                    chat_body([self.USER1], max_tokens=12, session_id="new"))
        self.assertEqual(status, 200, first)
        sid = first["session_id"]
        self.addCleanup(client.delete, sid)
        self.assertEqual(heads["x-echokv-session"], sid)
        reply = first["choices"][0]["message"]
        held = client.get(sid)
        # The reply was committed: it entered the session as the template renders it
        # (its text re-rendered and re-tokenized with the turn's end; the exact tokens
        # are checked by server_chat_session_test), so the session grew past the prompt.
        self.assertGreater(held.tokens_seen, first["usage"]["prompt_tokens"])
        self.assertEqual([m.role for m in held.messages], ["user", "assistant"])
        self.assertEqual(held.messages[1].content, reply["content"])

        conversation = [self.USER1, {"role": "assistant", "content": reply["content"]}, self.USER2]
        status, heads, second = post("/v1/chat/completions", chat_body(conversation, max_tokens=8),
                                     headers={"x-echokv-session": sid})
        self.assertEqual(status, 200, second)
        self.assertEqual((heads["x-echokv-session"], second["session_id"]), (sid, sid))
        # Only the new message was prefilled: the prompt is what the session held plus it.
        self.assertGreater(second["usage"]["prompt_tokens"], held.tokens_seen)
        self.assertGreater(client.get(sid).tokens_seen, second["usage"]["prompt_tokens"])

        # A conversation that is not the session's: 409, naming the first difference.
        edited = [self.USER1, {"role": "assistant", "content": "something else"}, self.USER2]
        status, _, body = post("/v1/chat/completions", chat_body(edited), headers={"x-echokv-session": sid})
        self.assertOpenAiError(status, body, 409, "messages[1]", "conversation_mismatch")
        status, _, body = post("/v1/chat/completions", chat_body([self.USER1]), headers={"x-echokv-session": sid})
        self.assertOpenAiError(status, body, 409, "messages", "conversation_mismatch")
        # Nothing new after the assistant's reply: 400.
        whole = conversation + [{"role": "assistant", "content": second["choices"][0]["message"]["content"]}]
        status, _, body = post("/v1/chat/completions", chat_body(whole), headers={"x-echokv-session": sid})
        self.assertOpenAiError(status, body, 400, "messages")

        # "new" on a stream: the id is in the response header and on every chunk.
        heads, events = sse("/v1/chat/completions",
                            chat_body([self.USER1], max_tokens=4, stream=True, session_id="new"))
        sid2 = heads["x-echokv-session"]
        self.addCleanup(client.delete, sid2)
        self.assertNotEqual(sid2, sid)
        self.assertTrue(all(c["session_id"] == sid2 for c in chunks(events)))
        # The same prompt as the first session, plus the committed reply as the template
        # renders it (its text re-tokenized with the end of its turn).
        held2 = client.get(sid2)
        self.assertGreater(held2.tokens_seen, first["usage"]["prompt_tokens"])
        self.assertEqual([m.role for m in held2.messages], ["user", "assistant"])

    def test_stateless_requests_leave_no_session(self):
        client = self.grpc()
        before = {s.id for s in client.list()}
        for stream in (False, True):
            body = chat_body([self.USER1], max_tokens=4, stream=stream)
            if stream:
                sse("/v1/chat/completions", body)
            else:
                self.assertEqual(post("/v1/chat/completions", body)[0], 200)
        wait_until(lambda: {s.id for s in client.list()} == before, "temporary sessions deleted")

    def test_grpc_session_continued_by_streamed_http(self):
        """Issue 10 acceptance: a streamed /v1/chat/completions call with a session id
        continues a session created over gRPC; checked against the gRPC path on a fork
        (the same session state)."""
        client = self.grpc()
        session = client.create(chat=[self.USER1], policy="echokv", budget=24, lookahead=4)
        self.addCleanup(client.delete, session.id)
        twin = client.fork(session.id)
        self.addCleanup(client.delete, twin.id)

        # Turn 1: the session already holds the question (and the generation prompt).
        heads, events = sse("/v1/chat/completions",
                            chat_body([self.USER1], max_tokens=10, stream=True),
                            headers={"x-echokv-session": session.id})
        self.assertEqual(heads["x-echokv-session"], session.id)
        self.assertTrue(all(c["session_id"] == session.id for c in chunks(events)))
        text1 = stream_text(events)
        ref1 = client.generate(twin.id, max_tokens=10, commit=True).collect()
        self.assertEqual(text1, ref1.text)
        self.assertEqual(client.get(session.id).tokens_seen, client.get(twin.id).tokens_seen)

        # Turn 2: the whole conversation over HTTP; only USER2 is appended.
        conversation = [self.USER1, {"role": "assistant", "content": text1}, self.USER2]
        _, events = sse("/v1/chat/completions", chat_body(conversation, max_tokens=10, stream=True),
                        headers={"x-echokv-session": session.id})
        client.append(twin.id, chat=[self.USER2])
        ref2 = client.generate(twin.id, max_tokens=10, commit=True).collect()
        self.assertEqual(stream_text(events), ref2.text)
        a, b = client.get(session.id), client.get(twin.id)
        self.assertEqual((a.tokens_seen, a.retained_entries), (b.tokens_seen, b.retained_entries))

    def test_http_session_continued_over_grpc(self):
        """The reverse: a session created over HTTP continued over gRPC (append + commit),
        compared with its twin continued over HTTP; then HTTP continues the gRPC-extended
        session, so both doors share the session's conversation."""
        client = self.grpc()
        ids = []
        for _ in range(2):
            status, heads, body = post("/v1/chat/completions",
                                       chat_body([self.USER1], max_tokens=10, session_id="new",
                                                 echokv={"policy": "snapkv", "budget": 24}))
            self.assertEqual(status, 200, body)
            ids.append(body["session_id"])
            self.addCleanup(client.delete, body["session_id"])
            reply = body["choices"][0]["message"]["content"]
        over_grpc, over_http = ids
        self.assertEqual(client.get(over_grpc).compression.policy, "snapkv")
        self.assertEqual(client.get(over_grpc).compression.budget, 24)

        client.append(over_grpc, chat=[self.USER2])
        grpc_turn = client.generate(over_grpc, max_tokens=10, commit=True).collect()
        conversation = [self.USER1, {"role": "assistant", "content": reply}, self.USER2]
        status, _, http_turn = post("/v1/chat/completions", chat_body(conversation, max_tokens=10),
                                    headers={"x-echokv-session": over_http})
        self.assertEqual(status, 200, http_turn)
        self.assertEqual(grpc_turn.text, http_turn["choices"][0]["message"]["content"])
        self.assertEqual(client.get(over_grpc).tokens_seen, client.get(over_http).tokens_seen)

        # HTTP accepts the conversation the gRPC turns built.
        conversation += [{"role": "assistant", "content": grpc_turn.text},
                         {"role": "user", "content": "The end?"}]
        status, _, body = post("/v1/chat/completions", chat_body(conversation, max_tokens=4),
                               headers={"x-echokv-session": over_grpc})
        self.assertEqual(status, 200, body)

    def test_completions_continue_a_text_session(self):
        client = self.grpc()
        session = client.create(STORY)
        self.addCleanup(client.delete, session.id)
        twin = client.fork(session.id)
        self.addCleanup(client.delete, twin.id)
        status, heads, body = post("/v1/completions",
                                   {"model": "echokv", "prompt": " Lily", "max_tokens": 8, "temperature": 0,
                                    "session_id": session.id})
        self.assertEqual(status, 200, body)
        self.assertEqual((heads["x-echokv-session"], body["session_id"]), (session.id, session.id))
        client.append(twin.id, " Lily")
        ref = client.generate(twin.id, max_tokens=8, commit=True).collect()
        self.assertEqual(body["choices"][0]["text"], ref.text)
        self.assertEqual(client.get(session.id).tokens_seen, client.get(twin.id).tokens_seen)


class DisconnectTest(HttpTestCase):
    def test_client_disconnect_stops_the_generation(self):
        client = self.grpc()
        session = client.create(chat=[{"role": "user", "content": "Tell me a long story."}])
        self.addCleanup(client.delete, session.id)
        before = client.get(session.id)
        left_before = metric("echokv_http_requests_total",
                             {"route": "/v1/chat/completions", "code": "499"})
        room = 512 - before.tokens_seen - 8
        # A long committed stream with large events; read one event, then leave.
        s = stalled_stream(chat_body([{"role": "user", "content": "Tell me a long story."}],
                                     stream=True, max_tokens=room, ignore_eos=True,
                                     logprobs=True, top_logprobs=20, session_id=session.id))
        # Backpressure: the unread stream is held back (its events would fill the socket
        # buffers many times over), so it is still running however long we wait here;
        # without backpressure it would finish and commit in a fraction of a second.
        time.sleep(1.0)
        held = client.get(session.id)
        self.assertTrue(held.busy)
        self.assertEqual(held.tokens_seen, before.tokens_seen)
        s.close()
        # The generation stopped: its commit was rolled back (a finished one would have
        # grown the session by `room` tokens) and the session is free again.
        wait_until(lambda: not client.get(session.id).busy, "the session to be released")
        after = client.get(session.id)
        self.assertEqual(after.tokens_seen, before.tokens_seen)
        wait_until(lambda: metric("echokv_http_requests_total",
                                  {"route": "/v1/chat/completions", "code": "499"}) == left_before + 1,
                   "the request to be counted as 499")
        wait_until(lambda: metric("echokv_active_generations") == 0, "no generation running")
        # The server keeps serving, the session too.
        status, _, body = post("/v1/chat/completions",
                               chat_body([{"role": "user", "content": "Tell me a long story."}], max_tokens=4),
                               headers={"x-echokv-session": session.id})
        self.assertEqual(status, 200, body)


class IdleConnectionsTest(HttpTestCase):
    def test_scrapes_and_requests_while_30_idle_connections_are_open(self):
        for port in (SERVER.metrics_port, SERVER.http_port):
            idle = []
            try:
                for _ in range(30):
                    s = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
                    idle.append(s)
                if port == SERVER.metrics_port:
                    # The ceiling is a hang guard, yet below the 30 x 2 s = 60 s that the
                    # old one-connection-at-a-time endpoint needed here.
                    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                                timeout=IDLE_SCRAPE_CEILING_S) as r:
                        self.assertEqual(r.status, 200)
                        self.assertIn(b"echokv_http_requests_total", r.read())
                else:
                    status, _, payload = request("GET", "/v1/models", timeout=IDLE_SCRAPE_CEILING_S)
                    self.assertEqual(status, 200)
            finally:
                for s in idle:
                    s.close()


class LimitsAndShutdownTest(HttpTestCase):
    def test_concurrency_limit_then_drain(self):
        server = start_server(["--max-concurrent-streams", "1", "--shutdown-grace", "60s"])
        try:
            held = stalled_stream(chat_body([{"role": "user", "content": "Tell me a long story."}],
                                            stream=True, max_tokens=400, ignore_eos=True,
                                            logprobs=True, top_logprobs=20), server=server)
            status, _, body = post("/v1/completions", {"model": "echokv", "prompt": "Hi", "max_tokens": 2},
                                   server=server)
            self.assertOpenAiError(status, body, 429, code="resource_exhausted")
            self.assertEqual(body["error"]["type"], "rate_limit_error")
            server.process.send_signal(signal.SIGTERM)
            wait_until(lambda: request("GET", "/health", server=server)[0] == 503, "draining")
            status, _, body = post("/v1/completions", {"model": "echokv", "prompt": "Hi", "max_tokens": 2},
                                   server=server)
            self.assertOpenAiError(status, body, 503, code="unavailable")
            held.close()  # the last stream ends: the server exits
            self.assertEqual(server.process.wait(timeout=HANG_GUARD_S), 0, server.tail())
        finally:
            server.stop()


class NoChatTemplateTest(HttpTestCase):
    def test_chat_without_a_template_is_refused_on_messages(self):
        server = start_server(model=ARGS.source_model)
        try:
            status, _, body = post("/v1/chat/completions", chat_body([{"role": "user", "content": "Hi"}]),
                                   server=server)
            self.assertOpenAiError(status, body, 400, "messages", "unimplemented")
            self.assertIn("chat template", body["error"]["message"])
            status, _, body = post("/v1/completions", {"model": "echokv", "prompt": "Hi", "max_tokens": 2},
                                   server=server)
            self.assertEqual(status, 200, body)
        finally:
            server.stop()


class AuthTest(unittest.TestCase):
    """The HTTP door checks the same bearer tokens as the gRPC door (server/doors/auth.h): 401
    without or with a wrong token, and another tenant's session is unknown (404) over
    HTTP exactly as over gRPC."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="echokv-http-auth-")
        tokens = os.path.join(cls.tmp.name, "tokens")
        with open(tokens, "w") as f:
            for tenant, token in (("alice", "tok-alice"), ("bob", "tok-bob")):
                f.write("%s %s\n" % (tenant, hashlib.sha256(token.encode()).hexdigest()))
        cls.server = start_server(extra=["--auth_tokens_file", tokens])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def test_tokens_and_tenants(self):
        alice = {"Authorization": "Bearer tok-alice"}
        bob = {"Authorization": "Bearer tok-bob"}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic dG9r"}):
            status, _, payload = request("GET", "/v1/models", headers=headers, server=self.server)
            self.assertEqual(status, 401, payload)
            status, _, body = post("/v1/completions", {"model": "echokv", "prompt": "Once", "max_tokens": 2},
                                   headers=headers, server=self.server)
            self.assertEqual(status, 401, body)
        status, _, payload = request("GET", "/v1/models", headers=alice, server=self.server)
        self.assertEqual(status, 200, payload)
        # A session alice creates over HTTP: bob cannot continue it over HTTP or gRPC.
        status, _, body = post("/v1/chat/completions",
                               chat_body([{"role": "user", "content": "Hi"}], max_tokens=2),
                               headers=dict(alice, **{"x-echokv-session": "new"}), server=self.server)
        self.assertEqual(status, 200, body)
        sid = body["session_id"]
        status, _, body = post("/v1/chat/completions",
                               chat_body([{"role": "user", "content": "Hi"}], max_tokens=2),
                               headers=dict(bob, **{"x-echokv-session": sid}), server=self.server)
        self.assertEqual(status, 404, body)
        grpc_bob = echokv.Client("127.0.0.1:%d" % self.server.grpc_port, token="tok-bob")
        grpc_alice = echokv.Client("127.0.0.1:%d" % self.server.grpc_port, token="tok-alice")
        self.addCleanup(grpc_bob.close)
        self.addCleanup(grpc_alice.close)
        with self.assertRaises(echokv.errors.NotFound):
            grpc_bob.get(sid)
        self.assertEqual([s.id for s in grpc_alice.list()], [sid])
        grpc_alice.delete(sid)


def main():
    global ARGS, echokv
    args, rest = harness.arguments(__doc__).parse_known_args()
    args.source_model = harness.stories260k()
    ARGS = args
    echokv = harness.import_client(args.client)
    return harness.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main())
