// Session bookkeeping without tensors (docs/ENGINE.md "Session store"): ids, the owner
// tenant, memory mode, TTL, the busy flag of a mutation, hot/cold byte accounting and
// the limits that count sessions and bytes. The tensors of a session live in an
// opaque SessionData (session_data.h) that the store only holds. Thread-safe: the
// engine thread mutates; request threads read metadata (Get, List) directly.
//
//   SessionStore store(limits, RealClock(), /*replica_id=*/"");
//   ECHOKV_ASSIGN_OR_RETURN(SessionStore::Reservation r, store.Reserve(tenant, hot, cold));
//   ... build the session ...
//   ECHOKV_RETURN_IF_ERROR(store.Insert(r, meta, std::move(data)));   // or Unreserve(r)
//   ECHOKV_ASSIGN_OR_RETURN(SessionInfo m, store.Claim(id, tenant));  // a mutation begins
//   store.Commit(id, updated_meta, new_data);  /* or */  store.Release(id);
#ifndef ECHOKV_SERVER_ENGINE_SESSION_STORE_H_
#define ECHOKV_SERVER_ENGINE_SESSION_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compression/config.h"
#include "compression/report.h"
#include "model/chat_template.h"
#include "server/engine/clock.h"
#include "server/state/types.h"
#include "server/engine/tenant_quota.h"

namespace echokv::server {

struct SessionData;  // the session's tensors (session_data.h); opaque here

// The one MemoryMode (server/state/types.h, the lower layer): "tiered" keeps the exact
// cold history behind the compact cache; "evict" re-compresses retained + new.
using MemoryMode = state::MemoryMode;
using state::MemoryModeName;                                 // "tiered", "evict"
// A request's memory mode: INVALID_ARGUMENT (field "memory") naming the two.
absl::StatusOr<MemoryMode> ParseMemoryMode(absl::string_view name);

struct SessionLimits {
  int max_sessions = 256;                      // live sessions (plus reservations)
  int64_t max_kv_bytes = int64_t{8} << 30;     // hot bytes of every session together
  int64_t max_cold_bytes = int64_t{8} << 30;   // cold bytes held in memory, together
  absl::Status Validate() const;               // names the bad field
};

// A session's metadata and stats: the one native description of a session, kept by the
// store and answered by the engine and the session layer as it is. Each wire format has
// one conversion: FillSession (server/doors/grpc/service.cc, pb::Session), the HTTP
// door's session fields (openai_server.cc), ToStateMeta / MetaFromManifest
// (server/engine/persistence.h, state::SavedSession on disk).
struct SessionInfo {
  std::string id;
  std::string tenant;                          // owner ("" when the server runs open)
  MemoryMode memory = MemoryMode::kEvict;
  compression::CompressionConfig config;       // resolved (workspace too); every re-selection uses it
  compression::CompressionReport last_report;  // the latest compression
  int64_t tokens_seen = 0;                     // every token prefilled or committed
  int64_t retained_entries = 0;                // hot entries over layers and groups
  int64_t retained_kv_bytes = 0;               // §7 bytes of the hot tier (max_kv_bytes)
  int64_t full_kv_bytes = 0;                   // §7 bytes of a full cache of tokens_seen
  int64_t cold_kv_bytes = 0;                   // exact history bytes (tiered; else 0)
  bool cold_in_memory = false;                 // cold_kv_bytes count against max_cold_bytes
  absl::Time created;
  absl::Time last_used;                        // the idle timer starts here
  absl::Duration ttl;                          // idle expiry
  bool busy = false;                           // a mutation holds the session
  // Chat sessions: every message so far, in order (what was sent as chat input, and
  // the assistant replies committed by Generate). Empty for text / token sessions.
  std::vector<model::ChatMessage> messages;
  std::string tools_json;  // chat sessions: the latest tool definitions (JSON array; "" = none)
};

// What one tenant holds (live + reserved), checked against its TenantQuota.
struct TenantUsage {
  int sessions = 0;
  int64_t hot_bytes = 0;
  int64_t cold_memory_bytes = 0;
};

// Totals over live sessions (ServerInfo, metrics).
struct StoreTotals {
  int sessions = 0;
  int reserved = 0;            // creations admitted, not finished (not a job's bytes-only reservation)
  int64_t hot_bytes = 0;       // live + reserved
  int64_t cold_bytes = 0;      // every session's cold tier (memory or disk)
  int64_t cold_memory_bytes = 0;  // live + reserved, held in memory
  int64_t full_bytes = 0;
};

class SessionStore {
 public:
  // `replica_id` ("" or a DNS label) prefixes every new id: "<replica>.<32 hex>".
  SessionStore(const SessionLimits& limits, const Clock* clock, std::string replica_id);

