#include "server/engine/clock.h"

namespace echokv::server {
namespace {

class SystemClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

const Clock* RealClock() {
  static const SystemClock* clock = new SystemClock();  // stateless; never destroyed
  return clock;
}

}  // namespace echokv::server
