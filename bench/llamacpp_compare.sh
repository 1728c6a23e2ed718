#!/usr/bin/env bash
# echokv vs llama.cpp on the same weights, paired per repeat (issue 13 item 4, issue 14 item 8).
#
# llama.cpp is not built by this script, and none of its code is in this repository. Build
# it yourself, outside the repository, from github.com/ggerganov/llama.cpp at commit
# c392e5094deaf2d1a7c18683214f007fad3fe42b (2025-02-20, the commit of the figures in
# docs/BENCHMARKS.md), following its own instructions ("Build llama.cpp locally", the CPU
# build; the figures used a Release build with its defaults: GGML_NATIVE on, no BLAS), and
# pass the folder that holds its binaries with --llama-bin DIR. The tools used are llama-bench,
# llama-batched-bench, llama-convert-llama2c-to-ggml and llama-server.
#
# 1. Checks that each of those binaries runs (`--version`, or `--help` where a tool has
#    no --version) and records the commit llama.cpp reports for itself.
# 2. Exports both models with echokv-export-llama2c (HF -> llama2.c .bin, tokenizers
#    too) and converts them with llama-convert-llama2c-to-ggml (GGUF, F32):
#      stories260K    ($DATA/models/stories260K, tokenizer tok512 from its tokenizer.model)
#      random40m      (bench_util's WriteRandomLlama(Bench40M(), 7), written by
#                      echokv-bench-model --random40m; vocabulary: the 32000-token Mistral
#                      v0.1 SentencePiece model in $DATA/tokenizers/mistral-7b-v0.2 — the
#                      benchmark only feeds token ids, the vocabulary just has to fit)
# 3. For each model x OPENBLAS_CORETYPE (Haswell, unset) x threads (1, 2) x repeat:
#    echokv then llama.cpp, back to back, each timed command under flock $BENCH_LOCK:
#      pp512 / tg128      echokv-bench-model --contexts 512 --decode 0 / --contexts 1 --decode 128
#                         vs llama-bench -p 512 -n 128 -r 1
#      prefill / decode   echokv-bench-model --contexts L --decode 64 (decode = the 64 tokens
#      at context L       after an L-token prefill) vs llama-batched-bench -npp L -ntg 64 -npl 1
#                         (L = 512, 2048; stories260K has 512 positions: L = 448)
#    Medians of each engine, median (min-max) of the per-repeat ratios echokv/llama.cpp,
#    and the 1-minute load average of every row. OPENBLAS_CORETYPE only affects echokv
#    (llama.cpp is built without BLAS); with it unset, echokv's start-up picks the core
#    itself when OpenBLAS fell back to a pre-AVX2 one, unless OPENBLAS_THREAD_TIMEOUT is
#    already set in the environment (common/blas_env.h).
#    Two-thread rows on a busy 2-core machine measure the contention, not the engines:
#    check the load column.
# 4. echokv-bench-server against echokv-server and llama-server in the same run
#    (1/4/16/64 streams, the same prompt ids, 2 threads each).
#
# With --gguf FILE (issue 27 item 9) it benchmarks that one GGUF file instead, as both
# engines load it (echokv dequantizes it to float32 at load; llama.cpp computes on the
# quantized blocks), and only llama-batched-bench is needed. Per threads (1, 2) x repeat,
# echokv then llama.cpp, each under flock $BENCH_LOCK and /usr/bin/time -v:
#      echokv-bench-model --model FILE --contexts 512,2048,8128 --decode 64
#      llama-batched-bench -m FILE -c 8192 -b 2048 -npp 512,2048,8128 -ntg 64 -npl 1
#    prefill@L = L prompt tokens in one pass (echokv: chunks of 256; llama.cpp: its default
#    ubatch of 512), decode@L = the 64 tokens after it; the largest L is 8128 so that prompt
#    and decoded tokens fill the model's 8,192 positions exactly. load = echokv's
#    Transformer::Load (reading and dequantizing) / llama.cpp's own "load time"
#    (llama_perf_context_print: from the start of the model's load to the end of the first
#    evaluation, its 16-token warm-up, so mmap's deferred page faults count). RSS = the peak
#    resident set of the whole run ("Maximum resident set size" of /usr/bin/time -v;
#    echokv's own VmHWM line is kept in the logs). OPENBLAS_CORETYPE only affects echokv;
#    default here: --coretypes unset. No serving benchmark in this mode.
#    --gguf-contexts LIST replaces 512,2048,8128 (e.g. 512 for a short paired run).
#    --weights native (issue 30) passes `--weights native` to echokv-bench-model: echokv
#    then keeps the file's Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K blocks or F16/BF16 rows and decodes
#    on them as llama.cpp does;
#    --weights float32,native runs both, each pair interleaved with llama.cpp's run (the
#    rows then carry the mode: "decode@512 [native]").
#
# Usage:
#   bench/llamacpp_compare.sh --llama-bin DIR [--gguf FILE] [--peer-dir DIR] [--build DIR] [--data DIR]
#                             [--out DIR] [--repeats N] [--threads 1,2] [--gguf-contexts 512,2048,8128]
#                             [--coretypes Haswell,unset] [--models stories260K,random40m]
#                             [--clients 1,4,16,64] [--server-rounds 2] [--no-server] [--server-only]
#                             [--weights float32|native|float32,native]
#                             [--quick]
#   --llama-bin  the folder of your llama.cpp build's binaries (e.g. llama.cpp/build/bin); required
#   --peer-dir   where the models are converted and results written (default
#                $HOME/.cache/echokv-peer; must be outside the repository)
#   --gguf       benchmark this GGUF file with both engines (see above); default --coretypes unset
#   --quick      1 repeat, 1 thread, Haswell only, clients 1,4 (a smoke test, not figures)
# Environment: ECHOKV_BENCH_LOCK (default /work/.bench.lock, else /tmp/echokv-bench.lock).
set -euo pipefail