  // Each tenant's own quotas (from the tokens file; replaced on reload). A tenant
  // without an entry has none; the server-wide limits apply to everyone. A lowered
  // quota never evicts: it refuses new sessions and growth until usage is below it.
  void SetTenantQuotas(absl::flat_hash_map<std::string, TenantQuota> quotas);
  TenantUsage UsageOf(const std::string& tenant) const;

  // Admission of a new session (create, fork, import, restore): a slot, the byte
  // estimates and a fresh unique id. RESOURCE_EXHAUSTED, kind kLimitReached with the
  // limit max_sessions, max_kv_bytes or max_cold_bytes (the server's, or "(N for tenant
  // 'x')" in the message for the tenant's quota: same limit name). `cold_in_memory`
  // says whether cold_bytes count. The engine calls these only from its one admission
  // point (Engine::Impl::Admit, engine_admit.cc).
  struct Reservation {
    uint64_t ticket = 0;
    std::string id;              // "" for a bytes-only reservation
    std::string tenant;
    int64_t hot_bytes = 0;
    int64_t cold_bytes = 0;
    bool cold_in_memory = false;
    bool session = true;         // false: ReserveBytes (no session slot, never Insert-ed)
  };
  absl::StatusOr<Reservation> Reserve(const std::string& tenant, int64_t hot_bytes, int64_t cold_bytes,
                                      bool cold_in_memory);
  // The bytes of a job that creates no session (Compress) while it runs, under the same
  // limits and quotas but without a session slot; Unreserve when it ends.
  absl::StatusOr<Reservation> ReserveBytes(const std::string& tenant, int64_t hot_bytes, int64_t cold_bytes,
                                           bool cold_in_memory);
  // The same with a given id (restore after a restart, import keeping its id):
  // ALREADY_EXISTS when taken.
  absl::StatusOr<Reservation> ReserveId(const std::string& id, const std::string& tenant, int64_t hot_bytes,
                                        int64_t cold_bytes, bool cold_in_memory);
  // ImportSession with keep_id: ReserveId for an id issued to `tenant` (IdIssuedTo);
  // any other valid id answers exactly as a taken one (ALREADY_EXISTS, same message),
  // so the answer never tells whether another tenant holds it (docs/SECURITY.md).
  absl::StatusOr<Reservation> ReserveImportedId(const std::string& id, const std::string& tenant,
                                                int64_t hot_bytes, int64_t cold_bytes, bool cold_in_memory);
  void Unreserve(const Reservation& r);
  // Turns `r` into a live session with `meta` (its id and tenant are taken from r;
  // created / last_used left at the Unix epoch start now).
  // The exact bytes in meta are checked against the limits (the reservation's
  // estimate counted as freed); on error the reservation is released too.
  absl::Status Insert(const Reservation& r, SessionInfo meta, std::shared_ptr<SessionData> data);

  // A mutation begins: busy = true. NOT_FOUND for an unknown, expired or foreign
  // (another tenant's) id, identical in all three cases; FAILED_PRECONDITION when busy.
  absl::StatusOr<SessionInfo> Claim(const std::string& id, const std::string& tenant);
  // The mutation ended without a change: busy = false, idle timer restarts.
  void Release(const std::string& id);
  // The mutation ended with a new state: bytes re-checked with this session's old
  // bytes counted as freed (RESOURCE_EXHAUSTED; the session then stays as it was,
  // still claimed). On success busy = false and the idle timer restarts.
  absl::Status Commit(const std::string& id, SessionInfo updated, std::shared_ptr<SessionData> data);

