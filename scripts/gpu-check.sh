#!/usr/bin/env bash
# The one GPU check (issue 28): on the GPU machine, from a fresh copy of the tree plus
# the folder scripts/gpu-prepare.sh made (.gpu-carry/), unattended, in at most 8 minutes:
#   gpu        a CUDA device is there (else: says so, exit 2);
#   versions   nvidia-smi, nvcc, torch (CUDA, C++11 ABI), cmake, ninja, the compiler;
#   unpack     the carried .debs into a prefix with dpkg -x (never into /), their .pc and
#              CMake files pointed at the prefix, a protoc that finds its libraries;
#   configure  CMake against the machine's own torch 2.11 (torch.utils.cmake_prefix_path),
#              ECHOKV_CUDA=ON, kernels for sm_90a + compute_90 PTX;
#   build      with ninja on every core: the `cuda` tests, the tools they run, the GPU bench;
#   tests      ctest -L cuda (the kernels and every policy against the CPU);
#   memcheck   compute-sanitizer --tool memcheck on the kernels' small launcher cases,
#              where the runtime allows it (gVisor does not: reported, not failed);
#   bench      echokv-bench-cuda (copy bandwidth and bf16 peak measured first, then the
#              kernels and their LibTorch baselines as shares of them);
# then one summary table. Logs go to $OUT (the device tool's folder) or gpu-check-out/.
#   scripts/gpu-check.sh                      # exit 0: every stage passed
#   ECHOKV_GPU_CHECK_STAGES="gpu versions unpack configure build" scripts/gpu-check.sh
# Environment (for tests on a CPU machine): ECHOKV_GPU_CHECK_BUDGET (seconds for the
# whole check, default 470; each stage also has its own limit), ECHOKV_GPU_CARRY (the carried folder),
# ECHOKV_GPU_PREFIX (where the .debs go, default /tmp/echokv-prefix), ECHOKV_GPU_BUILD_DIR
# (default build-cuda), ECHOKV_TORCH_CMAKE_PREFIX (default: python3's torch),
# ECHOKV_GPU_CHECK_STAGES (stages to run; "gpu" first unless ECHOKV_GPU_CHECK_NO_GPU=1).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
T0=$(date +%s)
LOGS="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$LOGS"
CARRY="$(cd "${ECHOKV_GPU_CARRY:-.gpu-carry}" 2>/dev/null && pwd || echo "${ECHOKV_GPU_CARRY:-.gpu-carry}")"
PFX="${ECHOKV_GPU_PREFIX:-/tmp/echokv-prefix}"
BUILD="${ECHOKV_GPU_BUILD_DIR:-build-cuda}"
STAGES="${ECHOKV_GPU_CHECK_STAGES:-gpu versions unpack configure build tests memcheck bench}"
JOBS="$(nproc)"
# nvcc where the CUDA images keep it, when it is not on PATH already.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
# The whole check's time (the issue's 8 minutes, with room for the device tool's 10).
BUDGET="${ECHOKV_GPU_CHECK_BUDGET:-470}"
LIBDIR="$PFX/usr/lib/x86_64-linux-gnu"
TARGETS="cuda_kernels_test cuda_policy_parity_test echokv-make-test-model echokv-bench-cuda"
export ROOT LOGS CARRY PFX BUILD JOBS LIBDIR TARGETS

SUMMARY=()
failed=0
# stage NAME LIMIT_S LOG COMMAND...: runs COMMAND under timeout, appends to LOG, records
# the row. rc 3 from a stage means "not available here" (noted, not a failure).
stage() {
  local name="$1" limit="$2" log="$3"
  shift 3
  local t=$(date +%s) rc
  # Never past the whole check's budget: the summary must still print.
  local left=$((T0 + BUDGET - t))
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    SUMMARY+=("$(printf '%-10s %-8s %5ss  %s' "$name" "SKIPPED" 0 "no time left of the ${BUDGET} s budget")")
    failed=1
    return 1
  fi
  echo "=== $name (limit ${limit}s) ===" >>"$LOGS/$log"
  # The stages are functions of this script: timeout runs them in a child bash
  # (export -f below), where a time-out kills the whole stage.
  # shellcheck disable=SC2046
  export -f $(declare -F | awk '{print $3}')
  timeout --kill-after=10 "$limit" bash -c "$*" >>"$LOGS/$log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t)) verdict=ok
  if ((rc == 3)); then
    verdict="n/a"
  elif ((rc == 124 || rc == 137)); then
    verdict="TIMEOUT"
    failed=1
  elif ((rc != 0)); then
    verdict="FAIL"
    failed=1
  fi
  SUMMARY+=("$(printf '%-10s %-8s %5ss  %s' "$name" "$verdict" "$dt" "$(tail -n 1 "$LOGS/$log" | cut -c1-90)")")
  echo "gpu-check: $name $verdict (${dt}s)" >&2
  return $rc
}
want() { [[ " $STAGES " == *" $1 "* ]]; }

