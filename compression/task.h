// A compression run as a resumable state machine, so a serving engine can advance it
// one bounded phase at a time and run the lookahead policies' one-token decode steps
// inside its own batched decode step (docs/ALGORITHM.md §3-§4; docs/ARCHITECTURE.md
// "Engine"). Compress() (policy.h) is this task driven to completion with a
// LookaheadDecoder, so both paths compute exactly the same selection.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto task, CompressionTask::Start(cfg, std::move(input)));
//   while (!task->done()) {
//     if (auto req = task->pending_decode()) {          // laq / echokv lookahead step
//       ECHOKV_ASSIGN_OR_RETURN(auto step, decoder.DecodeStep(req->token, req->view));
//       ECHOKV_RETURN_IF_ERROR(task->SupplyDecode(std::move(step)));
//     } else {
//       ECHOKV_RETURN_IF_ERROR(task->Advance());        // one scoring / selection phase
//     }
//   }
//   ECHOKV_ASSIGN_OR_RETURN(CompressionResult r, task->TakeResult());
#ifndef ECHOKV_COMPRESSION_TASK_H_
#define ECHOKV_COMPRESSION_TASK_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/config.h"
#include "compression/policy.h"
#include "model/kv_cache.h"

namespace echokv::compression {

class CompressionTask {
 public:
  // A one-token decode the task waits for: `token` at view->next_position(), attending
  // per layer/group to what `view` holds (its own new entry included) and appending the
  // token's KV to `view` (the task's private workspace; valid until the next call).
  struct DecodeRequest {
    int token = 0;
    model::KvCache* view = nullptr;
  };

  // Validates `config` and `input` exactly as Compress() does. input.decoder is not
  // used: the caller runs the decodes. input.context must stay alive and unchanged
  // until the task is done.
  static absl::StatusOr<std::unique_ptr<CompressionTask>> Start(const CompressionConfig& config,
                                                                CompressionInput input);
  ~CompressionTask();
  CompressionTask(const CompressionTask&) = delete;
  CompressionTask& operator=(const CompressionTask&) = delete;

  // The decode the task needs before it can go on, if any.
  std::optional<DecodeRequest> pending_decode() const;
  // The result of pending_decode(): logits [V] float32, per layer [H, d] post-RoPE
  // queries; the view must already hold the token's new entry.
  absl::Status SupplyDecode(LookaheadDecoder::Step step);
  // Runs the next phase (scoring / selection; bounded work). Only when no decode is
  // pending and the task is not done.
  absl::Status Advance();
  bool done() const;
  // The phase the task is in ("bootstrap", "round1", ...; "done" at the end).
  std::string phase() const;
  // The selection and report (Compress()'s result). Only once, when done().
  absl::StatusOr<CompressionResult> TakeResult();

  class Impl;  // the policy's state machine (task.cc)

 private:
  explicit CompressionTask(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace echokv::compression

#endif  // ECHOKV_COMPRESSION_TASK_H_