  // Metadata (and the data handle) of a live session of `tenant`; `touch` restarts the
  // idle timer. NOT_FOUND as Claim.
  absl::StatusOr<SessionInfo> Get(const std::string& id, const std::string& tenant, bool touch);
  absl::StatusOr<std::shared_ptr<SessionData>> Data(const std::string& id, const std::string& tenant,
                                                    bool touch);
  // Swaps the data handle without a mutation (e.g. a spilled cold tier reloaded).
  void ReplaceData(const std::string& id, std::shared_ptr<SessionData> data, bool cold_in_memory);
  // The live sessions of `tenant`, oldest first (expired ones reaped first).
  std::vector<SessionInfo> List(const std::string& tenant);
  // Removes a session: its hot bytes are returned. FAILED_PRECONDITION when busy.
  absl::StatusOr<int64_t> Delete(const std::string& id, const std::string& tenant);
  // Removes sessions idle beyond their TTL (busy ones never expire); returns their ids.
  std::vector<std::string> ReapExpired();

  // Sessions whose tensors are loaded with a cold tier in memory and that no mutation
  // holds, least recently used first (the engine may drop their tensors when they are
  // saved on disk, to make room under max_cold_bytes).
  std::vector<std::string> SpillCandidates(const std::string& except) const;

  StoreTotals Totals() const;
  // The same over `tenant`'s sessions and reservations only (what GetServerInfo shows a
  // tenant).
  StoreTotals TotalsOf(const std::string& tenant) const;
  const SessionLimits& limits() const { return limits_; }
  const std::string& replica_id() const { return replica_id_; }

 private:
  struct Entry {
    SessionInfo meta;
    std::shared_ptr<SessionData> data;  // tensors; shared so readers keep a snapshot alive
  };
  absl::Status CheckLimitsLocked(const std::string& tenant, int extra_sessions, int64_t hot_delta,
                                 int64_t cold_memory_delta) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to the server totals and the tenant's usage (deltas may be negative).
  void AccountLocked(const std::string& tenant, int sessions, int64_t hot, int64_t cold_memory)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const std::string& id, const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> NewIdLocked(const std::string& tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdTakenLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionLimits limits_;
  const Clock* clock_;                      // not owned
  const std::string replica_id_;            // id prefix ("" = none)
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  int reserved_sessions_ ABSL_GUARDED_BY(mu_) = 0;      // reservations_ with session = true
  int64_t hot_bytes_ ABSL_GUARDED_BY(mu_) = 0;          // live + reserved
  int64_t cold_memory_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // live + reserved, in memory
  absl::flat_hash_map<std::string, TenantUsage> usage_ ABSL_GUARDED_BY(mu_);   // tenants holding anything
  absl::flat_hash_map<std::string, TenantQuota> quotas_ ABSL_GUARDED_BY(mu_);  // from the tokens file
};

// The NOT_FOUND every session lookup returns (never says whether the id exists for
// another tenant). Only a short prefix of the id is echoed. Kind kNotFound, field session_id.
absl::Status SessionNotFound(absl::string_view id);
// INVALID_ARGUMENT "<field> '<prefix>' is malformed" (kind kInvalidArgument, `field`).
absl::Status MalformedSessionId(absl::string_view id, absl::string_view field = "session_id");

// 128 bits from the OS CSPRNG (getrandom) as 32 lowercase hex characters.
absl::StatusOr<std::string> RandomHex128();

// Every new id's last 8 hex digits are a tag of its tenant: the first 8 hex digits of
// SHA-256("echokv session id\n" + tenant + "\n" + the 24 hex digits before them), so
// an id carries 96 random bits. Not a secret: it only decides which ids ImportSession
// may keep for a tenant (ReserveImportedId), from the id and the caller alone.
std::string TenantIdTag(absl::string_view tenant, absl::string_view random_hex);
// Whether `id` (valid) ends in the tag of `tenant`.
bool IdIssuedTo(absl::string_view id, absl::string_view tenant);

// The one session id grammar (server/state/session_id.h): `(<label>.)?<32 lowercase
// hex>`, label = [a-z0-9]([a-z0-9-]{0,61}[a-z0-9])? (a DNS label, e.g. a pod name).
bool IsValidSessionId(absl::string_view id);
// The owner prefix of a valid id ("" when it has none).
absl::string_view SessionIdOwner(absl::string_view id);
// A short printable rendering of an untrusted id for messages: common/echo.h's EchoPrefix.
std::string EscapedIdPrefix(absl::string_view id);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_SESSION_STORE_H_
