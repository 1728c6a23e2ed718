#include "compression/pipeline.h"

#include <ATen/ATen.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/policy.h"
#include "compression/transformer_decoder.h"

namespace echokv::compression {

absl::StatusOr<CompressedContext> PrefillAndCompress(const model::Transformer& model,
                                                     absl::Span<const int> tokens, model::KvCache base,
                                                     const CompressionConfig& config,
                                                     const PipelineOptions& options) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  if (tokens.empty()) return absl::InvalidArgumentError("input: at least one token is required");
  const PrefillNeeds needs = NeedsFor(config);

  model::ForwardOptions fo;
  fo.chunk_size = options.prefill_chunk;
  fo.return_anchor_queries = needs.anchor_queries;
  fo.keep_last_queries = needs.last_queries;
  fo.cancel = options.cancel;
  if (options.progress) {
    fo.progress = [&](int64_t done, int64_t total) { options.progress("prefill", done, total); };
  }
  const auto t0 = std::chrono::steady_clock::now();
  ECHOKV_ASSIGN_OR_RETURN(model::ForwardResult pre, model.Forward(tokens, &base, fo));
  const double prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (options.cancel != nullptr && options.cancel->load()) return absl::CancelledError("compression cancelled");

  TransformerDecoder decoder(&model);
  CompressionInput in;
  in.context = &base;
  in.anchor_queries = std::move(pre.anchor_queries);
  in.last_queries = std::move(pre.queries);
  in.last_query_positions = std::move(pre.query_positions);
  in.last_logits = pre.logits;
  in.rope_inv_freq = model.RopeInvFreq();
  in.decoder = &decoder;
  in.progress = options.progress;
  ECHOKV_ASSIGN_OR_RETURN(CompressionResult result, Compress(config, in));

  CompressedContext out;
  out.last_logits = pre.logits;
  out.report = std::move(result.report);
  out.report.phases.insert(out.report.phases.begin(), PhaseTime{"prefill", prefill_seconds});
  if (out.report.evicted) {
    ECHOKV_ASSIGN_OR_RETURN(out.cache, model::KvCache::Gather(base, result.indices));
  } else {
    out.cache = std::move(base);  // nothing evicted: keep the cache as it is
  }
  out.kept = std::move(result.indices);
  return out;
}

}  // namespace echokv::compression
