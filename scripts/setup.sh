#!/usr/bin/env bash
# Installs every Debian package echokv's build, tests and benches need (idempotent),
# then configures and builds into build/ (binaries in build/bin/, tests in build/tests/).
#   scripts/setup.sh            # install + build
#   ECHOKV_SKIP_APT=1 scripts/setup.sh   # build only
#   ECHOKV_BUILD_DIR=build-asan ECHOKV_CMAKE_ARGS=-DECHOKV_SANITIZE=ON scripts/setup.sh
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
