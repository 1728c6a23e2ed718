#include "server/engine/session_store.h"

#include <openssl/evp.h>

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "common/errors.h"
#include "server/state/session_id.h"

namespace echokv::server {

absl::StatusOr<MemoryMode> ParseMemoryMode(absl::string_view name) {
  if (name == "tiered") return MemoryMode::kTiered;
  if (name == "evict") return MemoryMode::kEvict;
  return MakeError(ErrorKind::kInvalidArgument, "memory",
                   absl::StrCat("memory: unknown mode ", EchoPrefix(name), "; one of tiered, evict"));
}

absl::Status SessionLimits::Validate() const {
  if (max_sessions < 1) return absl::InvalidArgumentError("max_sessions must be >= 1");
  if (max_kv_bytes < 1) return absl::InvalidArgumentError("max_kv_bytes must be >= 1");
  if (max_cold_bytes < 0) return absl::InvalidArgumentError("max_cold_bytes must be >= 0");
  return absl::OkStatus();
}

absl::Status SessionNotFound(absl::string_view id) {
  return MakeError(ErrorKind::kNotFound, "session_id",
                   absl::StrCat("session ", EscapedIdPrefix(id), " not found (unknown, deleted or expired)"));
}

absl::Status MalformedSessionId(absl::string_view id, absl::string_view field) {
  return MakeError(ErrorKind::kInvalidArgument, field, absl::StrCat(field, " ", EscapedIdPrefix(id), " is malformed"));
}

namespace {

absl::Status AlreadyExists(absl::string_view id) {
  return MakeError(ErrorKind::kAlreadyExists, "session_id", absl::StrCat("session ", EscapedIdPrefix(id), " already exists"));
}

absl::Status Busy(absl::string_view id) {
  return MakeError(ErrorKind::kBusy, "session_id",
                   absl::StrCat("session ", EscapedIdPrefix(id),
                                " is busy: another mutation (append, generate with commit, delete) is in progress; "
                                "retry when it finishes"));
}


}  // namespace

absl::StatusOr<std::string> RandomHex128() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom failed: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (int i = 0; i < 16; ++i) {
    id[2 * i] = kHex[bytes[i] >> 4];
    id[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return id;
}

std::string TenantIdTag(absl::string_view tenant, absl::string_view random_hex) {
  const std::string input = absl::StrCat("echokv session id\n", tenant, "\n", random_hex);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(input.data(), input.size(), digest, &len, EVP_sha256(), nullptr) != 1 || len < 4) {
    return std::string(8, 'x');  // matches no id (not hex)
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string tag(8, '0');
  for (int i = 0; i < 4; ++i) {
    tag[2 * i] = kHex[digest[i] >> 4];
    tag[2 * i + 1] = kHex[digest[i] & 15];
  }
  return tag;
}

bool IdIssuedTo(absl::string_view id, absl::string_view tenant) {
  if (!IsValidSessionId(id)) return false;
  const absl::string_view hex = id.substr(id.size() - 32);
  return hex.substr(24) == TenantIdTag(tenant, hex.substr(0, 24));
}

bool IsValidSessionId(absl::string_view id) { return state::IsValidSessionId(id); }

absl::string_view SessionIdOwner(absl::string_view id) {
  if (!IsValidSessionId(id) || id.size() == 32) return "";
  return id.substr(0, id.size() - 33);
}

std::string EscapedIdPrefix(absl::string_view id) { return EchoPrefix(id); }

SessionStore::SessionStore(const SessionLimits& limits, const Clock* clock, std::string replica_id)
    : limits_(limits), clock_(clock), replica_id_(std::move(replica_id)) {}

void SessionStore::SetTenantQuotas(absl::flat_hash_map<std::string, TenantQuota> quotas) {
  absl::MutexLock lock(&mu_);
  quotas_ = std::move(quotas);
}

TenantUsage SessionStore::UsageOf(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(tenant);
  return it == usage_.end() ? TenantUsage{} : it->second;
}

void SessionStore::AccountLocked(const std::string& tenant, int sessions, int64_t hot, int64_t cold_memory) {
  hot_bytes_ += hot;
  cold_memory_bytes_ += cold_memory;
  TenantUsage& u = usage_[tenant];
  u.sessions += sessions;
  u.hot_bytes += hot;
  u.cold_memory_bytes += cold_memory;
  if (u.sessions == 0 && u.hot_bytes == 0 && u.cold_memory_bytes == 0) usage_.erase(tenant);
}

absl::Status SessionStore::CheckLimitsLocked(const std::string& tenant, int extra_sessions, int64_t hot_delta,
                                             int64_t cold_memory_delta) const {
  const int live = static_cast<int>(sessions_.size()) + reserved_sessions_;
  if (extra_sessions > 0 && live + extra_sessions > limits_.max_sessions) {
    return LimitError("max_sessions",
                      absl::StrCat("max_sessions (", limits_.max_sessions, ") reached; delete a session first"));
  }
  if (hot_delta > 0 && hot_bytes_ + hot_delta > limits_.max_kv_bytes) {
    return LimitError("max_kv_bytes", absl::StrCat("max_kv_bytes (", limits_.max_kv_bytes,
                                                   ") would be exceeded: sessions hold ", hot_bytes_,
                                                   " bytes and this needs ", hot_delta, " more"));
  }
  if (cold_memory_delta > 0 && cold_memory_bytes_ + cold_memory_delta > limits_.max_cold_bytes) {
    return LimitError("max_cold_bytes", absl::StrCat(
        "max_cold_bytes (", limits_.max_cold_bytes, ") would be exceeded: cold tiers in memory hold ",
        cold_memory_bytes_, " bytes and this needs ", cold_memory_delta, " more"));
  }
  auto q = quotas_.find(tenant);
  if (q == quotas_.end()) return absl::OkStatus();
  const TenantQuota& quota = q->second;
  auto u = usage_.find(tenant);
  const TenantUsage used = u == usage_.end() ? TenantUsage{} : u->second;
  const std::string whose = absl::StrCat(" for tenant ", EscapedIdPrefix(tenant), ")");
  if (quota.max_sessions > 0 && extra_sessions > 0 && used.sessions + extra_sessions > quota.max_sessions) {
    return LimitError("max_sessions",
                      absl::StrCat("max_sessions (", quota.max_sessions, whose, " reached; delete a session first"));
  }
  if (quota.max_kv_bytes > 0 && hot_delta > 0 && used.hot_bytes + hot_delta > quota.max_kv_bytes) {
    return LimitError("max_kv_bytes", absl::StrCat("max_kv_bytes (", quota.max_kv_bytes, whose,
                                                   " would be exceeded: this tenant's sessions hold ",
                                                   used.hot_bytes, " bytes and this needs ", hot_delta, " more"));
  }
  if (quota.max_cold_bytes > 0 && cold_memory_delta > 0 &&
      used.cold_memory_bytes + cold_memory_delta > quota.max_cold_bytes) {
    return LimitError("max_cold_bytes", absl::StrCat(
        "max_cold_bytes (", quota.max_cold_bytes, whose, " would be exceeded: this tenant's cold tiers in memory hold ",
        used.cold_memory_bytes, " bytes and this needs ", cold_memory_delta, " more"));
  }
  return absl::OkStatus();
}

bool SessionStore::IdTakenLocked(const std::string& id) const {
  if (sessions_.contains(id)) return true;
  for (const auto& [ticket, r] : reservations_) {
    if (r.session && r.id == id) return true;
  }
  return false;
}

absl::StatusOr<std::string> SessionStore::NewIdLocked(const std::string& tenant) const {
  for (int attempt = 0; attempt < 4; ++attempt) {
    absl::StatusOr<std::string> hex = RandomHex128();
    if (!hex.ok()) return hex.status();
    hex->replace(24, 8, TenantIdTag(tenant, hex->substr(0, 24)));  // 96 random bits + the tenant's tag
    std::string id = replica_id_.empty() ? *hex : absl::StrCat(replica_id_, ".", *hex);
    if (!IdTakenLocked(id)) return id;
  }
  return absl::InternalError("could not draw an unused session id");
}

absl::StatusOr<SessionStore::Reservation> SessionStore::Reserve(const std::string& tenant, int64_t hot_bytes,
                                                                int64_t cold_bytes, bool cold_in_memory) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::string> id = NewIdLocked(tenant);
  if (!id.ok()) return id.status();
  const int64_t cold_mem = cold_in_memory ? cold_bytes : 0;
  if (absl::Status s = CheckLimitsLocked(tenant, 1, hot_bytes, cold_mem); !s.ok()) return s;
  Reservation r{next_ticket_++, *id, tenant, hot_bytes, cold_bytes, cold_in_memory};
  reservations_.emplace(r.ticket, r);
  ++reserved_sessions_;
  AccountLocked(tenant, 1, hot_bytes, cold_mem);
  return r;
}

absl::StatusOr<SessionStore::Reservation> SessionStore::ReserveBytes(const std::string& tenant, int64_t hot_bytes,
                                                                     int64_t cold_bytes, bool cold_in_memory) {
  absl::MutexLock lock(&mu_);
  const int64_t cold_mem = cold_in_memory ? cold_bytes : 0;
  if (absl::Status s = CheckLimitsLocked(tenant, 0, hot_bytes, cold_mem); !s.ok()) return s;
  Reservation r{next_ticket_++, "", tenant, hot_bytes, cold_bytes, cold_in_memory, /*session=*/false};
  reservations_.emplace(r.ticket, r);
  AccountLocked(tenant, 0, hot_bytes, cold_mem);
  return r;
}

absl::StatusOr<SessionStore::Reservation> SessionStore::ReserveId(const std::string& id, const std::string& tenant,
                                                                  int64_t hot_bytes, int64_t cold_bytes,
                                                                  bool cold_in_memory) {
  absl::MutexLock lock(&mu_);
  if (!IsValidSessionId(id)) {
    return MakeError(ErrorKind::kInvalidArgument, "session_id",
                     absl::StrCat("session id ", EscapedIdPrefix(id), " is malformed"));
  }
  if (IdTakenLocked(id)) return AlreadyExists(id);
  const int64_t cold_mem = cold_in_memory ? cold_bytes : 0;
  if (absl::Status s = CheckLimitsLocked(tenant, 1, hot_bytes, cold_mem); !s.ok()) return s;
  Reservation r{next_ticket_++, id, tenant, hot_bytes, cold_bytes, cold_in_memory};
  reservations_.emplace(r.ticket, r);
  ++reserved_sessions_;
  AccountLocked(tenant, 1, hot_bytes, cold_mem);
  return r;
}

absl::StatusOr<SessionStore::Reservation> SessionStore::ReserveImportedId(const std::string& id,
                                                                          const std::string& tenant,
                                                                          int64_t hot_bytes, int64_t cold_bytes,
                                                                          bool cold_in_memory) {
  if (IsValidSessionId(id) && !IdIssuedTo(id, tenant)) {
    // Word for word what ReserveId answers for a taken id, whether or not the id is
    // live for someone else: the answer depends on the id and the caller only.
    return AlreadyExists(id);
  }
  return ReserveId(id, tenant, hot_bytes, cold_bytes, cold_in_memory);
}

void SessionStore::Unreserve(const Reservation& r) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(r.ticket);
  if (it == reservations_.end()) return;
  const Reservation& held = it->second;
  AccountLocked(held.tenant, held.session ? -1 : 0, -held.hot_bytes, held.cold_in_memory ? -held.cold_bytes : 0);
  if (held.session) --reserved_sessions_;
  reservations_.erase(it);
}

