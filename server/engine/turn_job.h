// One prefill + compression job of the engine (CreateSession, AppendToSession, the
// commit of a Generate, the stateless Compress) as a state machine the engine advances
// one bounded piece per step (docs/ENGINE.md "Jobs are state machines"):
//
//   Prefill (chunks) -> policy phases and lookahead decode rows (CompressionTask) ->
//   Finalize (the new hot tier; the engine then swaps it in)
//
// Memory modes (docs/SESSION_MEMORY.md): `evict` prefills the new tokens against a copy of
// the hot tier and re-compresses "retained + new" (docs/ALGORITHM.md §6); `tiered` prefills
// them against the session's exact cold history, appended in place (rolled back by
// Abort), and re-selects from the whole history with the window queries and H2O
// scores the session keeps. A job never changes the committed session: the engine
// commits its result, or calls Abort.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto job, TurnJob::Start(model, std::move(spec)));
//   while (!job->done()) switch (job->next()) { ... }   // the engine's Step does this
//   std::shared_ptr<SessionData> data = job->TakeSessionData();
#ifndef ECHOKV_SERVER_ENGINE_TURN_JOB_H_
#define ECHOKV_SERVER_ENGINE_TURN_JOB_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/config.h"
#include "compression/policy.h"
#include "compression/task.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "server/engine/scheduler.h"
#include "server/engine/session_data.h"
#include "server/engine/session_store.h"

namespace echokv::server {

enum class TurnKind { kCreate, kAppend, kCommit, kCompress };

struct TurnSpec {
  TurnKind kind = TurnKind::kCreate;
  std::vector<int> tokens;                  // the new tokens (not empty)
  compression::CompressionConfig config;    // validated; a session's own for append/commit
  MemoryMode memory = MemoryMode::kEvict;   // ignored by kCompress
  std::shared_ptr<const SessionData> base;  // append / commit: the committed session
  int prefill_chunk = 256;                  // tokens per Forward call
  // (phase, done, total) after every prefill call and policy phase; may be empty.
  std::function<void(const std::string&, int64_t, int64_t)> progress;
  bool record_scores = false;               // keep the final ranking scores (tests)
};

class TurnJob {
 public:
  static absl::StatusOr<std::unique_ptr<TurnJob>> Start(const model::Transformer* model, TurnSpec spec);
  ~TurnJob();

  // What the job needs next (kWaiting once done).
  JobView::Next next() const;
  int64_t prefill_remaining() const { return total_ - done_tokens_; }
  // Prefills up to `max_tokens` of the remaining tokens.
  absl::Status Prefill(int64_t max_tokens);
  // Runs the next policy phase, or finalizes once the policy is done.
  absl::Status RunPhase();
  // The lookahead decode the job waits for (next() == kDecode).
  std::optional<compression::CompressionTask::DecodeRequest> pending_decode() const;
  absl::Status SupplyDecode(compression::LookaheadDecoder::Step step);
  bool done() const { return finalized_; }
  // Undoes what the job did to shared state (the tiered cold tier's in-place append).
  // Safe to call at any point and more than once; a no-op after Committed(). The
  // destructor calls it, so a job dropped without Committed() changes nothing.
  void Abort();
  // The engine swapped the job's result in: its cold entries are the session's now.
  void Committed();

  const TurnSpec& spec() const { return spec_; }
  const compression::CompressionReport& report() const { return report_; }
  // When done: the new session state (create / append / commit).
  std::shared_ptr<SessionData> TakeSessionData();
  // When done, before TakeSessionData: the new state (to write it to disk first).
  SessionData* mutable_result() { return result_.get(); }
  // When done: per layer [G, n_l] kept entry indices of the context (kCompress).
  const std::vector<at::Tensor>& kept() const { return kept_; }
  // When done and spec.record_scores: CompressionResult::final_scores.
  const std::vector<at::Tensor>& final_scores() const { return final_scores_; }
  // Tokens of the context the policy ran on (retained + new for evict appends).
  int64_t context_tokens() const { return report_.context_tokens; }

 private:
  TurnJob(const model::Transformer* model, TurnSpec spec);
  absl::Status Init();
  absl::Status StartCompression();
  absl::Status Finalize();
  void AccumulateH2o(const std::vector<at::Tensor>& queries, const std::vector<int64_t>& positions);

  const model::Transformer* model_;   // not owned
  TurnSpec spec_;
  bool tiered_ = false;               // append/commit/create in tiered mode
  model::KvCache own_cache_;          // create / evict / compress: the cache prefilled into
  std::shared_ptr<model::KvCache> cold_;  // tiered: the cold tier (shared with the session)
  model::KvCache* cache_ = nullptr;   // own_cache_ or *cold_
  int64_t cold_mark_ = 0;             // tiered: cold entries before this turn (Abort target)
  bool rolled_back_ = false;          // Abort ran (or nothing to roll back)
  int64_t total_ = 0;                 // tokens to prefill
  int64_t done_tokens_ = 0;           // tokens prefilled
  compression::PrefillNeeds needs_;   // what the policy reads besides K and V
  int64_t keep_window_ = 0;           // window queries to keep (w of SessionData)
  bool h2o_accumulate_ = false;       // H2O scores accumulated chunk by chunk (tiered)
  bool keep_all_queries_ = false;     // H2O one-shot: every context query (as the pipeline)
  std::vector<at::Tensor> window_q_;  // per layer [H, <=keep, d] float32 post-RoPE
  std::vector<int64_t> window_pos_;   // their positions
  std::vector<at::Tensor> h2o_;       // per layer [G, n] float32 accumulated scores
  std::vector<at::Tensor> anchor_;    // per layer [H, d] pre-RoPE, last token
  at::Tensor last_logits_;            // [V] float32 CPU after the last new token
  double prefill_seconds_ = 0;        // wall time inside Forward
  std::unique_ptr<compression::CompressionTask> task_;  // after the prefill
  compression::CompressionReport report_;
  std::vector<at::Tensor> kept_;      // the policy's selection
  std::vector<at::Tensor> final_scores_;  // spec.record_scores: what the final top-k ranked
  std::shared_ptr<SessionData> result_;  // the new session state
  bool finalized_ = false;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_TURN_JOB_H_