LLAMA_CPP_COMMIT=c392e5094deaf2d1a7c18683214f007fad3fe42b  # the commit the usage text names
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEER="${HOME:-/tmp}/.cache/echokv-peer"
BUILD="$REPO/build"
DATA="${ECHOKV_TEST_DATA:-$REPO/../shared}"
OUT=""
LB=""
REPEATS=3
THREADS="1,2"
CORETYPES="Haswell,unset"
MODELS="stories260K,random40m"
CLIENTS="1,4,16,64"
SERVER_ROUNDS=2
RUN_MODEL=1
RUN_SERVER=1
GGUF=""
CORETYPES_GIVEN=0
WEIGHTS="float32"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --peer-dir) PEER="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --llama-bin) LB="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --coretypes) CORETYPES="$2"; CORETYPES_GIVEN=1; shift 2 ;;
    --gguf) GGUF="$2"; shift 2 ;;
    --weights) WEIGHTS="$2"; shift 2 ;;
    --gguf-contexts) GGUF_CONTEXTS="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --server-rounds) SERVER_ROUNDS="$2"; shift 2 ;;
    --no-server) RUN_SERVER=0; shift ;;
    --server-only) RUN_MODEL=0; shift ;;
    --quick) REPEATS=1; THREADS=1; CORETYPES=Haswell; CLIENTS=1,4; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done

say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "llamacpp_compare: $*" >&2; exit 1; }
trap 'echo "llamacpp_compare: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

[[ -n "$LB" ]] || { echo "llamacpp_compare: --llama-bin DIR is required (your llama.cpp build's binaries)" >&2; usage 2 >&2; }
[[ -d "$LB" ]] || die "--llama-bin $LB is not a directory"
LB="$(cd "$LB" && pwd)"
mkdir -p "$PEER"
PEER="$(cd "$PEER" && pwd)"
case "$PEER/" in "$REPO/"*) die "--peer-dir $PEER is inside the repository; the peer's files must stay outside it" ;; esac
if [[ -n "$GGUF" ]]; then
  [[ -f "$GGUF" ]] || die "--gguf $GGUF: no such file"
  GGUF="$(cd "$(dirname "$GGUF")" && pwd)/$(basename "$GGUF")"
  [[ $CORETYPES_GIVEN == 1 ]] || CORETYPES="unset"
  [[ -x /usr/bin/time ]] || die "--gguf needs /usr/bin/time (GNU time, for the peak RSS)"
