#include "common/env.h"

#include <cstdlib>
#include <thread>

namespace echokv {

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int DefaultThreadCount() {
  if (auto v = GetEnv("ECHOKV_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(v->c_str(), &end, 10);
    if (end != v->c_str() && *end == '\0' && n > 0 && n <= 1024) return static_cast<int>(n);
  }
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace echokv
