#!/usr/bin/env bash
# Prepares, on this (CPU) machine, the folder that scripts/gpu-check.sh needs on the GPU
# machine, where nothing can be fetched: .gpu-carry/ (git-ignored) with
#   debs/    Debian's .deb files of every C++ dependency the build needs besides LibTorch
#            and CUDA (the -dev packages and their libraries, at the versions installed
#            here), fetched with apt-get download;
#   data/    the real test data the `cuda` tests read (models/stories260K);
#   MANIFEST what is in it (package=version, sha256).
# Then checks that the whole tree that travels (tracked and untracked-not-ignored files
# plus .gpu-carry) is under the device tool's 64 MiB, and prints the command to run.
#   scripts/gpu-prepare.sh
#   ECHOKV_GPU_CARRY=/tmp/carry scripts/gpu-prepare.sh      # elsewhere (tests)
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY="${ECHOKV_GPU_CARRY:-.gpu-carry}"
LIMIT_BYTES=$((64 * 1024 * 1024))

# What CMake finds (CMakeLists.txt, proto/, server/, client/, tests/) besides LibTorch,
# CUDA and the compiler, which the GPU machine has.
TOP=(
  libabsl-dev nlohmann-json3-dev libgoogle-glog-dev libsentencepiece-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  prometheus-cpp-dev libcpp-httplib-dev libssl-dev libxxhash-dev pkgconf zlib1g-dev
)
# The C library and the compiler's runtime: the GPU machine's own (it compiles there).
BASE=(
  libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1 libstdc++6 gcc-12-base
  libtirpc3 libtirpc-common libtirpc-dev libnsl2 libnsl-dev rpcsvc-proto
)

# The dependency closure, each alternative resolved the way this machine resolved it (the
# packages installed here: the ones the CPU build was built and tested with).
closure="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "${TOP[@]}" 2>/dev/null | grep -v '^[ <]' | sort -u)"
packages=()
missing=()
for p in $closure; do
  skip=0
  for b in "${BASE[@]}"; do [[ "$p" == "$b" ]] && skip=1; done
  ((skip)) && continue
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]]; then
    packages+=("$p=$(dpkg-query -W -f='${Version}' "$p")")
  fi
done
for p in "${TOP[@]}"; do
  [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "gpu-prepare: not installed here: ${missing[*]} (scripts/setup.sh installs them)" >&2
  exit 1
fi

rm -rf "$CARRY"
mkdir -p "$CARRY/debs" "$CARRY/data/models"
echo "gpu-prepare: apt-get download of ${#packages[@]} packages into $CARRY/debs" >&2
# The installed version when the archive still has it, else the archive's candidate (a
# security update of the same Debian release: the same ABI).
fetch=()
for pv in "${packages[@]}"; do
  if apt-cache madison "${pv%%=*}" | awk -F' [|] ' -v v="${pv#*=}" '$2 == v { found = 1 } END { exit !found }'; then
    fetch+=("$pv")
  else
    fetch+=("${pv%%=*}")
  fi
done
(cd "$CARRY/debs" && apt-get download -qq -o APT::Sandbox::User=root "${fetch[@]}")

data="${ECHOKV_TEST_DATA:-../shared}"
if [[ ! -f "$data/models/stories260K/model.safetensors" ]]; then
  echo "gpu-prepare: no stories260K under '$data/models' (set ECHOKV_TEST_DATA)" >&2
  exit 1
fi
# The model files only (its llama2c/ export is the CPU peer benchmark's input).
mkdir -p "$CARRY/data/models/stories260K"
find "$data/models/stories260K" -maxdepth 1 -type f -exec cp {} "$CARRY/data/models/stories260K/" \;

{
  echo "# scripts/gpu-prepare.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  printf '%s\n' "${packages[@]}"
  (cd "$CARRY" && find debs data -type f -print0 | sort -z | xargs -0 sha256sum)
} >"$CARRY/MANIFEST"

# What the device tool sends: tracked files, untracked files git does not ignore, and the
# carried folder.
tree_bytes=0
while IFS= read -r -d '' f; do
  if [[ -f "$f" && ! -L "$f" ]]; then tree_bytes=$((tree_bytes + $(stat -c %s "$f"))); fi
done < <(git ls-files -z --cached --others --exclude-standard)
carry_bytes="$(du -sb "$CARRY" | cut -f1)"
total=$((tree_bytes + carry_bytes))
awk -v t="$tree_bytes" -v c="$carry_bytes" -v n="${#packages[@]}" -v d="$CARRY" -v l=$((LIMIT_BYTES / 1048576)) 'BEGIN {
  printf "gpu-prepare: tree %.1f MiB + %s %.1f MiB (%d .debs, stories260K) = %.1f MiB of %d MiB\n", t / 1048576, d, c / 1048576, n, (t + c) / 1048576, l
}' >&2
if ((total >= LIMIT_BYTES)); then
  echo "gpu-prepare: over the 64 MiB that may travel" >&2
  exit 1
fi
echo "gpu-prepare: ready. On the GPU machine (device tool): run(command=\"scripts/gpu-check.sh\", carry=[\"$CARRY\"], timeout_s=600)" >&2