else
  [[ -d "$DATA/models/stories260K" ]] || die "no $DATA/models/stories260K (give --data or ECHOKV_TEST_DATA)"
fi
BENCH_LOCK="${ECHOKV_BENCH_LOCK:-/work/.bench.lock}"
[[ -d "$(dirname "$BENCH_LOCK")" && -w "$(dirname "$BENCH_LOCK")" ]] || BENCH_LOCK=/tmp/echokv-bench.lock
OUT="${OUT:-$PEER/results-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
EB="$BUILD/bin"

load1() { cut -d' ' -f1 /proc/loadavg; }
# Every timed command waits for the machine's benchmark lock (other sessions' timed runs).
locked() { flock "$BENCH_LOCK" "$@"; }

# ---- --gguf FILE: one GGUF file, both engines (issue 27 item 9) ---------------------------
gguf_compare() {
  local EB="$BUILD/bin" raw="$OUT/raw.tsv" ctxs="${GGUF_CONTEXTS:-512,2048,8128}" n_ctx=8192 logs="$OUT/logs"
  mkdir -p "$logs"
  if [[ ! -x "$EB/echokv-bench-model" ]]; then
    say "echokv: building echokv-bench-model in $BUILD"
    cmake --build "$BUILD" -j2 --target echokv-bench-model >&2
  fi
  {
    echo "# echokv vs llama.cpp on $(basename "$GGUF") — $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
    echo "- file: $GGUF ($(stat -c %s "$GGUF") bytes, sha256 $(sha256sum "$GGUF" | cut -c1-16)…)"
    echo "- llama.cpp $PEER_COMMIT ($LB, built by the user), echokv $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "- OPENBLAS_CORETYPE in the caller's environment: ${OPENBLAS_CORETYPE:-(unset)}; rows run with: $CORETYPES; load at start: $(cat /proc/loadavg)"
    echo "- command: $0 --llama-bin $LB --gguf $GGUF --repeats $REPEATS --threads $THREADS --coretypes $CORETYPES --weights $WEIGHTS"
  } >"$OUT/header.md"
  printf 'coretype\tthreads\trepeat\tmetric\techokv\tllamacpp\tload1\n' >"$raw"
  local core t r l tag e_out l_out wm suffix
  IFS=, read -r -a WEIGHT_LIST <<<"$WEIGHTS"
  IFS=, read -r -a THREAD_LIST <<<"$THREADS"
  IFS=, read -r -a CORE_LIST <<<"$CORETYPES"
  IFS=, read -r -a CL <<<"$ctxs"
  for core in "${CORE_LIST[@]}"; do
    for t in "${THREAD_LIST[@]}"; do
      for r in $(seq 1 "$REPEATS"); do
        if [[ "$core" == unset ]]; then CORE_ENV=(env -u OPENBLAS_CORETYPE); else CORE_ENV=(env OPENBLAS_CORETYPE="$core"); fi
        for wm in "${WEIGHT_LIST[@]}"; do
        suffix=""
        [[ ${#WEIGHT_LIST[@]} == 1 && "$wm" == float32 ]] || suffix=" [$wm]"
        tag="$logs/c$core-t$t-r$r-$wm"
        l="$(load1)"
        say "$(basename "$GGUF") OPENBLAS_CORETYPE=$core threads=$t repeat $r/$REPEATS weights $wm: echokv (load $l)"
        locked /usr/bin/time -v -o "$tag.echokv.time" "${CORE_ENV[@]}" "$EB/echokv-bench-model" --model "$GGUF" \
          --threads "$t" --contexts "$ctxs" --decode 64 --weights "$wm" >"$tag.echokv.out" 2>"$tag.echokv.err" \
          || die "echokv-bench-model failed, see $tag.echokv.err"
        local l2; l2="$(load1)"
        say "  llama.cpp (load $l2)"
        locked /usr/bin/time -v -o "$tag.llama.time" "${CORE_ENV[@]}" "$LB/llama-batched-bench" -m "$GGUF" \
          -c "$n_ctx" -b 2048 -npp "$ctxs" -ntg 64 -npl 1 -t "$t" --output-format jsonl \
          >"$tag.llama.out" 2>"$tag.llama.err" || die "llama-batched-bench failed, see $tag.llama.err"
        l="$l/$l2"
        for L in "${CL[@]}"; do
          e_out="$(awk -v L="$L" '$1 == L { print $2, $3 }' "$tag.echokv.out")"
          l_out="$(grep '^{' "$tag.llama.out" | python3 -c "import json,sys
for line in sys.stdin:
    j = json.loads(line)
    if j['pp'] == $L: print(j['speed_pp'], j['speed_tg'])")"
          printf '%s\t%s\t%s\tprefill@%s%s\t%s\t%s\t%s\n' "$core" "$t" "$r" "$L" "$suffix" "${e_out% *}" "${l_out% *}" "$l" >>"$raw"
          printf '%s\t%s\t%s\tdecode@%s%s\t%s\t%s\t%s\n' "$core" "$t" "$r" "$L" "$suffix" "${e_out#* }" "${l_out#* }" "$l" >>"$raw"
        done
        local e_load l_load e_rss l_rss
        e_load="$(sed -n 's/^load: \([0-9.]*\) s.*/\1/p' "$tag.echokv.out")"
        l_load="$(sed -n 's/.*load time = *\([0-9.]*\) ms.*/\1/p' "$tag.llama.err" | tail -1)"
        l_load="$(awk -v ms="$l_load" 'BEGIN { printf "%.3f", ms / 1000 }')"
        e_rss="$(awk -F': ' '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$tag.echokv.time")"
        l_rss="$(awk -F': ' '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$tag.llama.time")"
        printf '%s\t%s\t%s\tload s%s\t%s\t%s\t%s\n' "$core" "$t" "$r" "$suffix" "$e_load" "$l_load" "$l" >>"$raw"
        printf '%s\t%s\t%s\tpeak RSS MiB%s\t%s\t%s\t%s\n' "$core" "$t" "$r" "$suffix" "$e_rss" "$l_rss" "$l" >>"$raw"
        awk -F'\t' -v c="$core" -v t="$t" -v r="$r" -v sfx="$suffix" \
          '$1==c && $2==t && $3==r && $5>0 && $6>0 && (sfx == "" || index($4, sfx) > 0) { printf "    %-24s echokv %9.2f  llama.cpp %9.2f  ratio %5.2f  load %s\n", $4, $5, $6, $5/$6, $7 }' \
          "$raw" >&2
        done
      done
    done
  done
  python3 - "$raw" >"$OUT/model.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
groups = {}
for r in rows:
    groups.setdefault((r["coretype"], r["threads"], r["metric"]), []).append(r)
print("| OPENBLAS_CORETYPE | threads | metric | echokv (median) | llama.cpp (median) "
      "| ratio echokv/llama.cpp: median of pairs (min–max) | load1 before echokv/llama.cpp, each pair |")
print("|---|---:|---|---:|---:|---|---|")
def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0
for (core, threads, metric), rs in groups.items():
    e = [num(r["echokv"]) for r in rs]
    l = [num(r["llamacpp"]) for r in rs]
    ratios = [a / b for a, b in zip(e, l) if a > 0 and b > 0]
    rtxt = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "–"
    unit = "" if "@" not in metric else " tok/s"
    if unit and " [" in metric:  # "decode@512 [native]" -> "decode@512 tok/s [native]"
        name, mode = metric.split(" [", 1)
        metric, unit = name, f" tok/s [{mode}"
    print(f"| {core} | {threads} | {metric}{unit} | {statistics.median(e):.2f} | {statistics.median(l):.2f} "
          f"| {rtxt} | {', '.join(r['load1'] for r in rs)} |")
PY
  cat "$OUT/header.md"
  echo
  cat "$OUT/model.md"
  say "done; results and logs in $OUT"
}

# ---- 1. the peer: the user's binaries, checked -------------------------------------------
PEER_TOOLS=(llama-bench llama-batched-bench llama-convert-llama2c-to-ggml llama-server)
[[ -z "$GGUF" ]] || PEER_TOOLS=(llama-batched-bench)
for t in "${PEER_TOOLS[@]}"; do
  [[ -x "$LB/$t" ]] || die "no executable $LB/$t: build llama.cpp's tools by its own instructions and give their folder"
done
if [[ -n "$GGUF" ]]; then
  PEER_VERSION="$("$LB/llama-batched-bench" --version 2>&1)" || die "$LB/llama-batched-bench --version failed: $PEER_VERSION"
  PEER_COMMIT="$(echo "$PEER_VERSION" | sed -n 's/^version: [0-9]* (\([0-9a-f]*\)).*/\1/p' | head -1)"
  [[ -n "$PEER_COMMIT" ]] || PEER_COMMIT="unknown ($(echo "$PEER_VERSION" | head -1))"
  say "llama.cpp: $LB, commit $PEER_COMMIT"
  gguf_compare
  exit 0
fi
# llama-server and llama-batched-bench print "version: N (COMMIT)" for --version; the other
# two have no --version, so they must at least answer --help.
PEER_VERSION="$("$LB/llama-server" --version 2>&1)" || die "$LB/llama-server --version failed: $PEER_VERSION"
"$LB/llama-batched-bench" --version >/dev/null 2>&1 || die "$LB/llama-batched-bench --version failed"
"$LB/llama-bench" --help >/dev/null 2>&1 || die "$LB/llama-bench --help failed"
"$LB/llama-convert-llama2c-to-ggml" --help >/dev/null 2>&1 || die "$LB/llama-convert-llama2c-to-ggml --help failed"
PEER_COMMIT="$(echo "$PEER_VERSION" | sed -n 's/^version: [0-9]* (\([0-9a-f]*\)).*/\1/p' | head -1)"
[[ -n "$PEER_COMMIT" ]] || PEER_COMMIT="unknown (llama-server --version: $(echo "$PEER_VERSION" | head -1))"
case "$LLAMA_CPP_COMMIT" in
  "$PEER_COMMIT"*) ;;
  *) say "note: these binaries report llama.cpp $PEER_COMMIT, not $LLAMA_CPP_COMMIT (the figures' commit)" ;;
