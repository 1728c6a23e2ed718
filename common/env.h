// Small process-environment helpers shared by mains, tests and benches.
//
//   int threads = echokv::DefaultThreadCount();            // $ECHOKV_THREADS or cores
//   std::optional<std::string> dir = echokv::GetEnv("ECHOKV_TEST_DATA");
#ifndef ECHOKV_COMMON_ENV_H_
#define ECHOKV_COMMON_ENV_H_

#include <optional>
#include <string>

namespace echokv {

// The value of environment variable `name`, or nullopt when unset or empty.
std::optional<std::string> GetEnv(const char* name);

// Threads for LibTorch's intra-op pool: $ECHOKV_THREADS when set and positive,
// otherwise the number of online CPUs (Debian's LibTorch defaults to 1 here).
int DefaultThreadCount();

}  // namespace echokv

#endif  // ECHOKV_COMMON_ENV_H_
