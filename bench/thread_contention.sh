#!/usr/bin/env bash
# Decode speed with one competing CPU-bound process (issue 11): the thread count the
# server used to pick (every core of the node, OpenMP's spinning waits) against what it
# picks now (the CPUs it may use: affinity mask / cgroup quota, one thread for small
# models, OMP_WAIT_POLICY=passive as the image sets), on the same machine at the same
# moment, interleaved, REPEATS times each; medians of decode tokens/s.
#   bench/thread_contention.sh [MODEL_DIR ...]      (default: the embedded stories260K)
#   REPEATS=5 TOKENS=128 bench/thread_contention.sh models/stories260K /tmp/m40
# A pod limited to one CPU is stood in for by `taskset -c 0` (its affinity mask), with
# the competitor on the same CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${ECHOKV_BUILD_DIR:-build}/bin"
REPEATS="${REPEATS:-3}"
TOKENS="${TOKENS:-128}"
CORES="$(nproc)"
models=("$@")
((${#models[@]})) || models=(models/stories260K)
decode_rate() {  # env/taskset prefix... -- model threads-flag
  "$@" 2>/dev/null | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print("%.1f" % (len(d["output_ids"]) / d["timings_ms"]["decode"] * 1000.0))'
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "machine: $CORES cores, $(uname -r); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(date -u +%FT%TZ)"
printf '%-28s %-34s %10s %10s %8s\n' model setting before after ratio
for model in "${models[@]}"; do
  for scope in node pod1cpu; do
    if [[ $scope == node ]]; then pin=(); comp=(yes); else pin=(taskset -c 0); comp=(taskset -c 0 yes); fi
    "${comp[@]}" >/dev/null &
    competitor=$!
    before=(); after=()
    for _ in $(seq "$REPEATS"); do
      # before: the node's core count, OpenMP's default (spinning) waits
      before+=("$(decode_rate "${pin[@]}" env -u OMP_WAIT_POLICY "$BIN/echokv-generate" --model "$model" \
        --prompt "Once upon a time" --max-tokens "$TOKENS" --threads "$CORES" --json)")
      # after: the default choice, passive waits (deploy/Dockerfile)
      after+=("$(decode_rate "${pin[@]}" env -u ECHOKV_THREADS OMP_WAIT_POLICY=passive "$BIN/echokv-generate" \
        --model "$model" --prompt "Once upon a time" --max-tokens "$TOKENS" --json)")
    done
    kill "$competitor"; wait "$competitor" 2>/dev/null || true
    b="$(median "${before[@]}")"; a="$(median "${after[@]}")"
    setting="$([[ $scope == node ]] && echo "node ($CORES CPUs) + 1 competitor" || echo "1-CPU pod (taskset) + 1 competitor")"
    printf '%-28s %-34s %10s %10s %7.2fx\n' "$(basename "$model")" "$setting" "$b" "$a" "$(/usr/bin/python3 -c "print($a / $b)")"
  done
done
echo "(decode tokens/s, medians of $REPEATS interleaved runs of $TOKENS tokens; load average $(cut -d' ' -f1-3 /proc/loadavg))"
