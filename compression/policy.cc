#include "compression/policy.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/task.h"

namespace echokv::compression {

absl::StatusOr<CompressionResult> Compress(const CompressionConfig& config,
                                           const CompressionInput& input) {
  LookaheadDecoder* decoder = input.decoder;
  if ((config.policy == PolicyKind::kLaq || config.policy == PolicyKind::kEchoKv) && decoder == nullptr &&
      input.context != nullptr) {
    bool over_budget = false;
    for (int l = 0; l < input.context->num_layers(); ++l) over_budget |= input.context->size(l) > config.budget;
    if (over_budget) {
      return absl::InvalidArgumentError(absl::StrCat("decoder: ", PolicyName(config.policy),
                                                     " needs a LookaheadDecoder for its lookahead steps"));
    }
  }
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<CompressionTask> task, CompressionTask::Start(config, input));
  while (!task->done()) {
    if (std::optional<CompressionTask::DecodeRequest> req = task->pending_decode()) {
      if (decoder == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("decoder: ", PolicyName(config.policy),
                                                       " needs a LookaheadDecoder for its lookahead steps"));
      }
      ECHOKV_ASSIGN_OR_RETURN(LookaheadDecoder::Step step, decoder->DecodeStep(req->token, req->view));
      ECHOKV_RETURN_IF_ERROR(task->SupplyDecode(std::move(step)));
    } else {
      ECHOKV_RETURN_IF_ERROR(task->Advance());
    }
  }
  return task->TakeResult();
}

}  // namespace echokv::compression
