#!/usr/bin/env bash
# The main job (README command 1): set up and build, start echokv-server on
# $ECHOKV_MODEL (a Hugging Face Llama/Mistral/Qwen2 directory) or, when unset, on the
# embedded default model -- stories260K in models/ (a 260K-parameter TinyStories Llama by
# Andrej Karpathy, MIT; it writes simple English stories) -- then, with
# echokv-cli: create a session from a long text (progress bar), inspect its compressed
# cache, stream a generation, print the memory-saved metrics, restart the server on its
# --state-dir (the session is listed again and continues identically), and stop it
# (SIGTERM; it must exit 0 both times). Runs unattended (CI, no TTY); any failure exits non-zero
# and the server is always stopped.
#   scripts/demo.sh
#   ECHOKV_MODEL=/path/to/hf-model ECHOKV_DEMO_TEXT_FILE=long.txt scripts/demo.sh
# Knobs: ECHOKV_DEMO_POLICY (echokv), ECHOKV_DEMO_BUDGET (64), ECHOKV_DEMO_MAX_TOKENS (48),
# ECHOKV_BUILD_DIR (build), ECHOKV_DEMO_SKIP_SETUP=1 (reuse an existing build as is).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${ECHOKV_DEMO_SKIP_SETUP:-}" ]]; then
  scripts/setup.sh
fi
BUILD="${ECHOKV_BUILD_DIR:-build}"
BIN="$BUILD/bin"
PY=/usr/bin/python3  # Debian's python (the build's own tools need nothing else)

# The server resolves the model itself: $ECHOKV_MODEL, else the embedded stories260K
# (common/default_model.h), so the demo runs it exactly as a user would, without --model.
if [[ -n "${ECHOKV_MODEL:-}" ]]; then
  MODEL="$ECHOKV_MODEL"
else
  MODEL="the embedded stories260K (models/stories260K)"
  echo "demo: ECHOKV_MODEL is unset, so this uses the embedded stories260K, a 260K-parameter" >&2
  echo "demo: TinyStories model (simple English). Set ECHOKV_MODEL=/path/to/hf-model for a real one." >&2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/echokv-demo.XXXXXX")"
