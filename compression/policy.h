// Eviction policies as pure functions of tensors plus a decoder interface
// (docs/ALGORITHM.md §3-§4, §8). No threads, no I/O, no randomness.
//
//   CompressionInput in;
//   in.context = &cache;                      // L entries per group per layer
//   in.anchor_queries = pre.anchor_queries;   // when NeedsFor(cfg).anchor_queries
//   in.last_queries = pre.queries; in.last_query_positions = pre.query_positions;
//   in.last_logits = pre.logits; in.rope_inv_freq = model->RopeInvFreq();
//   in.decoder = &decoder;                    // laq / echokv
//   ECHOKV_ASSIGN_OR_RETURN(CompressionResult r, Compress(cfg, in));
//   ECHOKV_ASSIGN_OR_RETURN(KvCache compact, KvCache::Gather(cache, r.indices));
#ifndef ECHOKV_COMPRESSION_POLICY_H_
#define ECHOKV_COMPRESSION_POLICY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/config.h"
#include "compression/report.h"
#include "model/kv_cache.h"

namespace echokv::compression {

// Drives one-token decode steps for the lookahead policies. model::Transformer is
// adapted to it (TransformerDecoder); tests use fakes.
class LookaheadDecoder {
 public:
  virtual ~LookaheadDecoder() = default;
  struct Step {
    at::Tensor logits;               // [V] float32
    std::vector<at::Tensor> queries; // per layer [H, d] float32, post-RoPE
  };
  // Decodes `token` at view->next_position(), attending per layer/group to the entries
  // `view` holds (including its own new entry) and appending its KV to every group.
  virtual absl::StatusOr<Step> DecodeStep(int token, model::KvCache* view) = 0;
};

struct CompressionInput {
  const model::KvCache* context = nullptr;     // the L context entries (original positions)
  std::vector<at::Tensor> anchor_queries;      // per layer [H, d] pre-RoPE, last context token
  std::vector<at::Tensor> last_queries;        // per layer [H, N, d] post-RoPE, last N tokens
  std::vector<int64_t> last_query_positions;   // their N positions
  at::Tensor last_logits;                      // [V] float32 after the last context token
  at::Tensor rope_inv_freq;                    // [d/2] float32
  // H2O only, optional: per layer [G, n] float32 (n = context->size(l)), each entry's
  // accumulated causal attention from every context query so far, summed over the
  // group's heads (docs/ALGORITHM.md §8.5). When set, H2O ranks by it instead of computing
  // it from last_queries (the engine accumulates it chunk by chunk and across turns).
  std::vector<at::Tensor> h2o_scores;
  // Record the scores the final top-k ranked (CompressionResult::final_scores), so a test
  // can tell a near-tie from a real difference between two selections.
  bool record_scores = false;
  LookaheadDecoder* decoder = nullptr;         // required by laq and echokv
  // Optional progress: (phase name, steps done, steps total).
  std::function<void(const std::string&, int64_t, int64_t)> progress;
};

struct CompressionResult {
  // indices[l]: [G, n_l] int64 CPU, ascending per group: the context entries (indices
  // into context->keys(l) along dim 1) kept in layer l.
  std::vector<at::Tensor> indices;
  CompressionReport report;
  // When input.record_scores: per layer [G, m] float32 CPU, the group scores the final
  // top-k ranked over the candidate prefix 0..m-1 (indices below m were chosen by them;
  // the rest of the selection is positional). Undefined for a layer selected by
  // position only (L <= B, StreamingLLM, a window-only budget).
  std::vector<at::Tensor> final_scores;
};

// Runs `config.policy` (validated first) on `input`: CompressionTask (task.h) driven
// to completion with input.decoder.
absl::StatusOr<CompressionResult> Compress(const CompressionConfig& config,
                                           const CompressionInput& input);

}  // namespace echokv::compression

#endif  // ECHOKV_COMPRESSION_POLICY_H_
