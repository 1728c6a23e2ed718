#include "common/env.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace echokv {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<double> ParseDouble(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) return std::nullopt;
  return v;
}

int AffineCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<double> CgroupCpuQuota(const std::string& cgroup_root) {
  // cgroup v2: "max 100000" (unlimited) or "150000 100000".
  if (std::optional<std::string> max = ReadSmallFile(cgroup_root + "/cpu.max")) {
    std::istringstream in(*max);
    std::string quota, period;
    in >> quota >> period;
    if (quota.empty() || quota == "max") return std::nullopt;
    std::optional<double> q = ParseDouble(quota);
    std::optional<double> p = ParseDouble(period.empty() ? "100000" : period);
    if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
    return *q / *p;
  }
  // cgroup v1: quota -1 means unlimited.
  for (const char* dir : {"", "/cpu,cpuacct", "/cpu"}) {
    std::optional<std::string> quota = ReadSmallFile(cgroup_root + dir + "/cpu.cfs_quota_us");
    std::optional<std::string> period = ReadSmallFile(cgroup_root + dir + "/cpu.cfs_period_us");
    if (!quota || !period) continue;
    std::optional<double> q = ParseDouble(*quota);
    std::optional<double> p = ParseDouble(*period);
    if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
    return *q / *p;
  }
  return std::nullopt;
}

ThreadChoice ChooseThreadCount(const std::string& cgroup_root) {
  if (auto v = GetEnv("ECHOKV_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(v->c_str(), &end, 10);
    if (end != v->c_str() && *end == '\0' && n > 0 && n <= 1024) {
      return {static_cast<int>(n), "ECHOKV_THREADS=" + *v};
    }
  }
  const int affine = AffineCpus();
  ThreadChoice choice{affine, std::to_string(affine) + " CPUs in the affinity mask"};
  if (std::optional<double> quota = CgroupCpuQuota(cgroup_root)) {
    const int capped = std::max(1, static_cast<int>(std::ceil(*quota - 1e-9)));
    std::ostringstream why;
    why << "cgroup CPU quota " << *quota << " CPUs";
    if (capped < affine) {
      choice.threads = capped;
      why << " -> " << capped << " of " << affine << " affine CPUs";
    } else {
      why << " >= " << affine << " affine CPUs";
    }
    choice.reason = why.str();
  }
  return choice;
}

ThreadChoice CapForModelSize(ThreadChoice choice, int64_t parameters) {
  if (choice.threads <= 1 || parameters >= kSmallModelParameters || choice.reason.rfind("ECHOKV_THREADS=", 0) == 0) {
    return choice;
  }
  std::ostringstream why;
  why << choice.reason << "; 1 thread for a small model (" << parameters << " parameters < " << kSmallModelParameters
      << ")";
  return {1, why.str()};
}

int DefaultThreadCount() { return ChooseThreadCount().threads; }

}  // namespace echokv
