// Stream slots shared fairly between tenants (docs/SECURITY.md "Stream slots"): the
// server-wide max_concurrent_streams, each tenant's own max_streams quota, and a
// reserve of slots that only a tenant below its fair share may take, so one tenant
// (or a few clients that never read) cannot hold every slot.
//
// A stream of tenant T is admitted iff
//   in_flight < max_streams                          (else max_concurrent_streams)
//   held(T) < quota(T), when T has a quota           (else max_streams of T)
//   free > reserve  or  held(T) < max_streams / active
//                    (active = tenants holding a slot, T included, at least 2)
//
//   StreamSlots slots(/*max_streams=*/64, /*reserve=*/8);
//   if (absl::Status s = slots.Acquire("acme", quota.max_streams); !s.ok()) return s;
//   ... the stream runs ...
//   slots.Release("acme");
#ifndef ECHOKV_SERVER_SESSIONS_STREAM_SLOTS_H_
#define ECHOKV_SERVER_SESSIONS_STREAM_SLOTS_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace echokv::server {

class StreamSlots {
 public:
  // `reserve` in [0, max_streams): slots kept for tenants below their fair share
  // (0 when the server has one tenant: nobody to share with).
  StreamSlots(int max_streams, int reserve);

  // Claims a slot for `tenant`; `tenant_cap` is its own quota (0 = none).
  // RESOURCE_EXHAUSTED naming the limit (max_concurrent_streams or max_streams).
  absl::Status Acquire(const std::string& tenant, int tenant_cap);
  void Release(const std::string& tenant);

  int in_flight() const;
  int held(const std::string& tenant) const;
  int max_streams() const { return max_streams_; }
  int reserve() const { return reserve_; }

 private:
  const int max_streams_;  // server-wide slots
  const int reserve_;      // kept for tenants below their fair share
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> held_ ABSL_GUARDED_BY(mu_);  // tenants holding >= 1 slot
};

// The reserve for `max_streams` slots and `tenants` configured tenants: none for one
// tenant, else an eighth of the slots (at least 1, and never all of them).
int DefaultStreamReserve(int max_streams, int tenants);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_SESSIONS_STREAM_SLOTS_H_