summary() {
  {
    echo
    echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - T0)) s in all; logs in $LOGS)"
    printf '%-10s %-8s %6s  %s\n' stage verdict time "last line of its log"
    printf '%s\n' "${SUMMARY[@]}"
    [[ -f "$LOGS/bench.log" ]] && grep -E '^\|' "$LOGS/bench.log"
  } | tee "$LOGS/summary.txt"
}

# ---- gpu ----
check_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "no GPU: nvidia-smi lists none"
    return 1
  fi
  python3 -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch sees", torch.cuda.device_count(), "CUDA device(s)"); sys.exit(0 if ok else 1)'
}
if want gpu && [[ "${ECHOKV_GPU_CHECK_NO_GPU:-0}" != 1 ]]; then
  if ! stage gpu 60 gpu.log check_gpu; then
    echo "gpu-check: no CUDA device on this machine: nothing to check (run it on the GPU machine; scripts/gpu-prepare.sh says how)" >&2
    summary
    exit 2
  fi
fi

# ---- versions ----
versions() {
  nvidia-smi || true
  nvcc --version || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI, "cmake", torch.utils.cmake_prefix_path)' || true
  cmake --version | head -n 1
  ninja --version
  "${CXX:-c++}" --version | head -n 1
  echo "cores $(nproc), $(free -g | awk '/Mem:/ {print $2}') GiB; $(grep -c . "$CARRY/MANIFEST" 2>/dev/null || echo 0) lines in the carried MANIFEST"
}
want versions && stage versions 60 versions.log versions

