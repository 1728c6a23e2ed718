// Time for the engine and the session store, injectable so tests drive TTLs and the
// health watchdog without sleeping.
//
//   const Clock* clock = RealClock();          // absl::Now()
//   FakeClock fake(absl::FromUnixSeconds(1000)); fake.Advance(absl::Minutes(31));
#ifndef ECHOKV_SERVER_ENGINE_CLOCK_H_
#define ECHOKV_SERVER_ENGINE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace echokv::server {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// absl::Now(); one process-wide instance (stateless).
const Clock* RealClock();

// A clock that moves only when told (thread-safe).
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : nanos_(absl::ToUnixNanos(start)) {}
  absl::Time Now() const override { return absl::FromUnixNanos(nanos_.load()); }
  void Advance(absl::Duration d) { nanos_.fetch_add(absl::ToInt64Nanoseconds(d)); }

 private:
  std::atomic<int64_t> nanos_;  // current time, Unix nanoseconds
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_CLOCK_H_
