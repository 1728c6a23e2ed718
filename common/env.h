// Small process-environment helpers shared by mains, tests and benches.
//
//   int threads = echokv::DefaultThreadCount();     // $ECHOKV_THREADS, else the CPUs we may use
//   std::optional<std::string> dir = echokv::GetEnv("ECHOKV_TEST_DATA");
#ifndef ECHOKV_COMMON_ENV_H_
#define ECHOKV_COMMON_ENV_H_

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

// ChooseThreadCount().threads (Debian's LibTorch defaults to 1 thread otherwise).
int DefaultThreadCount();

// The cgroup CPU quota in CPUs (quota / period), or nullopt when unlimited or unknown;
// reads `cgroup_root`/cpu.max, else cpu.cfs_quota_us + cpu.cfs_period_us (also under
// `cgroup_root`/cpu,cpuacct/ and cpu/ for v1 hierarchies).
std::optional<double> CgroupCpuQuota(const std::string& cgroup_root);

}  // namespace echokv

#endif  // ECHOKV_COMMON_ENV_H_
