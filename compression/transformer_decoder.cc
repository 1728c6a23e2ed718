#include "compression/transformer_decoder.h"

#include <utility>

#include "common/status_macros.h"

namespace echokv::compression {

absl::StatusOr<LookaheadDecoder::Step> TransformerDecoder::DecodeStep(int token,
                                                                      model::KvCache* view) {
  ++calls_;
  if (model_ == nullptr) return absl::FailedPreconditionError("TransformerDecoder: no model");
  ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, model_->Decode(token, view, /*return_queries=*/true));
  Step step;
  step.logits = std::move(r.logits);
  step.queries = std::move(r.queries);
  return step;
}

}  // namespace echokv::compression
