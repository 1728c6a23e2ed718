#!/bin/sh
# Tests deploy/docker-entrypoint.sh with a fake echokv-server that prints its
# arguments, and the image contract the Helm chart relies on (deploy/Dockerfile).
#   deploy/tests/entrypoint_test.sh      (ctest: deploy_entrypoint, label unit)
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
deploy="$(dirname "$here")"
entry="$deploy/docker-entrypoint.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat > "$tmp/fake-server" <<'SH'
#!/bin/sh
for a in "$@"; do echo "$a"; done
SH
chmod +x "$tmp/fake-server"
mkdir -p "$tmp/model"
echo '{}' > "$tmp/model/config.json"

# 1. Defaults: model, dual-stack host, ports; nothing else.
out="$(env -i PATH="$PATH" ECHOKV_SERVER_BIN="$tmp/fake-server" ECHOKV_MODEL="$tmp/model" sh "$entry" 2>/dev/null)"
want="--model=$tmp/model
--host=[::]
--port=50051
--metrics_port=9464"
[ "$out" = "$want" ] || fail "defaults: got
$out"

# 2. Every variable, and arguments after them (they win: absl keeps the last).
out="$(env -i PATH="$PATH" ECHOKV_SERVER_BIN="$tmp/fake-server" ECHOKV_MODEL="$tmp/model" \
  ECHOKV_HOST=0.0.0.0 ECHOKV_GRPC_PORT=6000 ECHOKV_METRICS_PORT=-1 ECHOKV_HTTP_PORT=8080 \
  ECHOKV_REPLICA_ID=echokv-2 ECHOKV_STATE_DIR="$tmp/vol/sessions" \
  sh "$entry" --port=7000 "--flagfile=/etc/echokv/config/echokv.flags" 2>/dev/null)"
want="--model=$tmp/model
--host=0.0.0.0
--port=6000
--metrics_port=-1
--http_port=8080
--replica_id=echokv-2
--state_dir=$tmp/vol/sessions
--port=7000
--flagfile=/etc/echokv/config/echokv.flags"
[ "$out" = "$want" ] || fail "all variables: got
$out"
[ -d "$tmp/vol/sessions" ] || fail "the state dir was not created"

# 2b. OPENBLAS_CORETYPE from the CPU flags (the fake server prints it), an explicit
# value kept.
cat > "$tmp/fake-env-server" <<'SH'
#!/bin/sh
echo "core=${OPENBLAS_CORETYPE:-unset}"
SH
chmod +x "$tmp/fake-env-server"
printf 'processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512dq adx avx512cd sha_ni avx512bw avx512vl\n' > "$tmp/cpu512"
printf 'flags\t\t: fpu sse2 avx avx2 fma bmi2\n' > "$tmp/cpu2"
printf 'flags\t\t: fpu sse2 avx2 fma avx512f avx512cd\n' > "$tmp/cpu512partial"
printf 'flags\t\t: fpu sse2 sse3\n' > "$tmp/cpuold"
for case_ in "cpu512 SkylakeX" "cpu2 Haswell" "cpu512partial Haswell" "cpuold unset"; do
  set -- $case_
  got="$(env -i PATH="$PATH" ECHOKV_SERVER_BIN="$tmp/fake-env-server" ECHOKV_MODEL="$tmp/model" \
         ECHOKV_CPUINFO="$tmp/$1" sh "$entry" 2>/dev/null)"
  [ "$got" = "core=$2" ] || fail "OPENBLAS_CORETYPE for $1: got $got, want core=$2"
done
got="$(env -i PATH="$PATH" ECHOKV_SERVER_BIN="$tmp/fake-env-server" ECHOKV_MODEL="$tmp/model" \
       ECHOKV_CPUINFO="$tmp/cpu512" OPENBLAS_CORETYPE=Haswell sh "$entry" 2>/dev/null)"
[ "$got" = "core=Haswell" ] || fail "an explicit OPENBLAS_CORETYPE must be kept: got $got"
set --

# 3. A model directory without config.json: exit 1 with a message naming it.
if err="$(env -i PATH="$PATH" ECHOKV_SERVER_BIN="$tmp/fake-server" ECHOKV_MODEL="$tmp/nomodel" sh "$entry" 2>&1)"; then
  fail "a missing model must fail"
fi
case "$err" in *"$tmp/nomodel has no config.json"*) ;; *) fail "missing model message: $err" ;; esac

# 4. A state dir that cannot be created: exit 1, the server never starts.
touch "$tmp/file"
if err="$(env -i PATH="$PATH" ECHOKV_SERVER_BIN="$tmp/fake-server" ECHOKV_MODEL="$tmp/model" \
    ECHOKV_STATE_DIR="$tmp/file/sessions" sh "$entry" 2>&1)"; then
  fail "an uncreatable state dir must fail"
fi
case "$err" in *"cannot create the state dir"*) ;; *) fail "state dir message: $err" ;; esac

# 5. The image contract: the embedded model where the chart and the entrypoint look,
# passive OpenMP waits and OPENBLAS_THREAD_TIMEOUT (no re-exec), the health service
# the probes ask for.
df="$deploy/Dockerfile"
for want in 'ECHOKV_MODEL=/opt/echokv/models/stories260K' 'OMP_WAIT_POLICY=passive' \
            'OPENBLAS_THREAD_TIMEOUT=4' 'ECHOKV_HOST=[::]' 'health --service echokv.v1.EchoKV' \
            'COPY --from=build /src/models/stories260K /opt/echokv/models/stories260K'; do
  grep -qF "$want" "$df" || fail "Dockerfile lacks $want"
done
grep -qF '"/opt/echokv/models/stories260K"' "$deploy/helm/echokv/templates/_helpers.tpl" ||
  fail "the chart's embedded model path differs from the image's"

if [ "$fails" -ne 0 ]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "entrypoint: all checks pass"
