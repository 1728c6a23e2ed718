// A tenant's own limits (a line of the tokens file, server/doors/auth.h), enforced by the
// SessionStore (sessions, bytes) and StreamSlots (streams) on top of the server-wide
// limits. Plain values; 0 = no quota of its own.
//
//   TenantQuota q;
//   q.max_sessions = 10;   // "max_sessions (10 for tenant 'acme') reached"
#ifndef ECHOKV_SERVER_ENGINE_TENANT_QUOTA_H_
#define ECHOKV_SERVER_ENGINE_TENANT_QUOTA_H_

#include <cstdint>

namespace echokv::server {

struct TenantQuota {
  int max_sessions = 0;        // live sessions (plus creations in flight)
  int64_t max_kv_bytes = 0;    // hot KV bytes of its sessions together
  int64_t max_cold_bytes = 0;  // cold-tier bytes in memory of its sessions together
  int max_streams = 0;         // streaming calls (and Compress) in flight
  bool operator==(const TenantQuota& o) const {
    return max_sessions == o.max_sessions && max_kv_bytes == o.max_kv_bytes && max_cold_bytes == o.max_cold_bytes &&
           max_streams == o.max_streams;
  }
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_TENANT_QUOTA_H_
