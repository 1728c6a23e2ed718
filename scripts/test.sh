#!/usr/bin/env bash
# Sets up (idempotent), builds, and runs the whole test suite with ctest.
#   scripts/test.sh                 # everything
#   scripts/test.sh -L unit         # extra arguments go to ctest
# Tests labelled `model` need real data: ECHOKV_TEST_DATA defaults to ../shared
# beside the checkout when that folder exists; they skip with a message otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ -z "${ECHOKV_TEST_DATA:-}" && -d ../shared/models ]]; then
  export ECHOKV_TEST_DATA="$(cd ../shared && pwd)"
fi
echo "test: ECHOKV_TEST_DATA=${ECHOKV_TEST_DATA:-<unset: model tests will skip>}" >&2
# One LibTorch thread per test process: ctest runs tests in parallel, and OpenMP
# regions with more threads than free cores stall on each other.
export ECHOKV_THREADS="${ECHOKV_THREADS:-1}"
cd "${ECHOKV_BUILD_DIR:-build}"
ctest --output-on-failure -j "${ECHOKV_TEST_JOBS:-2}" "$@"
