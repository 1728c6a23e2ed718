#!/bin/sh
# Starts echokv-server from environment variables; extra arguments are more server
# flags (absl flags: a later --flag=value overrides an earlier one), e.g.
#   docker run echokv:dev --max-sessions=16 --flagfile=/etc/echokv/echokv.flags
# ECHOKV_MODEL         model directory (Hugging Face layout)
# ECHOKV_HOST          listen address for gRPC (default 0.0.0.0)
# ECHOKV_GRPC_PORT     gRPC port (default 50051)
# ECHOKV_METRICS_PORT  Prometheus port (default 9464; 0 disables metrics)
set -eu
if [ ! -f "${ECHOKV_MODEL:?ECHOKV_MODEL must name a model directory}/config.json" ]; then
  echo "docker-entrypoint: ${ECHOKV_MODEL} has no config.json; mount a Hugging Face model directory and set ECHOKV_MODEL" >&2
  exit 1
fi
case "${ECHOKV_MODEL}" in
  /opt/echokv/models/demo-llama)
    echo "docker-entrypoint: serving the embedded tiny RANDOM demo model; its text is meaningless" >&2 ;;
esac
exec /opt/echokv/bin/echokv-server \
  --model="${ECHOKV_MODEL}" \
  --host="${ECHOKV_HOST:-0.0.0.0}" \
  --port="${ECHOKV_GRPC_PORT:-50051}" \
  --metrics-port="${ECHOKV_METRICS_PORT:-9464}" \
  "$@"