esac
say "llama.cpp: $LB, commit $PEER_COMMIT"

# ---- 2. echokv binaries, weights ----------------------------------------------------------
ECHOKV_TOOLS=(echokv-bench-model echokv-export-llama2c echokv-bench-server echokv-server)
for t in "${ECHOKV_TOOLS[@]}"; do
  if [[ ! -x "$EB/$t" ]]; then
    say "echokv: building ${ECHOKV_TOOLS[*]} in $BUILD"
    cmake --build "$BUILD" -j2 --target "${ECHOKV_TOOLS[@]}" >&2
    break
  fi
done
M="$PEER/models"
mkdir -p "$M"
model_dir() { [[ "$1" == stories260K ]] && echo "$DATA/models/stories260K" || echo "$M/random40m"; }
if [[ ",$MODELS," == *,random40m,* && ! -f "$M/random40m/model.safetensors" ]]; then
  say "writing the random 40M llama (seed 7) to $M/random40m"
  "$EB/echokv-bench-model" --random40m "$M/random40m" --contexts 1 --decode 1 --threads 1 \
    >/dev/null
fi
# echokv-server wants a tokenizer beside the weights (the bench itself sends ids only).
if [[ -d "$M/random40m" && ! -f "$M/random40m/tokenizer.model" ]]; then
  cp "$DATA/tokenizers/mistral-7b-v0.2/tokenizer.model" "$M/random40m/tokenizer.model"