# ---- unpack ----
unpack() {
  if [[ ! -d "$CARRY/debs" ]]; then
    echo "no $CARRY/debs: run scripts/gpu-prepare.sh here first and carry its folder"
    return 1
  fi
  rm -rf "$PFX"
  mkdir -p "$PFX"
  local n=0 f
  for f in "$CARRY"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$f" "$PFX" || return 1
    else  # ar + tar, for a machine without dpkg
      local data
      data="$(ar t "$f" | grep '^data\.tar')" || return 1
      case "$data" in
        *.xz) ar p "$f" "$data" | tar -xJ -C "$PFX" ;;
        *.zst) ar p "$f" "$data" | tar --zstd -x -C "$PFX" ;;
        *.gz) ar p "$f" "$data" | tar -xz -C "$PFX" ;;
        *) ar p "$f" "$data" | tar -x -C "$PFX" ;;
      esac || return 1
    fi
    n=$((n + 1))
  done
  # Absolute symlinks point into /: point them into the prefix.
  local link target
  while IFS= read -r -d '' link; do
    target="$(readlink "$link")"
    if [[ "$target" == /* && -e "$PFX$target" ]]; then ln -sfn "$PFX$target" "$link"; fi
  done < <(find "$PFX" -type l -print0)
  # pkg-config files and CMake configs: absolute /usr paths that exist in the prefix.
  python3 "$ROOT/scripts/gpu_prefix_fixup.py" "$PFX" || return 1
  # protoc (run by the build) finds its libraries through this wrapper.
  mkdir -p "$PFX/wrap"
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' "$LIBDIR" \
    "$PFX/usr/bin/protoc" >"$PFX/wrap/protoc"
  chmod +x "$PFX/wrap/protoc"
  # pkg-config: the prefix's own pkgconf, reading only the prefix's .pc files.
  printf '#!/bin/sh\nPKG_CONFIG_LIBDIR="%s" LD_LIBRARY_PATH="%s" exec "%s" "$@"\n' \
    "$LIBDIR/pkgconfig:$PFX/usr/share/pkgconfig" "$LIBDIR" "$PFX/usr/bin/pkgconf" >"$PFX/wrap/pkg-config"
  chmod +x "$PFX/wrap/pkg-config"
  "$PFX/wrap/protoc" --version || return 1
  "$PFX/wrap/pkg-config" --modversion libxxhash || return 1
  echo "unpacked $n packages into $PFX"
}
want unpack && stage unpack 90 configure.log unpack

# ---- configure ----
# The prefix comes first in CMAKE_PREFIX_PATH and PKG_CONFIG_LIBDIR; the libc and the
# compiler's own files come from /usr. The binaries carry DT_RPATH (not RUNPATH) to the prefix's libraries, so
# their libraries' own dependencies resolve there too, with no LD_LIBRARY_PATH: that
# would also reach the compiler, ctest and the system's tools.
configure() {
  local torch_cmake="${ECHOKV_TORCH_CMAKE_PREFIX:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}"
  [[ -n "$torch_cmake" ]] || return 1
  PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PFX/usr/share/pkgconfig" PATH="$PFX/usr/bin:$PATH" \
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DECHOKV_CUDA=ON \
    -DECHOKV_BUILD_DEPLOY_CHECKS=OFF \
    -DCMAKE_PREFIX_PATH="$torch_cmake;$PFX/usr" \
    -DPKG_CONFIG_EXECUTABLE="$PFX/wrap/pkg-config" \
    -DProtobuf_PROTOC_EXECUTABLE="$PFX/wrap/protoc" \
    -DECHOKV_GRPC_PROTO_DIR="$PFX/usr/share/grpc-proto" \
    -DCMAKE_BUILD_RPATH="$LIBDIR" \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
    -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags \
    -DCMAKE_MODULE_LINKER_FLAGS=-Wl,--disable-new-dtags || return 1
  # Nothing the prefix holds may come from the system's /usr instead (on the GPU machine
  # the system has no copy; on a CPU machine it has every one, so look).
  local leaks
  leaks="$(grep -oE '=/usr/(lib|include|bin|share)/[^;]*' "$BUILD/CMakeCache.txt" | cut -c2- | sort -u |
    while read -r p; do [[ -e "$PFX$p" ]] && echo "$p"; done)"
  if [[ -n "$leaks" ]]; then
    echo "configure: taken from /usr although the prefix has them:"
    echo "$leaks"
    return 1
  fi
  echo "configure: every carried dependency from $PFX"
}
want configure && stage configure 150 configure.log configure

# ---- build ----
# Every library a built binary needs that the prefix holds must resolve into the prefix
# (on the GPU machine the system has no copy to fall back on), and nothing may be missing.
check_ldd() {
  local bin lib path bad=0
  for bin in "$BUILD/tests/cuda_kernels_test" "$BUILD/tests/cuda_policy_parity_test" "$BUILD/bin/echokv-bench-cuda"; do
    while read -r lib _ path _; do
      if [[ "$lib" == *"not found"* || "$path" == "not" ]]; then
        echo "$bin: $lib not found"
        bad=1
      elif [[ -e "$LIBDIR/$lib" && "$path" != "$LIBDIR/"* ]]; then
        echo "$bin: $lib resolves to $path, not the prefix's"
        bad=1
      fi
    done < <(ldd "$bin" | grep '=>')
  done
  ldd "$BUILD/tests/cuda_kernels_test" | grep -q libtorch_cuda || { echo "no libtorch_cuda in ldd"; bad=1; }
  # Headers likewise: none the prefix holds may have been read from the system's /usr.
  local h
  while read -r h; do
    [[ -e "$PFX$h" ]] && { echo "header from /usr although the prefix has it: $h"; bad=1; }
  done < <(ninja -C "$BUILD" -t deps 2>/dev/null | awk '$1 ~ "^/usr/" { print $1 }' | sort -u)
  ((bad == 0)) && echo "ldd: libtorch_cuda linked; every carried library from $LIBDIR"
  return $bad
}
build() {
  PATH="$PFX/usr/bin:$PATH" ninja -C "$BUILD" -j "$JOBS" $TARGETS || return 1
  check_ldd
}
want build && stage build "${ECHOKV_GPU_BUILD_LIMIT:-330}" build.log build

# ---- tests ----
run_tests() {
  (cd "$BUILD" && ECHOKV_TEST_DATA="$CARRY/data" ctest -L cuda --output-on-failure --no-tests=error -j 1)
}
want tests && stage tests 240 tests.log run_tests

# ---- memcheck ----
memcheck() {
  local cs
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  if [[ -z "$cs" ]]; then
    echo "compute-sanitizer: not installed"
    return 3
  fi
  local out
  out="$("$cs" --tool memcheck --error-exitcode 9 \
    "$BUILD/tests/cuda_kernels_test" --gtest_filter='*LauncherWritesEveryElement*' 2>&1)"
  local rc=$?
  echo "$out"
  if echo "$out" | grep -qiE 'Device not supported|not supported on this|unable to initialize'; then
    echo "memcheck: not available on this runtime"
    return 3
  fi
  ((rc == 0)) && echo "memcheck: no errors"
  return $rc
}
want memcheck && stage memcheck 120 memcheck.log memcheck

# ---- bench ----
bench() {
  "$BUILD/bin/echokv-bench-cuda"
}
want bench && stage bench 120 bench.log bench

summary
exit $failed
