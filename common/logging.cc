#include "common/logging.h"

#include <atomic>

namespace echokv {

void InitLogging(const char* argv0) {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
}

}  // namespace echokv
