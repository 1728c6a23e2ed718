// One Generate stream and its output stage (engine thread only): the stream's private
// copy of the session's hot tier, its own sampler and RNG, stop checks, UTF-8-safe
// text deltas that never show a prefix of a stop string, and timing.
//
//   Stream s(id, params, cancel, sink, done);
//   s.Begin(std::move(cache), logits, prompt_tokens, eos_ids, tokenizer, now);
//   if (s.pending_token() >= 0) { /* decode it into s.cache(), then */ s.SetLogits(l); }
//   ECHOKV_ASSIGN_OR_RETURN(bool finished, s.Emit(now, observer));
#ifndef ECHOKV_SERVER_ENGINE_GENERATION_H_
#define ECHOKV_SERVER_ENGINE_GENERATION_H_

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/kv_cache.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "server/engine/engine.h"

namespace echokv::server {

// A prompt appended in one unit with its generation (GenerateParams::input): the
// session's state with the prompt, not yet committed (engine_impl.h).
struct PendingPrompt;

class Stream {
 public:
  Stream(uint64_t id, GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done,
         absl::Time admitted);

  // Starts from the session's hot tier copy and next-token logits ([V] float32 CPU).
  // `history`: every token the session holds (repetition_penalty reads it).
  void Begin(model::KvCache cache, at::Tensor logits, absl::Span<const int> history, std::vector<int> eos_ids,
             const model::Tokenizer* tokenizer);

  // GenerateParams::fit_max_tokens: lowers max_tokens to `room` (at least 1). Before Begin.
  void FitMaxTokens(int64_t room) {
    if (params_.fit_max_tokens) {
      params_.max_tokens = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(params_.max_tokens, room)));
    }
  }

  uint64_t id() const { return id_; }
  const GenerateParams& params() const { return params_; }
  bool cancelled() const { return cancel_->load(); }
  // The reader has taken enough of what it was sent (backpressure).
  bool ready(int max_backlog) const;
  // The token to decode before the next sample; -1 when the current logits are fresh.
  int pending_token() const { return pending_token_; }
  model::KvCache* cache() { return &cache_; }
  // The logits after decoding pending_token().
  void SetLogits(at::Tensor logits);

  // Samples the next token from the current logits, applies the stop rules and sends
  // the text delta. Returns true when the generation is over (then `reason()`, the
  // generated ids and Summary() are final).
  absl::StatusOr<bool> Emit(absl::Time now, EngineObserver* observer);

  FinishReason reason() const { return reason_; }
  // Every sampled token (no eos/stop id), and the id that stopped it (-1 if none).
  const std::vector<int>& generated() const { return generated_; }
  int stop_token() const { return stop_token_; }
  // Every piece of text sent in deltas, concatenated.
  const std::string& text() const { return text_; }
  GenerateSummary Summary(absl::Time now) const;

  // Ends the call (runs `done` once).
  void Finish(absl::StatusOr<GenerateSummary> result);

  // The generated tokens not yet reported to the observer; 0 after the first call (a
  // stream is counted once, whether it finished, failed or was cancelled).
  int64_t TakeUncountedTokens() {
    const int64_t n = counted_ ? 0 : static_cast<int64_t>(generated_.size());
    counted_ = true;
    return n;
  }

  // GenerateParams::input: the prompt's uncommitted state, held (and rolled back when
  // the stream goes away uncommitted) by the stream. Null otherwise.
  void set_prompt(std::shared_ptr<PendingPrompt> prompt) { prompt_ = std::move(prompt); }
  PendingPrompt* prompt() const { return prompt_.get(); }

 private:
  uint64_t id_;
  GenerateParams params_;
  CancelFlag cancel_;                                   // never null
  StreamSink sink_;
  DoneFn<GenerateSummary> done_;                        // reset after it ran
  model::KvCache cache_;                                // private copy of the hot tier
  at::Tensor logits_;                                   // [V] float32 CPU, next-token logits
  int pending_token_ = -1;                              // sampled, not yet decoded into cache_
  std::unique_ptr<model::Sampler> sampler_;
  model::StopCriteria stop_;
  std::unique_ptr<model::IncrementalDecoder> decoder_;
  std::vector<int> generated_;                          // every sampled token (no eos/stop id)
  int stop_token_ = -1;                                 // the eos / stop id that ended it
  std::string held_;                                    // text withheld: may start a stop string
  std::string text_;                                    // all text sent so far
  FinishReason reason_ = FinishReason::kLength;
  int64_t prompt_tokens_ = 0;                           // session tokens when admitted
  bool counted_ = false;                                // TakeUncountedTokens ran
  std::shared_ptr<PendingPrompt> prompt_;               // GenerateParams::input (may be null)
  absl::Time admitted_;
  absl::Time first_token_;
  absl::Time last_token_;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_GENERATION_H_