absl::Status SessionStore::Insert(const Reservation& r, SessionInfo meta, std::shared_ptr<SessionData> data) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(r.ticket);
  if (it == reservations_.end() || !it->second.session) return absl::InternalError("session reservation not found");
  const Reservation held = it->second;
  // Release the estimate, then admit the exact bytes.
  reservations_.erase(it);
  --reserved_sessions_;
  AccountLocked(held.tenant, -1, -held.hot_bytes, held.cold_in_memory ? -held.cold_bytes : 0);
  const int64_t cold_mem = meta.cold_in_memory ? meta.cold_kv_bytes : 0;
  if (absl::Status s = CheckLimitsLocked(held.tenant, 0, meta.retained_kv_bytes, cold_mem); !s.ok()) return s;
  meta.id = held.id;
  meta.tenant = held.tenant;
  meta.busy = false;
  // Unset times start now; a restored session keeps its own (its idle timer goes on).
  const absl::Time now = clock_->Now();
  if (meta.created == absl::UnixEpoch()) meta.created = now;
  if (meta.last_used == absl::UnixEpoch()) meta.last_used = now;
  AccountLocked(held.tenant, 1, meta.retained_kv_bytes, cold_mem);
  const std::string id = meta.id;
  sessions_[id] = Entry{std::move(meta), std::move(data)};
  return absl::OkStatus();
}

