#include "server/engine/runner.h"

#include <ATen/ATen.h>

#include <utility>

namespace echokv::server {

std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> Runner::Decode(absl::Span<const Row> rows) {
  std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> out;
  out.reserve(rows.size());
  if (rows.empty()) return out;
  ++batches_;
  rows_decoded_ += static_cast<int64_t>(rows.size());
  if (rows.size() > 1) {
    // One batched step: the dense products carry the weight reads once for all rows.
    std::vector<model::DecodeRow> batch;
    batch.reserve(rows.size());
    for (const Row& row : rows) batch.push_back({row.token, row.cache, row.want_queries});
    absl::StatusOr<std::vector<model::DecodeResult>> r = model_->DecodeBatch(batch);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!r.ok()) {
        out.push_back(r.status());
        continue;
      }
      compression::LookaheadDecoder::Step step;
      step.logits = std::move((*r)[i].logits);
      step.queries = std::move((*r)[i].queries);
      out.push_back(std::move(step));
    }
    return out;
  }
  // One row: the single-stream fast path.
  for (const Row& row : rows) {
    absl::StatusOr<model::DecodeResult> r = model_->Decode(row.token, row.cache, row.want_queries);
    if (!r.ok()) {
      out.push_back(r.status());
      continue;
    }
    compression::LookaheadDecoder::Step step;
    step.logits = std::move(r->logits);
    step.queries = std::move(r->queries);
    out.push_back(std::move(step));
  }
  return out;
}

}  // namespace echokv::server
