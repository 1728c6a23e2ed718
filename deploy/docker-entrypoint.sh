#!/bin/sh
# Starts echokv-server from environment variables; extra arguments are more server
# flags (absl flags: a later --flag=value overrides an earlier one), e.g.
#   docker run echokv:dev --max_sessions=16 --flagfile=/etc/echokv/echokv.flags
# ECHOKV_MODEL         model directory (Hugging Face layout); default: the embedded
#                      stories260K (a 260K-parameter TinyStories Llama, for smoke tests)
# ECHOKV_HOST          listen address (default [::]: every IPv6 and IPv4 address)
# ECHOKV_GRPC_PORT     gRPC port (default 50051)
# ECHOKV_METRICS_PORT  Prometheus port (default 9464; -1 disables metrics)
# ECHOKV_HTTP_PORT     OpenAI-compatible HTTP API port (unset: the server's default)
# ECHOKV_STATE_DIR     durable session state (--state_dir); created if missing
# ECHOKV_REPLICA_ID    owner prefix of session ids (--replica_id; the Helm chart passes
#                      the pod name as a flag instead)
# ECHOKV_THREADS       compute threads, read by the server itself (the chart sets it
#                      from the pod's CPU request)
# ECHOKV_CPUINFO       (tests) the cpuinfo file read to pick OPENBLAS_CORETYPE
# The image sets OMP_WAIT_POLICY=passive and OPENBLAS_THREAD_TIMEOUT=4, so idle
# OpenMP/OpenBLAS workers sleep instead of spinning; with OPENBLAS_CORETYPE exported
# below the server need not re-exec itself to set either.
set -eu
server="${ECHOKV_SERVER_BIN:-/opt/echokv/bin/echokv-server}"  # overridable for tests
model="${ECHOKV_MODEL:-/opt/echokv/models/stories260K}"
if [ ! -f "${model}/config.json" ]; then
  echo "docker-entrypoint: ${model} has no config.json; mount a Hugging Face model directory and set ECHOKV_MODEL" >&2
  exit 1
fi
case "${model}" in
  /opt/echokv/models/stories260K)
    echo "docker-entrypoint: serving the embedded stories260K (a 260K-parameter TinyStories model, for smoke tests)" >&2 ;;
esac
# Flags from the environment first, so the arguments (later) override them.
if [ -n "${ECHOKV_STATE_DIR:-}" ]; then
  # A folder of the volume, not its root (which may hold lost+found): create it so a
  # fresh volume works; the server reports an unwritable one itself.
  if ! mkdir -p "${ECHOKV_STATE_DIR}"; then
    echo "docker-entrypoint: cannot create the state dir ${ECHOKV_STATE_DIR}" >&2
    exit 1
  fi
  set -- --state_dir="${ECHOKV_STATE_DIR}" "$@"
fi
if [ -n "${ECHOKV_REPLICA_ID:-}" ]; then
  set -- --replica_id="${ECHOKV_REPLICA_ID}" "$@"
fi
if [ -n "${ECHOKV_HTTP_PORT:-}" ]; then
  set -- --http_port="${ECHOKV_HTTP_PORT}" "$@"
fi
# OpenBLAS 0.3.21 falls back to its SSE3 (Prescott) kernels on Xeons it does not know
# (5x slower products than AVX-512 on our CI machines). Name the widest core this CPU
# runs, as the server itself would (common/blas_env.h) — but here, so that it need not
# re-exec itself to do it. A value set in the environment is kept.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r "${ECHOKV_CPUINFO:-/proc/cpuinfo}" ]; then
  flags=" $(grep -m1 '^flags' "${ECHOKV_CPUINFO:-/proc/cpuinfo}" | cut -d: -f2) "
  has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }
  if has avx512f && has avx512cd && has avx512bw && has avx512dq && has avx512vl; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif has avx2 && has fma; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
set -- \
  --model="${model}" \
  --host="${ECHOKV_HOST:-[::]}" \
  --port="${ECHOKV_GRPC_PORT:-50051}" \
  --metrics_port="${ECHOKV_METRICS_PORT:-9464}" \
  "$@"
exec "${server}" "$@"
