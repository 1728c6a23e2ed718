#!/usr/bin/env bash
# Sets up (idempotent), builds, and runs the whole test suite with ctest.
#   scripts/test.sh                 # everything
#   scripts/test.sh -L unit         # extra arguments go to ctest
#   scripts/test.sh --sanitize      # ASan + UBSan build in build-asan/, unit + server tests
# --sanitize builds the whole project with -fsanitize=address,undefined (fatal, -O1; own
# build dir, ccache) and runs the unit and integration tests under it, without the ones
# that run no C++ of ours (deploy chart checks, Python packaging) and the kill -9 test
# (the slowest: 136 s sanitized, 50 restarts of a sanitized server; the recovery code it
# drives stays covered by state_crash_test and server_durability_test). Measurements in
# docs/SECURITY.md, "Sanitizer run".
# Sanitizer reports are fatal in every process, servers started by tests included.
# Tests labelled `model` need real data: ECHOKV_TEST_DATA defaults to ../shared
# beside the checkout when that folder exists; they skip with a message otherwise.
# With CI=true (or ECHOKV_STRICT=1) a missing data folder, an empty test selection or
# any skipped test is an error: a skipped test is not a passed test.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
if [[ "${1:-}" == "--sanitize" ]]; then
  sanitize=1
  shift
fi
strict=0
if [[ "${CI:-}" == "true" || "${ECHOKV_STRICT:-}" == "1" ]]; then strict=1; fi
if ((sanitize)); then
  export ECHOKV_BUILD_DIR="${ECHOKV_BUILD_DIR:-build-asan}"
  export ECHOKV_CMAKE_ARGS="-DECHOKV_SANITIZE=ON ${ECHOKV_CMAKE_ARGS:-}"
  # Everything fatal; leaks checked at every exit. LibTorch, OpenBLAS and gRPC are not
  # instrumented: tests/sanitizer/lsan.supp lists (and explains) the only reports from them.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:check_initialization_order=1:detect_stack_use_after_return=0}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0}"
fi
scripts/setup.sh
if [[ -z "${ECHOKV_TEST_DATA:-}" && -d ../shared/models ]]; then
  export ECHOKV_TEST_DATA="$(cd ../shared && pwd)"
fi
if ((strict)) && [[ -z "${ECHOKV_TEST_DATA:-}" || ! -d "${ECHOKV_TEST_DATA}/models/stories260K" ]]; then
  echo "test: CI needs the real test data: ECHOKV_TEST_DATA='${ECHOKV_TEST_DATA:-}' has no models/stories260K" >&2
  exit 1
fi
echo "test: ECHOKV_TEST_DATA=${ECHOKV_TEST_DATA:-<unset: model tests will skip>}" >&2
# One LibTorch thread per test process: ctest runs tests in parallel, and OpenMP
# regions with more threads than free cores stall on each other.
export ECHOKV_THREADS="${ECHOKV_THREADS:-1}"
cd "${ECHOKV_BUILD_DIR:-build}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
selection=()
# Tests labelled `cuda` (the CUDA build's, tests/cuda) need a GPU: never part of a plain
# run (a CPU build has none; scripts/gpu-check.sh runs them with -L cuda).
if (($# == 0)); then selection=(-LE '^cuda$'); fi
if ((sanitize)) && (($# == 0)); then
  selection=(-L '^(unit|integration)$' -E "${ECHOKV_SANITIZE_EXCLUDE:-^(deploy_.*|python_client_pip_install|python_client_stubs_fresh|server_crash_restart_test)\$}")
fi
rc=0
ctest --output-on-failure --no-tests=error -j "${ECHOKV_TEST_JOBS:-2}" "${selection[@]}" "$@" 2>&1 | tee "$log" || rc=$?
if ((rc != 0)); then exit "$rc"; fi
if ((strict)); then
  if ! ../scripts/check_no_skips.sh "$log"; then
    # Show why each skipped test skipped (its binary lists every case and reason).
    names="$(sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \((Skipped|Not Run|Disabled)\).*/\1/p' "$log" | paste -sd'|')"
    if [[ -n "$names" ]]; then
      ctest -V -R "^(${names})\$" 2>&1 | grep -E 'echokv-test:|^[0-9]+: +[A-Za-z0-9_/]+\.[A-Za-z0-9_/]+: |SKIP' || true
    fi
    exit 1
  fi
fi
