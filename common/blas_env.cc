#include "common/blas_env.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace echokv {
namespace {

// Set before the re-exec so the new process can say what was chosen for it.
constexpr char kSetByUs[] = "ECHOKV_BLAS_SET";

const char* OpenBlasCore() {
  using CorenameFn = char* (*)();
  auto fn = reinterpret_cast<CorenameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fn != nullptr ? fn() : nullptr;
}

}  // namespace

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512cd = __builtin_cpu_supports("avx512cd");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

std::string BestBlasCoretype(const CpuFeatures& cpu) {
  if (cpu.avx512f && cpu.avx512cd && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  return "";
}

std::string ChooseBlasCoretype(const std::string& openblas_core, const CpuFeatures& cpu) {
  // OpenBLAS's x86 cores below AVX2: what it falls back to on a CPU it does not know.
  static const char* const kPreAvx2[] = {"Katmai",   "Coppermine", "Northwood", "Prescott",  "Banias",
                                         "Core2",    "Penryn",     "Dunnington", "Nehalem",  "Atom",
                                         "Sandybridge", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat",
                                         "Bulldozer", "Piledriver", "Steamroller", "Excavator", "Unknown"};
  bool weak = false;
  for (const char* name : kPreAvx2) weak = weak || strcasecmp(openblas_core.c_str(), name) == 0;
  return weak ? BestBlasCoretype(cpu) : "";
}

void ConfigureBlasWorkersOrReexec(char** argv) {
  if (std::getenv("ECHOKV_NO_REEXEC") != nullptr || std::getenv(kSetByUs) != nullptr) return;
  std::string set;  // what this process sets, for DescribeBlasSetup after the exec
  std::string coretype;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const char* core = OpenBlasCore();
    if (core != nullptr) coretype = ChooseBlasCoretype(core, DetectCpuFeatures());
    if (!coretype.empty()) set = std::string("coretype:") + core;
  }
  const bool timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr;
  // An environment that already carries OPENBLAS_THREAD_TIMEOUT was set up on purpose
  // (the container image): start without the re-exec (~0.7 s of loading ~330 libraries
  // again); DescribeBlasSetup then says which core OpenBLAS chose and what to export.
  if (!timeout) return;
  // Exec the resolved path, not /proc/self/exe: the process name (comm, what ps, top
  // and pkill show) is taken from the executed path's basename.
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return;
  self[len] = '\0';
  if (timeout) {
    if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", /*overwrite=*/1) != 0) return;
    set += set.empty() ? "timeout" : ",timeout";
  }
  // libgomp (LibTorch's OpenMP) also reads its spin settings only at load. Its default
  // spins ~300000 times after every parallel region; the spinning team then starves
  // OpenBLAS's workers (40M model, 2 threads, quiet machine: prefill 1850 tok/s) and, on
  // a busy machine, everything else (2-thread decode 15.6 tok/s at load ~3). Passive
  // waiting fixes both but makes every decode fork-join a futex wake-up (decode 116 vs
  // 163 tok/s). A short spin keeps both: GOMP_SPINCOUNT=3000 gave prefill 2807 and decode
  // 159 tok/s on the quiet machine.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr &&
      setenv("GOMP_SPINCOUNT", "3000", 1) == 0) {
    set += ",omp";
  }
  if (!coretype.empty() && setenv("OPENBLAS_CORETYPE", coretype.c_str(), /*overwrite=*/1) != 0) return;
  if (setenv(kSetByUs, set.c_str(), /*overwrite=*/1) != 0) return;
  execv(self, argv);
  // exec failed (no /proc?): carry on as loaded; only speed is affected.
}

std::string DescribeBlasSetup() {
  const char* core = OpenBlasCore();
  if (core == nullptr) return "no OpenBLAS (another BLAS is linked)";
  // kSetByUs holds "coretype:<OpenBLAS's own choice>" and/or "timeout", comma-separated.
  // kSetByUs holds "coretype:<OpenBLAS's own choice>" and/or "timeout", comma-separated.
  std::string replaced, set_timeout;
  if (const char* set = std::getenv(kSetByUs)) {
    for (absl::string_view part : absl::StrSplit(set, ',')) {
      if (absl::ConsumePrefix(&part, "coretype:")) replaced = std::string(part);
      if (part == "timeout") set_timeout = " (set by echokv, re-exec)";
    }
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  const char* omp = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  bool set_omp = false;
  if (const char* set = std::getenv(kSetByUs)) set_omp = absl::StrContains(set, "omp");
  std::string why = " (from the environment)";
  if (!replaced.empty()) {
    why = absl::StrCat(" (set by echokv, re-exec: OpenBLAS chose ", replaced, " on a CPU with ",
                       absl::string_view(coretype != nullptr ? coretype : "") == "SkylakeX" ? "AVX-512" : "AVX2",
                       ")");
  }
  std::string unset = "(unset: OpenBLAS's own detection)";
  if (const std::string better = ChooseBlasCoretype(core, DetectCpuFeatures()); !better.empty()) {
    unset = absl::StrCat("(unset: OpenBLAS's own detection fell back to ", core,
                         " on this CPU; export OPENBLAS_CORETYPE=", better, " for its kernels)");
  }
  return absl::StrCat("OpenBLAS core ", core, "; OPENBLAS_CORETYPE=",
                      coretype != nullptr ? absl::StrCat(coretype, why) : unset,
                      "; OPENBLAS_THREAD_TIMEOUT=",
                      timeout != nullptr ? absl::StrCat(timeout, set_timeout) : "(unset: workers spin after each call)",
                      "; OMP_WAIT_POLICY=", omp != nullptr ? omp : "(unset)", "; GOMP_SPINCOUNT=",
                      spin != nullptr ? absl::StrCat(spin, set_omp ? " (set by echokv, re-exec)" : "")
                                      : "(unset: libgomp's default spin after each region)");
}

}  // namespace echokv
