#!/usr/bin/python3
"""Integration test of the Python client (client/python/echokv_client) against a real
echokv-server on stories260K: create a session (with progress events), stream a
greedy generation, inspect the cache, check grpc.health.v1, delete, shut down.

    /usr/bin/python3 tests/server/python_client_test.py \
        --server-binary build/bin/echokv-server --stubs build/python --client client/python

Needs $ECHOKV_TEST_DATA (models/stories260K); exits 77 (ctest: skipped) when unset.
Runs on Debian's python3-grpcio / python3-protobuf: use /usr/bin/python3.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
BUDGET = 16
MAX_TOKENS = 12
STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in "
    "the park with her friends. One day, she found a small red ball under a big tree. "
    "She wanted to share it with everyone she knew, so she ran to her mom and said, "
    "\"Mom, look what I found!\" Her mom smiled and said they could go to the park "
    "together after lunch. Lily was very happy and could not wait to play.")


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def wait_for_ports(process, port_file, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError("echokv-server exited with %d before listening" % process.returncode)
        if os.path.exists(port_file):
            with open(port_file) as f:
                lines = f.read().split()
            if len(lines) >= 2:
                return int(lines[0]), int(lines[1])
        time.sleep(0.05)
    raise AssertionError("echokv-server wrote no --port-file within %d s" % timeout_s)


def run(args):
    data = os.environ.get("ECHOKV_TEST_DATA")
    if not data:
        print("SKIPPED: $ECHOKV_TEST_DATA is unset (needs models/stories260K)")
        return SKIP
    model = os.path.join(data, "models", "stories260K")
    check(os.path.isfile(os.path.join(model, "config.json")), "no config.json in " + model)
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    num_layers = config["num_hidden_layers"]
    num_kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])

    sys.path[:0] = [args.stubs, args.client]
    import grpc  # noqa: F401  (Debian python3-grpcio)
    from echokv_client import EchoKVClient, EchoKVError

    with tempfile.TemporaryDirectory(prefix="echokv-pytest-") as tmp:
        port_file = os.path.join(tmp, "ports")
        log_path = os.path.join(tmp, "server.log")
        log = open(log_path, "w")
        server = subprocess.Popen(
            [args.server_binary, "--model", model, "--host", "127.0.0.1", "--port", "0",
             "--metrics-port=-1", "--port-file", port_file, "--threads", "1"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            port, _ = wait_for_ports(server, port_file, 60)
            print("server on port", port)
            client = EchoKVClient("127.0.0.1:%d" % port, timeout=120)

            check(client.health() == "SERVING", "health is not SERVING")
            check(client.health("echokv.v1.EchoKV") == "SERVING", "EchoKV service not SERVING")

            info = client.info()
            check(info.model.num_layers == num_layers,
                  "info: %d layers, config.json has %d" % (info.model.num_layers, num_layers))
            check(info.model.num_kv_heads == num_kv_heads, "info: KV heads differ from config.json")
            check("echokv" in info.policies, "info: echokv not among %s" % list(info.policies))

            events = []
            session = client.create(text=STORY, policy="echokv", budget=BUDGET, lookahead=8,
                                    on_progress=events.append)
            print("session", session.id, "tokens", session.tokens_seen,
                  "retained", session.retained_kv_bytes, "of", session.full_kv_bytes)
            check(len(session.id) == 32 and all(c in "0123456789abcdef" for c in session.id),
                  "session id is not 32 hex characters: %r" % session.id)
            check(events, "CreateSession streamed no progress event")
            for e in events:
                check(e.phase and (0 <= e.done <= e.total or e.total == 0),
                      "bad progress event %s" % e)
            check(session.tokens_seen > BUDGET,
                  "the story is only %d tokens; it must exceed the budget" % session.tokens_seen)
            check(session.compression.policy == "echokv" and session.compression.budget == BUDGET,
                  "session config differs from the request: %s" % session.compression)
            check(0 < session.retained_kv_bytes < session.full_kv_bytes,
                  "no memory saved: %d of %d" % (session.retained_kv_bytes, session.full_kv_bytes))
            check(session.bytes_saved == session.full_kv_bytes - session.retained_kv_bytes,
                  "bytes_saved != full - retained")

            generation = client.generate(session.id, max_tokens=MAX_TOKENS)
            deltas = list(generation)
            text = "".join(deltas)
            print("generated %r in %d deltas" % (text, len(deltas)))
            check(text.strip(), "the generation streamed no text")
            final = generation.final
            check(final is not None, "no final message")
            check(1 <= final.generated_tokens <= MAX_TOKENS,
                  "generated_tokens %d outside [1, %d]" % (final.generated_tokens, MAX_TOKENS))
            check(final.prompt_tokens == session.tokens_seen, "prompt_tokens != tokens_seen")
            check(generation.token_ids, "no token ids streamed")
            # commit=false leaves the session unchanged: greedy again gives the same text.
            again = client.generate(session.id, max_tokens=MAX_TOKENS).text()
            check(again == text, "greedy generation differs on a second run: %r vs %r" % (again, text))

            inspected = client.inspect(session.id, positions=True)
            check(len(inspected.layers) == num_layers,
                  "inspect: %d layers, expected %d" % (len(inspected.layers), num_layers))
            total_entries = total_bytes = 0
            for layer in inspected.layers:
                check(len(layer.groups) == num_kv_heads,
                      "layer %d: %d groups, expected %d" % (layer.layer, len(layer.groups), num_kv_heads))
                for group in layer.groups:
                    where = "layer %d group %d" % (layer.layer, group.group)
                    check(0 < group.retained <= BUDGET,
                          "%s retains %d (budget %d)" % (where, group.retained, BUDGET))
                    positions = list(group.positions)
                    check(len(positions) == group.retained, where + ": positions != retained")
                    check(positions == sorted(set(positions)), where + ": positions not ascending")
                    check(positions[0] >= 0 and positions[-1] < session.tokens_seen,
                          where + ": a position outside [0, tokens_seen)")
                    total_entries += group.retained
                    total_bytes += group.kv_bytes
            check(total_entries == inspected.total_retained_entries == session.retained_entries,
                  "inspect totals disagree: %d / %d / %d" % (
                      total_entries, inspected.total_retained_entries, session.retained_entries))
            check(total_bytes == inspected.total_kv_bytes == session.retained_kv_bytes,
                  "inspect bytes disagree: %d / %d / %d" % (
                      total_bytes, inspected.total_kv_bytes, session.retained_kv_bytes))
            check(inspected.full_equivalent_kv_bytes == session.full_kv_bytes,
                  "full-equivalent bytes differ from the session's")

            freed = client.delete(session.id)
            check(freed == session.retained_kv_bytes, "delete freed %d bytes" % freed)
            try:
                client.inspect(session.id)
                raise AssertionError("inspect of a deleted session succeeded")
            except EchoKVError as e:
                check(e.code == grpc.StatusCode.NOT_FOUND, "deleted session: %s" % e)

            check(client.health() == "SERVING", "health is not SERVING after the calls")
            client.close()

            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
            check(code == 0, "echokv-server exited with %d after SIGTERM" % code)
        except BaseException:
            log.flush()
            with open(log_path) as f:
                sys.stderr.write("---- echokv-server log ----\n" + f.read()[-4000:])
            raise
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            log.close()
    print("PASSED")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--stubs", required=True, help="<build>/python")
    parser.add_argument("--client", required=True, help="client/python")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
