#include "server/runner.h"

#include <ATen/ATen.h>

#include <utility>

namespace echokv::server {

std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> Runner::Decode(absl::Span<const Row> rows) {
  std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> out;
  out.reserve(rows.size());
  if (rows.empty()) return out;
  ++batches_;
  rows_decoded_ += static_cast<int64_t>(rows.size());
  // TODO(#14): one Transformer::DecodeBatch call for all rows once the model has it.
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