fi
convert() {  # model tokenizer.model
  local name="$1" tok="$2"
  [[ -f "$M/$name-f32.gguf" ]] && return
  say "exporting $name to llama2.c format and converting it to GGUF"
  "$EB/echokv-export-llama2c" --model "$(model_dir "$name")" --out "$M/$name.bin" \
    --tokenizer-model "$tok" --tokenizer-out "$M/$name.tok.bin" >&2
  "$LB/llama-convert-llama2c-to-ggml" --copy-vocab-from-model "$M/$name.tok.bin" \
    --llama2c-model "$M/$name.bin" --llama2c-output-model "$M/$name-f32.gguf" >"$M/$name.convert.log" 2>&1 \
    || die "conversion of $name failed, see $M/$name.convert.log"
}
IFS=, read -r -a MODEL_LIST <<<"$MODELS"
for model in "${MODEL_LIST[@]}"; do
  case "$model" in
    stories260K) convert stories260K "$DATA/models/stories260K/tokenizer.model" ;;
    random40m) convert random40m "$DATA/tokenizers/mistral-7b-v0.2/tokenizer.model" ;;
    *) die "unknown model $model (stories260K, random40m)" ;;
  esac
done

# echokv-bench-model rows: context prefill decode ... -> "context prefill decode"
echokv_rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 3 { print $1, $2, $3 }'; }