SERVER_PID=""
cleanup() {
  local rc=$?
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "demo: stopping echokv-server (pid $SERVER_PID)" >&2
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if ((rc != 0)) && [[ -f "$WORK/server.log" ]]; then
    echo "demo: FAILED (exit $rc); last lines of the server log:" >&2
    tail -n 30 "$WORK/server.log" >&2 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

STATE="$WORK/state"  # sessions survive restarts here (tiered memory by default)
start_server() {
  rm -f "$WORK/ports"
  "$BIN/echokv-server" --insecure --host 127.0.0.1 --port 0 --metrics-port 0 \
    --port-file "$WORK/ports" --state-dir "$STATE" >>"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 600); do  # up to 60 s to load the model
    [[ -s "$WORK/ports" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "demo: echokv-server exited early" >&2; exit 1; }
    sleep 0.1
  done
  [[ -s "$WORK/ports" ]] || { echo "demo: echokv-server did not start within 60 s" >&2; exit 1; }
  GRPC_PORT="$(sed -n 1p "$WORK/ports")"
  METRICS_PORT="$(sed -n 2p "$WORK/ports")"
  CLI=("$BIN/echokv-cli" --server "127.0.0.1:$GRPC_PORT")
  healthy=""
  for _ in $(seq 1 50); do
    if "${CLI[@]}" --timeout 2 health >/dev/null 2>&1; then healthy=1; break; fi
    sleep 0.2
  done
  [[ -n "$healthy" ]] || { echo "demo: health check never reported SERVING" >&2; exit 1; }
  echo "== health: $("${CLI[@]}" health) (gRPC 127.0.0.1:$GRPC_PORT, metrics :$METRICS_PORT, state $STATE)" >&2
}
stop_server() {  # SIGTERM; the server must exit 0
  kill -TERM "$SERVER_PID"
  set +e
  wait "$SERVER_PID"
  local rc=$?
  set -e
  SERVER_PID=""
  if ((rc != 0)); then
    echo "demo: echokv-server exited with $rc after SIGTERM (expected 0)" >&2
    exit 1
  fi
}

echo "== starting echokv-server on $MODEL" >&2
start_server
"${CLI[@]}" info

# A long context: $ECHOKV_DEMO_TEXT_FILE, or a story of ~400 tokens (it and the
# generation fit stories260K's 512 positions) that stops mid-sentence, so the
# generation continues it.
TEXT="$WORK/context.txt"
if [[ -n "${ECHOKV_DEMO_TEXT_FILE:-}" ]]; then
  cp "$ECHOKV_DEMO_TEXT_FILE" "$TEXT"
else
  for part in "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends." \
              "One day she found a small red ball under a big tree, and she wanted to share it with everyone she knew." \
              "Her brother Tom saw the ball and asked if he could play too. Lily smiled and threw the ball to him." \
              "They played until the sun went down, and then their mom called them home for dinner." \
              "The next day it was raining, so Lily and Tom could not go to the park. They were sad and looked out of the window." \
              "Mom saw that they were sad. She gave them a big box of crayons and some paper, and they drew the park and the tree. When the rain stopped, they ran outside." \
              "They showed the pictures to their friends at the park, and everyone laughed and played with the red ball." \
              "When it was time to go home, Lily gave the ball to her friend Ben, because he did not have a ball." \
              "Ben was very happy. He said thank you and gave Lily a big hug. Lily felt warm inside." \
              "That night, Lily told her mom about Ben and the ball. Her mom smiled and said"; do
    printf '%s ' "$part"
  done >"$TEXT"
fi
echo "== create: $(wc -c <"$TEXT") bytes of context, policy ${ECHOKV_DEMO_POLICY:-echokv}, budget ${ECHOKV_DEMO_BUDGET:-64}" >&2
SESSION="$("${CLI[@]}" create --file "$TEXT" --policy "${ECHOKV_DEMO_POLICY:-echokv}" \
  --budget "${ECHOKV_DEMO_BUDGET:-64}" --id-only)"
[[ "$SESSION" =~ ^[0-9a-f]{32}$ ]] || { echo "demo: bad session id '$SESSION'" >&2; exit 1; }

echo "== inspect $SESSION" >&2
"${CLI[@]}" inspect "$SESSION"

echo "== generate (streamed)" >&2
"${CLI[@]}" generate "$SESSION" --max-tokens "${ECHOKV_DEMO_MAX_TOKENS:-48}"

echo "== memory-saved metrics (http://127.0.0.1:$METRICS_PORT/metrics)" >&2
"$PY" - "$METRICS_PORT" <<'PYEOF'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
wanted = ("echokv_session_retained_kv_bytes", "echokv_session_full_kv_bytes", "echokv_kv_bytes_saved",
          "echokv_compression_ratio", "echokv_kv_evicted_bytes_total", "echokv_lookahead_seconds_count",
          "echokv_lookahead_seconds_sum", "echokv_sessions_active")
lines = [l for l in body.splitlines() if l.startswith(wanted) and "_bucket" not in l]
if not lines:
    sys.exit("demo: no echokv_ memory metrics in the scrape")
print("\n".join(lines))
saved = [float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("echokv_kv_bytes_saved")]
if not saved or max(saved) <= 0:
    sys.exit("demo: echokv_kv_bytes_saved is not > 0")
PYEOF

# Sessions survive restarts: the greedy continuation before a restart, the session
# listed after it (restored from the state dir), the same continuation again.
BEFORE="$("${CLI[@]}" generate "$SESSION" --max-tokens 16 2>/dev/null)"
echo "== restart: stopping echokv-server (SIGTERM) and starting it again on $STATE" >&2
stop_server
start_server
"${CLI[@]}" list
"${CLI[@]}" list | grep -q "$SESSION" || { echo "demo: session $SESSION was not restored" >&2; exit 1; }
AFTER="$("${CLI[@]}" generate "$SESSION" --max-tokens 16 2>/dev/null)"
if [[ "$BEFORE" != "$AFTER" ]]; then
  printf 'demo: the restored session continued differently:\n before: %s\n after:  %s\n' "$BEFORE" "$AFTER" >&2
  exit 1
fi
echo "== restored session $SESSION continues identically: $AFTER" >&2

"${CLI[@]}" delete "$SESSION"
echo "== stopping echokv-server (SIGTERM)" >&2
stop_server
echo "demo: done; echokv-server exited 0" >&2
