#!/usr/bin/env bash
# CI's rule: a skipped test is not a passed test. Reads a ctest log and fails, naming
# each skipped test and the reason its binary printed, when any test did not run.
#   scripts/check_no_skips.sh CTEST_LOG
set -euo pipefail
log="$1"
skipped="$(grep -E '\*\*\*Skipped|\((Skipped|Not Run|Disabled)\)' "$log" || true)"
if [[ -n "$skipped" ]]; then
  echo "check_no_skips: tests were skipped, which CI does not allow:" >&2
  echo "$skipped" >&2
  grep -E '^(echokv-test: |  [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+: )|^.*Skipped.*' "$log" | sort -u >&2 || true
  exit 1
fi
echo "check_no_skips: no test was skipped" >&2