{
  echo "# echokv vs llama.cpp — $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
  echo "- llama.cpp $PEER_COMMIT ($LB, built by the user), echokv $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "- OPENBLAS_CORETYPE in the caller's environment: ${OPENBLAS_CORETYPE:-(unset)}; load at start: $(cat /proc/loadavg)"
  echo "- command: $0 --llama-bin $LB --repeats $REPEATS --threads $THREADS --coretypes $CORETYPES --models $MODELS --clients $CLIENTS --server-rounds $SERVER_ROUNDS"
} >"$OUT/header.md"

# ---- 3. single-stream speed, paired per repeat ---------------------------------------------
RAW="$OUT/raw.tsv"
if [[ $RUN_MODEL == 1 ]]; then
  printf 'model\tcoretype\tthreads\trepeat\tmetric\techokv\tllamacpp\tload1\n' >"$RAW"
  IFS=, read -r -a THREAD_LIST <<<"$THREADS"
  IFS=, read -r -a CORE_LIST <<<"$CORETYPES"
  for model in "${MODEL_LIST[@]}"; do
    dir="$(model_dir "$model")"
    gguf="$M/$model-f32.gguf"
    if [[ "$model" == stories260K ]]; then CTXS="448"; else CTXS="512,2048"; fi
    max_ctx="${CTXS##*,}"
    for core in "${CORE_LIST[@]}"; do
      for t in "${THREAD_LIST[@]}"; do
        for r in $(seq 1 "$REPEATS"); do
          say "$model OPENBLAS_CORETYPE=$core threads=$t repeat $r/$REPEATS (load $(load1))"
          if [[ "$core" == unset ]]; then CORE_ENV=(env -u OPENBLAS_CORETYPE); else CORE_ENV=(env OPENBLAS_CORETYPE="$core"); fi
          EK=(--model "$dir" --threads "$t")
          # pp512 / tg128
          l="$(load1)"
          e_pp="$(locked "${CORE_ENV[@]}" "$EB/echokv-bench-model" "${EK[@]}" --contexts 512 --decode 0 2>/dev/null \
                  | echokv_rows | awk '{ print $2 }')"
          e_tg="$(locked "${CORE_ENV[@]}" "$EB/echokv-bench-model" "${EK[@]}" --contexts 1 --decode 128 2>/dev/null \
                  | echokv_rows | awk '{ print $3 }')"
          lb="$(locked "${CORE_ENV[@]}" "$LB/llama-bench" -m "$gguf" -p 512 -n 128 -t "$t" -r 1 -o csv 2>/dev/null)"
          l_pp="$(echo "$lb" | python3 -c 'import csv,sys; print(*[r["avg_ts"] for r in csv.DictReader(sys.stdin) if r["n_prompt"]=="512"])')"
          l_tg="$(echo "$lb" | python3 -c 'import csv,sys; print(*[r["avg_ts"] for r in csv.DictReader(sys.stdin) if r["n_gen"]=="128"])')"
          printf '%s\t%s\t%s\t%s\tpp512\t%s\t%s\t%s\n' "$model" "$core" "$t" "$r" "$e_pp" "$l_pp" "$l" >>"$RAW"
          printf '%s\t%s\t%s\t%s\ttg128\t%s\t%s\t%s\n' "$model" "$core" "$t" "$r" "$e_tg" "$l_tg" "$l" >>"$RAW"
          # prefill / decode at context L
          l="$(load1)"
          erows="$(locked "${CORE_ENV[@]}" "$EB/echokv-bench-model" "${EK[@]}" --contexts "$CTXS" --decode 64 2>/dev/null \
                   | echokv_rows)"
          lrows="$(locked "${CORE_ENV[@]}" "$LB/llama-batched-bench" -m "$gguf" -c $((max_ctx + 64)) -b 2048 \
                   -npp "$CTXS" -ntg 64 -npl 1 -t "$t" --output-format jsonl 2>/dev/null | grep '^{' || true)"
          IFS=, read -r -a CL <<<"$CTXS"
          for L in "${CL[@]}"; do
            e="$(echo "$erows" | awk -v L="$L" '$1 == L { print $2, $3 }')"
            lj="$(echo "$lrows" | python3 -c "import json,sys
