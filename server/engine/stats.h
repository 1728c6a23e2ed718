// Plain stats the engine reports (docs/DESIGN.md rule 10): no Prometheus here. The server's
// Metrics class implements EngineObserver and turns these into prometheus-cpp families.
// Nothing here carries a session id.
//
//   class CountingObserver : public EngineObserver { ... };   // tests
//   CountingObserver obs;
//   auto engine = Engine::Create(config, &obs);
#ifndef ECHOKV_SERVER_ENGINE_STATS_H_
#define ECHOKV_SERVER_ENGINE_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "compression/report.h"

namespace echokv::server {

// One finished compression (CreateSession, AppendToSession, commit, Compress).
struct CompressionStats {
  std::string policy;                          // "echokv", ...
  std::vector<compression::PhaseTime> phases;  // including "prefill"
  bool evicted = false;
  bool lookahead_policy = false;               // laq / echokv
  double lookahead_seconds = 0;                // bootstrap + round1 + repair + round2
  double prefill_seconds = 0;
  int64_t prompt_tokens = 0;                   // tokens prefilled
  int64_t evicted_kv_bytes = 0;                // bytes dropped by this compression
  double ratio = 1;                            // retained / full bytes of the result
  double retained_mass = -1;                   // CompressionReport::RetainedMassMean (-1: not measured)
};

// Live totals, reported after every change.
struct EngineGauges {
  int live_sessions = 0;
  int64_t retained_kv_bytes = 0;   // hot tiers
  int64_t cold_kv_bytes = 0;       // cold tiers (memory or disk)
  int64_t cold_memory_bytes = 0;   // cold tiers held in memory
  int64_t full_kv_bytes = 0;       // what full caches of the same sessions would hold
  int queue_depth = 0;
  int active_generations = 0;
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnCompression(const CompressionStats& stats) = 0;
  virtual void OnFirstToken(double seconds) = 0;   // admission -> first token
  virtual void OnInterToken(double seconds) = 0;   // between two tokens of one stream
  virtual void OnGeneratedTokens(int64_t n) = 0;
  virtual void OnSessionCreated() = 0;
  virtual void OnSessionExpired() = 0;
  // A session admission refused by a limit ("max_sessions", "max_kv_bytes", ...).
  virtual void OnSessionRejected(absl::string_view limit) = 0;
  virtual void OnGauges(const EngineGauges& gauges) = 0;
  // Durable state (--state_dir): one state write (a turn, an import, a delete).
  virtual void OnStateWrite(double seconds, bool ok) {}
  // A saved session refused at start or when loaded; kind: "checksum", "truncated",
  // "foreign_model", "unknown_version", "missing_segment", "bad_manifest", "io".
  virtual void OnStateError(absl::string_view kind) {}
  // Sessions found valid on disk at start.
  virtual void OnSessionsRestored(int64_t count) {}
  // The state dir's write probe changed its verdict (false: it cannot be written; a full
  // disk counts as writable). Starts true.
  virtual void OnStateDirWritable(bool writable) {}
  // One engine step that ran work: its wall time and the rows of its batched decode
  // (streams and lookahead rows; 0 when it only prefilled, ran a policy phase or sampled
  // new streams' first tokens from their sessions' logits).
  virtual void OnStep(double seconds, int decode_rows) {}
  // The session layer's stream slots (server/sessions/sessions.h): a slot taken (+1) or
  // given back (-1) by `tenant` ("" when the server runs open).
  virtual void OnStreamSlot(absl::string_view tenant, int delta) {}
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_STATS_H_
