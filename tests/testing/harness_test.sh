#!/usr/bin/env bash
# The test harness itself: a gtest binary with the exit-code contract of gtest_main.cc,
# run by a real ctest with the properties echokv_cc_test gives every test, must be
#   failed  when a failing case runs beside a skipped one (never "skipped"),
#   skipped when only a skipped case runs (and the reason is printed),
#   passed  when only a passing case runs;
# and scripts/check_no_skips.sh (CI's "nothing may skip" rule) must reject a run with a
# skip and accept one without.
# The verdict properties (SKIP_RETURN_CODE, SKIP/PASS/FAIL_REGULAR_EXPRESSION, WILL_FAIL)
# are copied from a real echokv_cc_test of this build (ctest --show-only=json-v1), so a
# change to cmake/EchokvHelpers.cmake that lets a skip hide a failure fails here.
#   harness_test.sh CASES_BINARY BUILD_DIR REFERENCE_TEST CHECK_NO_SKIPS_SCRIPT
set -uo pipefail
bin="$1"; build="$2"; reference="$3"; check="$4"
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT
props="$(cd "$build" && ctest --show-only=json-v1 -R "^${reference}\$" | python3 -c '
import json, sys
tests = json.load(sys.stdin)["tests"]
if len(tests) != 1:
    sys.exit("harness: reference test not found")
out = []
for p in tests[0].get("properties", []):
    if p["name"] in ("SKIP_RETURN_CODE", "WILL_FAIL"):
        out.append("%s %s" % (p["name"], p["value"]))
    elif p["name"] in ("SKIP_REGULAR_EXPRESSION", "PASS_REGULAR_EXPRESSION", "FAIL_REGULAR_EXPRESSION"):
        vals = p["value"] if isinstance(p["value"], list) else [p["value"]]
        out.append("%s \"%s\"" % (p["name"], ";".join(v.replace("\\", "\\\\").replace("\"", "\\\"") for v in vals)))
print(" ".join(out))
')" || { echo "FAIL: cannot read the properties of $reference"; exit 1; }
echo "harness: properties of $reference: ${props:-<none>}"
{
  for t in fail_and_skip:Harness.Fails:Harness.Skips skip_only:Harness.Skips pass_only:Harness.Passes; do
    name="${t%%:*}"; filter="${t#*:}"
    echo "add_test($name \"$bin\" \"--gtest_filter=$filter\")"
    [[ -n "$props" ]] && echo "set_tests_properties($name PROPERTIES $props)"
  done
} > "$dir/CTestTestfile.cmake"
fail=0
expect() {  # name, expected ctest exit (0 / nonzero), expected word in ctest output
  local out rc
  out="$(cd "$dir" && ctest --output-on-failure -R "^$1\$" 2>&1)"; rc=$?
  echo "$out" > "$dir/$1.log"
  if [[ "$2" == 0 && $rc -ne 0 ]] || [[ "$2" != 0 && $rc -eq 0 ]]; then
    echo "FAIL: ctest on $1 exited $rc, expected $2"; echo "$out"; fail=1
  fi
  if ! grep -q -- "$3" <<<"$out"; then
    echo "FAIL: ctest on $1 did not report '$3'"; echo "$out"; fail=1
  fi
}
expect fail_and_skip nonzero "Failed"
expect skip_only 0 "Skipped"
expect pass_only 0 "Passed"
# The reason of a skip reaches the log.
verbose="$(cd "$dir" && ctest -V -R '^skip_only$' 2>&1)"
grep -q "Harness.Skips: harness: deliberately skipped for a stated reason" <<<"$verbose" ||
  { echo "FAIL: the skip reason is not printed"; echo "$verbose"; fail=1; }
# CI's rule: a skipped test is an error, a clean run is not.
if "$check" "$dir/skip_only.log" >/dev/null 2>&1; then
  echo "FAIL: check_no_skips accepted a run with a skipped test"; fail=1
fi
if ! "$check" "$dir/pass_only.log" >/dev/null 2>&1; then
  echo "FAIL: check_no_skips rejected a run without skips"; fail=1
fi
[[ $fail -eq 0 ]] && echo "harness: all verdicts as expected"
exit $fail
