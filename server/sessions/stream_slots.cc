#include "server/sessions/stream_slots.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/errors.h"
#include "server/engine/session_store.h"

namespace echokv::server {

StreamSlots::StreamSlots(int max_streams, int reserve)
    : max_streams_(std::max(1, max_streams)), reserve_(std::clamp(reserve, 0, std::max(0, max_streams - 1))) {}

absl::Status StreamSlots::Acquire(const std::string& tenant, int tenant_cap) {
  absl::MutexLock lock(&mu_);
  if (in_flight_ >= max_streams_) {
    return LimitError("max_concurrent_streams", absl::StrCat("max_concurrent_streams (", max_streams_,
                                                             ") reached: too many streaming calls in flight; retry later"));
  }
  auto it = held_.find(tenant);
  const int held = it == held_.end() ? 0 : it->second;
  if (tenant_cap > 0 && held >= tenant_cap) {
    return LimitError("max_streams", absl::StrCat("max_streams (", tenant_cap, " for tenant ", EscapedIdPrefix(tenant),
                                                  ") reached: this tenant's streaming calls are all in flight"));
  }
  const int free = max_streams_ - in_flight_;
  // Tenants sharing the slots, T included, and never fewer than 2: a tenant alone
  // must still leave the reserve to whoever comes next.
  const int active = std::max(2, static_cast<int>(held_.size()) + (held == 0 ? 1 : 0));
  const int fair = std::max(1, max_streams_ / active);
  if (free <= reserve_ && held >= fair) {
    return LimitError("max_concurrent_streams", absl::StrCat(
        "max_concurrent_streams (", max_streams_, "): the last ", reserve_,
        " slots are kept for tenants below their fair share (", fair, ") and this tenant holds ", held,
        "; retry later"));
  }
  ++in_flight_;
  ++held_[tenant];
  return absl::OkStatus();
}

void StreamSlots::Release(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  if (it == held_.end()) return;  // never acquired: nothing to give back
  --in_flight_;
  if (--it->second == 0) held_.erase(it);
}

int StreamSlots::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

int StreamSlots::held(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  return it == held_.end() ? 0 : it->second;
}

int DefaultStreamReserve(int max_streams, int tenants) {
  if (tenants <= 1 || max_streams <= 1) return 0;
  return std::clamp(max_streams / 8, 1, max_streams - 1);
}

}  // namespace echokv::server
