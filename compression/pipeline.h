// Prefill + compress: the unit of work shared by sessions (server), the generate
// CLI and the evaluator. A fresh context starts from an empty cache; a growing
// session passes its compact cache as `base` and the new tokens are prefilled
// against it, then the policy runs on "retained + new" (docs/ALGORITHM.md §6).
//
//   ECHOKV_ASSIGN_OR_RETURN(CompressedContext ctx,
//       PrefillAndCompress(*model, prompt_ids, model->NewCache(), cfg, {}));
//   // ctx.cache: compact cache at next_position L; ctx.last_logits: first token's logits
//   ECHOKV_ASSIGN_OR_RETURN(auto step, model->Decode(first_token, &ctx.cache));
#ifndef ECHOKV_COMPRESSION_PIPELINE_H_
#define ECHOKV_COMPRESSION_PIPELINE_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "compression/config.h"
#include "compression/report.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace echokv::compression {

struct PipelineOptions {
  int prefill_chunk = 256;  // tokens per prefill chunk
  // Progress: (phase, done, total). Phase "prefill" counts tokens; the policy's own
  // phases ("bootstrap", "round1", ...) count steps.
  std::function<void(const std::string&, int64_t, int64_t)> progress;
  // When set and true, the work stops at the next chunk or step with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

struct CompressedContext {
  model::KvCache cache;          // the compact cache (next_position = one past the last token)
  at::Tensor last_logits;        // [V] float32 CPU after the last prefilled token
  std::vector<at::Tensor> kept;  // per layer [G, n_l] int64: entries of "base + new" kept
  CompressionReport report;      // includes the "prefill" phase
};

// Prefills `tokens` on top of `base` and compresses the result with `config`
// (validated first). `tokens` must not be empty.
absl::StatusOr<CompressedContext> PrefillAndCompress(const model::Transformer& model,
                                                     absl::Span<const int> tokens, model::KvCache base,
                                                     const CompressionConfig& config,
                                                     const PipelineOptions& options);

}  // namespace echokv::compression

#endif  // ECHOKV_COMPRESSION_PIPELINE_H_
