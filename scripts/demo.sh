#!/usr/bin/env bash
# The main job: set up and build, then run a generation with EchoKV compression on
# $ECHOKV_MODEL (a Hugging Face Llama/Mistral/Qwen2 directory) or, when unset, on the
# embedded default model: a deterministic tiny random Llama written by
# echokv-make-test-model (its text is meaningless; it shows the machinery).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BIN="${ECHOKV_BUILD_DIR:-build}/bin"
MODEL="${ECHOKV_MODEL:-}"
if [[ -z "$MODEL" ]]; then
  MODEL="${ECHOKV_BUILD_DIR:-build}/demo-model/llama"
  "$BIN/echokv-make-test-model" --arch llama --out "$MODEL"
  echo "demo: ECHOKV_MODEL is unset, so this uses the embedded tiny RANDOM llama model in $MODEL;" >&2
  echo "demo: its text is meaningless. Set ECHOKV_MODEL=/path/to/hf-model for real output." >&2
fi
PROMPT="${ECHOKV_DEMO_PROMPT:-Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day she found a small red ball under a big tree, and she wanted to share it with everyone she knew.}"
"$BIN/echokv-generate" --model "$MODEL" --prompt "$PROMPT" --max-tokens 32 \
  --policy echokv --budget 16 --lookahead 8 --workspace 32 --json