SessionStore::Entry* SessionStore::FindLocked(const std::string& id, const std::string& tenant) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  Entry& e = it->second;
  if (e.meta.tenant != tenant) return nullptr;  // another tenant's: exactly like unknown
  if (!e.meta.busy && clock_->Now() - e.meta.last_used > e.meta.ttl) return nullptr;  // expired
  return &e;
}

absl::StatusOr<SessionInfo> SessionStore::Claim(const std::string& id, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id, tenant);
  if (e == nullptr) return SessionNotFound(id);
  if (e->meta.busy) return Busy(id);
  e->meta.busy = true;
  e->meta.last_used = clock_->Now();
  return e->meta;
}

void SessionStore::Release(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  it->second.meta.busy = false;
  it->second.meta.last_used = clock_->Now();
}

absl::Status SessionStore::Commit(const std::string& id, SessionInfo updated, std::shared_ptr<SessionData> data) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::InternalError("committing a session that is gone");
  Entry& e = it->second;
  // The session's own old bytes are freed by this commit.
  const int64_t old_cold = e.meta.cold_in_memory ? e.meta.cold_kv_bytes : 0;
  const int64_t new_cold = updated.cold_in_memory ? updated.cold_kv_bytes : 0;
  if (absl::Status s =
          CheckLimitsLocked(e.meta.tenant, 0, updated.retained_kv_bytes - e.meta.retained_kv_bytes, new_cold - old_cold);
      !s.ok()) {
    return s;
  }
  AccountLocked(e.meta.tenant, 0, updated.retained_kv_bytes - e.meta.retained_kv_bytes, new_cold - old_cold);
  updated.id = e.meta.id;
  updated.tenant = e.meta.tenant;
  updated.created = e.meta.created;
  updated.busy = false;
  updated.last_used = clock_->Now();
  e.meta = std::move(updated);
  e.data = std::move(data);
  return absl::OkStatus();
}