for line in sys.stdin:
    j = json.loads(line)
    if j['pp'] == $L: print(j['speed_pp'], j['speed_tg'])")"
            printf '%s\t%s\t%s\t%s\tprefill@%s\t%s\t%s\t%s\n' "$model" "$core" "$t" "$r" "$L" "${e% *}" "${lj% *}" "$l" >>"$RAW"
            printf '%s\t%s\t%s\t%s\tdecode@%s\t%s\t%s\t%s\n' "$model" "$core" "$t" "$r" "$L" "${e#* }" "${lj#* }" "$l" >>"$RAW"
          done
          tail -n +2 "$RAW" | awk -F'\t' -v m="$model" -v c="$core" -v t="$t" -v r="$r" \
            '$1==m && $2==c && $3==t && $4==r && $6>0 && $7>0 { printf "    %-12s echokv %9.1f  llama.cpp %9.1f  ratio %5.2f  load %s\n", $5, $6, $7, $6/$7, $8 }' >&2
        done
      done
    done
  done
  python3 - "$RAW" >"$OUT/model.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
groups = {}
for r in rows:
    groups.setdefault((r["model"], r["coretype"], r["threads"], r["metric"]), []).append(r)
print("| model | OPENBLAS_CORETYPE | threads | metric | echokv tok/s (median) | llama.cpp tok/s (median) "
      "| ratio echokv/llama.cpp: median of pairs (min–max) | load1 (min–max) |")
print("|---|---|---:|---|---:|---:|---|---|")
def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0
for (model, core, threads, metric), rs in groups.items():
    e = [num(r["echokv"]) for r in rs]
    l = [num(r["llamacpp"]) for r in rs]
    ratios = [a / b for a, b in zip(e, l) if a > 0 and b > 0]
    loads = [num(r["load1"]) for r in rs]
    rtxt = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "–"
    print(f"| {model} | {core} | {threads} | {metric} | {statistics.median(e):.1f} | {statistics.median(l):.1f} "
          f"| {rtxt} | {min(loads):.2f}–{max(loads):.2f} |")
PY
  say "single-stream table: $OUT/model.md"
fi

# ---- 4. serving: echokv-server vs llama-server --------------------------------------------
if [[ $RUN_SERVER == 1 ]]; then
  : >"$OUT/server.md"
  for model in "${MODEL_LIST[@]}"; do
    say "serving benchmark on $model, clients $CLIENTS (OPENBLAS_CORETYPE=Haswell, 2 threads each)"
    {
      echo "### $model (load at start $(load1))"
      echo
      locked env OPENBLAS_CORETYPE=Haswell "$EB/echokv-bench-server" --model "$(model_dir "$model")" \
        --server_binary "$EB/echokv-server" --policy full --prompt_tokens 256 --max_tokens 64 --rounds "$SERVER_ROUNDS" \
        --clients "$CLIENTS" --server_threads 2 --llama_server "$LB/llama-server" \
        --llama_model "$M/$model-f32.gguf" --llama_threads 2
      echo
      echo "(load at end $(load1))"
      echo
    } >>"$OUT/server.md"
  done
  say "serving tables: $OUT/server.md"
fi

cat "$OUT/header.md"
[[ -f "$OUT/model.md" ]] && { echo; cat "$OUT/model.md"; }
[[ -f "$OUT/server.md" ]] && { echo; cat "$OUT/server.md"; }
say "done; results in $OUT"
