#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan, build dir build-fuzz/)
# and runs each for SECONDS (default 20) on its committed seed corpus, one after another.
#   scripts/fuzz.sh                  # every target, 20 s each (what .ci/run does)
#   scripts/fuzz.sh 600              # the long runs of docs/SECURITY.md
#   scripts/fuzz.sh 60 fuzz_edge     # some targets only
# Prints executions, exec/s and corpus size per target. Fails when any target reports a
# crash, a leak, an ASan or UBSan error, a timeout (-timeout, s per input) or an
# out-of-memory: the reproducer lands in build-fuzz/artifacts/<target>/ and the log in
# build-fuzz/logs/<target>.log. Inputs the run found are kept in build-fuzz/corpus/<target>/
# (started afresh each run, so a run always starts from the committed corpus); merge
# the interesting ones back into tests/fuzz/corpus by hand (libFuzzer -merge=1).
# Env: ECHOKV_JOBS (build jobs, default 2), ECHOKV_TEST_DATA (default ../shared),
# ECHOKV_FUZZ_TIMEOUT (per input, default 30 s), ECHOKV_FUZZ_RSS_MB (default 3072),
# ECHOKV_FUZZ_OUT (where logs/, corpus/ and artifacts/ go; default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(fuzz_model_files fuzz_gguf fuzz_tokenizer fuzz_chat_template fuzz_edge fuzz_http_head fuzz_snapshot)
fi
BUILD=build-fuzz
if [[ -z "${ECHOKV_TEST_DATA:-}" && -d ../shared/models ]]; then
  export ECHOKV_TEST_DATA="$(cd ../shared && pwd)"
fi
if [[ -z "${ECHOKV_TEST_DATA:-}" || ! -d "${ECHOKV_TEST_DATA}/tokenizers" ]]; then
  echo "fuzz: the targets load the real tokenizers and templates: set ECHOKV_TEST_DATA (../shared)" >&2
  exit 1
fi
command -v clang++ >/dev/null || { echo "fuzz: needs clang (scripts/setup.sh installs it)" >&2; exit 1; }
if [[ ! -f "$BUILD/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DECHOKV_FUZZ=ON >/dev/null
fi
echo "fuzz: building ${targets[*]} in $BUILD" >&2
cmake --build "$BUILD" -j "${ECHOKV_JOBS:-2}" --target "${targets[@]}"

# Findings are fatal and reported with stacks: UBSan aborts (the build also has
# -fno-sanitize-recover=all), ASan checks leaks at exit, libFuzzer per input.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export ECHOKV_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT="${ECHOKV_FUZZ_OUT:-$BUILD}"
mkdir -p "$OUT/logs"
failed=()
rows=()
for t in "${targets[@]}"; do
  seeds="tests/fuzz/corpus/$t"
  work="$OUT/corpus/$t"
  artifacts="$OUT/artifacts/$t/"
  log="$OUT/logs/$t.log"
  rm -rf "$work"
  mkdir -p "$work" "$artifacts"
  echo "fuzz: $t for ${seconds}s on $(ls "$seeds" | wc -l) seeds (log $log)" >&2
  rc=0
  "$BUILD/fuzz/$t" -max_total_time="$seconds" -timeout="${ECHOKV_FUZZ_TIMEOUT:-30}" \
    -rss_limit_mb="${ECHOKV_FUZZ_RSS_MB:-3072}" -print_final_stats=1 -artifact_prefix="$artifacts" \
    "$work" "$seeds" >"$log" 2>&1 || rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  corpus="$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 | sed 's/corp: //')"
  verdict=ok
  if ((rc != 0)) || grep -qE '^==[0-9]+==ERROR|runtime error:|^SUMMARY: |invariant violated' "$log"; then
    verdict="FAILED (rc $rc)"
    failed+=("$t")
    grep -E '^==[0-9]+==ERROR|runtime error:|^SUMMARY: |invariant violated|Test unit written|ALARM|out-of-memory' "$log" | head -5 >&2 || true
  fi
  rows+=("$(printf '%-20s %8s %12s %8s %14s  %s' "$t" "$seconds" "${execs:-?}" "${rate:-?}" "${corpus:-?}" "$verdict")")
done
printf '%-20s %8s %12s %8s %14s  %s\n' target seconds executions exec/s corpus result
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (reproducers in $OUT/artifacts/, logs in $OUT/logs/)" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets clean" >&2