absl::StatusOr<SessionInfo> SessionStore::Get(const std::string& id, const std::string& tenant, bool touch) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id, tenant);
  if (e == nullptr) return SessionNotFound(id);
  if (touch) e->meta.last_used = clock_->Now();
  return e->meta;
}

absl::StatusOr<std::shared_ptr<SessionData>> SessionStore::Data(const std::string& id, const std::string& tenant,
                                                                bool touch) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id, tenant);
  if (e == nullptr) return SessionNotFound(id);
  if (touch) e->meta.last_used = clock_->Now();
  return e->data;
}

void SessionStore::ReplaceData(const std::string& id, std::shared_ptr<SessionData> data, bool cold_in_memory) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Entry& e = it->second;
  if (e.meta.cold_in_memory != cold_in_memory) {
    AccountLocked(e.meta.tenant, 0, 0, (cold_in_memory ? 1 : -1) * e.meta.cold_kv_bytes);
    e.meta.cold_in_memory = cold_in_memory;
  }
  e.data = std::move(data);
}

std::vector<SessionInfo> SessionStore::List(const std::string& tenant) {
  ReapExpired();
  std::vector<SessionInfo> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : sessions_) {
      if (e.meta.tenant == tenant) out.push_back(e.meta);
    }
  }
  std::sort(out.begin(), out.end(), [](const SessionInfo& a, const SessionInfo& b) {
    return a.created != b.created ? a.created < b.created : a.id < b.id;
  });
  return out;
}

absl::StatusOr<int64_t> SessionStore::Delete(const std::string& id, const std::string& tenant) {
  std::shared_ptr<SessionData> doomed;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id, tenant);
  if (e == nullptr) return SessionNotFound(id);
  if (e->meta.busy) return Busy(id);
  const int64_t freed = e->meta.retained_kv_bytes;
  AccountLocked(e->meta.tenant, -1, -e->meta.retained_kv_bytes, e->meta.cold_in_memory ? -e->meta.cold_kv_bytes : 0);
  doomed = std::move(e->data);
  sessions_.erase(id);
  return freed;
}

std::vector<std::string> SessionStore::ReapExpired() {
  std::vector<std::string> gone;
  std::vector<std::shared_ptr<SessionData>> doomed;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const SessionInfo& m = it->second.meta;
    if (!m.busy && now - m.last_used > m.ttl) {
      gone.push_back(m.id);
      AccountLocked(m.tenant, -1, -m.retained_kv_bytes, m.cold_in_memory ? -m.cold_kv_bytes : 0);
      doomed.push_back(std::move(it->second.data));
      sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  return gone;
}

std::vector<std::string> SessionStore::SpillCandidates(const std::string& except) const {
  std::vector<std::pair<absl::Time, std::string>> found;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : sessions_) {
      if (id != except && e.data != nullptr && e.meta.cold_in_memory && !e.meta.busy) {
        found.emplace_back(e.meta.last_used, id);
      }
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [t, id] : found) out.push_back(std::move(id));
  return out;
}

StoreTotals SessionStore::Totals() const {
  absl::MutexLock lock(&mu_);
  StoreTotals t;
  t.sessions = static_cast<int>(sessions_.size());
  t.reserved = reserved_sessions_;
  t.hot_bytes = hot_bytes_;
  t.cold_memory_bytes = cold_memory_bytes_;
  for (const auto& [id, e] : sessions_) {
    t.cold_bytes += e.meta.cold_kv_bytes;
    t.full_bytes += e.meta.full_kv_bytes;
  }
  return t;
}

StoreTotals SessionStore::TotalsOf(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  StoreTotals t;
  if (auto it = usage_.find(tenant); it != usage_.end()) {
    t.hot_bytes = it->second.hot_bytes;
    t.cold_memory_bytes = it->second.cold_memory_bytes;
  }
  for (const auto& [ticket, r] : reservations_) t.reserved += r.session && r.tenant == tenant ? 1 : 0;
  for (const auto& [id, e] : sessions_) {
    if (e.meta.tenant != tenant) continue;
    ++t.sessions;
    t.cold_bytes += e.meta.cold_kv_bytes;
    t.full_bytes += e.meta.full_kv_bytes;
  }
  return t;
}

}  // namespace echokv::server
