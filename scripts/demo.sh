#!/usr/bin/env bash
# The main job (README command 1): set up and build (scripts/setup.sh also fetches the
# default model, SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0), start echokv-server on
# $ECHOKV_MODEL or, when unset, on the default model, and show what echokv is for:
#   - an instruct model with a chat template (the default SmolLM2): a chat session over a
#     long real document (Debian's Apache-2.0 licence text, ~2,300 tokens, with one fact
#     planted in the middle) compressed with EchoKV to a small budget, and the question
#     about that fact answered from the compact cache next to a full-cache session's
#     answer, with the cache inspected, memory saved and lookahead time printed;
#   - a plain model without a chat template (the embedded stories260K, the fallback when
#     the default model could not be fetched): a story context compressed and continued.
# Then, either way: restart the server on its --state-dir (the session is listed again
# and continues identically) and stop it (SIGTERM; it must exit 0 both times). Runs
# unattended (CI, no TTY); any failure exits non-zero and the server is always stopped.
#   scripts/demo.sh
#   ECHOKV_MODEL=/path/to/model.gguf-or-hf-dir ECHOKV_DEMO_TEXT_FILE=long.txt scripts/demo.sh
# Knobs: ECHOKV_DEMO_POLICY (echokv), ECHOKV_DEMO_BUDGET (512 chat / 64 story),
# ECHOKV_DEMO_MAX_TOKENS (48), ECHOKV_BUILD_DIR (build), ECHOKV_DEMO_SKIP_SETUP=1 (reuse
# an existing build as is).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${ECHOKV_DEMO_SKIP_SETUP:-}" ]]; then
  scripts/setup.sh
fi
BUILD="${ECHOKV_BUILD_DIR:-build}"
BIN="$BUILD/bin"
PY=/usr/bin/python3  # Debian's python (the build's own tools need nothing else)

# The server resolves the model itself: $ECHOKV_MODEL, else the default GGUF in the
# models folder, else the embedded stories260K (common/default_model.h), so the demo runs
# it exactly as a user would, without --model.
DEFAULT_GGUF="${ECHOKV_MODELS:-$PWD/.cache/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -n "${ECHOKV_MODEL:-}" ]]; then
  MODEL="$ECHOKV_MODEL"
elif [[ -f "$DEFAULT_GGUF" ]]; then
  MODEL="the default model SmolLM2-135M-Instruct ($DEFAULT_GGUF)"
else
  MODEL="the embedded stories260K (models/stories260K)"
  echo "demo: the default model $DEFAULT_GGUF is missing (scripts/setup.sh could not fetch it)," >&2
  echo "demo: so this uses the embedded stories260K, a 260K-parameter TinyStories model." >&2
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

INFO="$("${CLI[@]}" info)"
if grep -q "chat template yes" <<<"$INFO"; then
  # ---- an instruct model: a long document, compressed, and a question about it ----
  DOC="$WORK/document.txt"
  if [[ -n "${ECHOKV_DEMO_TEXT_FILE:-}" ]]; then
    cp "$ECHOKV_DEMO_TEXT_FILE" "$DOC"
  else
    [[ -r /usr/share/common-licenses/Apache-2.0 ]] || { echo "demo: /usr/share/common-licenses/Apache-2.0 is missing" >&2; exit 1; }
    cp /usr/share/common-licenses/Apache-2.0 "$DOC"
  fi
  QUESTION="${ECHOKV_DEMO_QUESTION:-What is the password for the archive room?}"
  FACT="${ECHOKV_DEMO_FACT:-Note from the archivist: the password for the archive room is \"blue lantern\".}"
  "$PY" - "$DOC" "$FACT" "$QUESTION" "$WORK/chat.json" <<'PYEOF'
import json, sys
doc, fact, question, out = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], sys.argv[4]
paras = doc.split("\n\n")
paras.insert(len(paras) // 2, fact)  # the fact sits in the middle of the document
content = "\n\n".join(paras) + "\n\n" + question
json.dump([{"role": "user", "content": content}], open(out, "w"))
PYEOF
  BUDGET="${ECHOKV_DEMO_BUDGET:-512}"
  POLICY="${ECHOKV_DEMO_POLICY:-echokv}"
  # The same conversation under the full cache and under LAQ (EchoKV's lookahead
  # baseline), for comparison; each answer comes from its own session's cache.
  declare -A SESSIONS=()
  for p in "$POLICY" laq full; do
    [[ -n "${SESSIONS[$p]:-}" ]] && continue
    if [[ "$p" == full ]]; then
      echo "== create: the same conversation with the full cache (policy full)" >&2
      SESSIONS[$p]="$("${CLI[@]}" create --chat "$WORK/chat.json" --policy full --id-only)"
    else
      echo "== create: a chat session over $(wc -c <"$DOC") bytes of $(basename "$DOC"), a planted fact and the question" >&2
      echo "   \"$QUESTION\", compressed with $p to $BUDGET entries per layer and KV group" >&2
      SESSIONS[$p]="$("${CLI[@]}" create --chat "$WORK/chat.json" --policy "$p" --budget "$BUDGET" --id-only)"
    fi
    [[ "${SESSIONS[$p]}" =~ ^[0-9a-f]{32}$ ]] || { echo "demo: bad session id '${SESSIONS[$p]}'" >&2; exit 1; }
  done
  SESSION="${SESSIONS[$POLICY]}"
  echo "== inspect $SESSION (what each layer kept; the first layers)" >&2
  "${CLI[@]}" inspect "$SESSION" >"$WORK/inspect.txt"
  head -n 18 "$WORK/inspect.txt"
  echo "   ... ($(grep -c ' all ' "$WORK/inspect.txt") layers in all)"

  echo "== the answers (greedy, from each session's own cache)" >&2
  for p in "$POLICY" laq full; do
    answer="$("${CLI[@]}" generate "${SESSIONS[$p]}" --max-tokens "${ECHOKV_DEMO_MAX_TOKENS:-48}")"
    [[ -n "$answer" ]] || { echo "demo: $p gave an empty answer" >&2; exit 1; }
    if [[ "$p" == full ]]; then
      printf '   %-22s %s\n' "full cache:" "$answer" >&2
    else
      printf '   %-22s %s\n' "$p, budget $BUDGET:" "$answer" >&2
    fi
  done
  for p in "${!SESSIONS[@]}"; do
    [[ "$p" == "$POLICY" ]] || "${CLI[@]}" delete "${SESSIONS[$p]}" >/dev/null
  done
else
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
fi

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
