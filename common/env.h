// Small process-environment helpers shared by mains, tests and benches.
//
//   int threads = echokv::DefaultThreadCount();     // $ECHOKV_THREADS, else the CPUs we may use
//   std::optional<std::string> dir = echokv::GetEnv("ECHOKV_TEST_DATA");
#ifndef ECHOKV_COMMON_ENV_H_
#define ECHOKV_COMMON_ENV_H_

#include <cstdint>
#include <optional>
#include <string>

namespace echokv {

// The value of environment variable `name`, or nullopt when unset or empty.
std::optional<std::string> GetEnv(const char* name);

// The default thread count and why it was chosen (for the startup log).
struct ThreadChoice {
  int threads = 1;
  std::string reason;  // e.g. "ECHOKV_THREADS=4", "cgroup cpu.max 150000/100000 -> 2 of 8 affine CPUs"
};

// What the process may use, in order: $ECHOKV_THREADS when set and positive; else the
// CPUs in its affinity mask (taskset, Kubernetes cpuset), capped by its cgroup CPU
// quota rounded up (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`),
// at least 1. A pod limited to 2 CPUs on a 64-core node gets 2 threads, not 64
// threads that the quota throttles. `cgroup_root` is for tests.
ThreadChoice ChooseThreadCount(const std::string& cgroup_root = "/sys/fs/cgroup");

// Models below this many parameters decode on one thread by default: a token costs a
// few hundred microseconds, and the ~26 OpenMP fork/joins per token cost more than a
// second core saves (stories260K, 0.26 M parameters: 5700 tok/s on 1 thread vs 850 on 2
// on a loaded 2-core machine, docs/BENCHMARKS.md); the 40M model still gains from 2.
inline constexpr int64_t kSmallModelParameters = 4'000'000;

// `choice` capped to 1 thread for a model of `parameters` < kSmallModelParameters,
// unless the count was asked for ($ECHOKV_THREADS); the reason says so.
ThreadChoice CapForModelSize(ThreadChoice choice, int64_t parameters);

// ChooseThreadCount().threads (Debian's LibTorch defaults to 1 thread otherwise).
int DefaultThreadCount();

// The cgroup CPU quota in CPUs (quota / period), or nullopt when unlimited or unknown;
// reads `cgroup_root`/cpu.max, else cpu.cfs_quota_us + cpu.cfs_period_us (also under
// `cgroup_root`/cpu,cpuacct/ and cpu/ for v1 hierarchies).
std::optional<double> CgroupCpuQuota(const std::string& cgroup_root);

}  // namespace echokv

#endif  // ECHOKV_COMMON_ENV_H_
