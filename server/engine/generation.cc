#include "server/engine/generation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

namespace echokv::server {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t HeldSuffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t k = std::min(text.size(), s.size() - 1); k > best; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

}  // namespace

Stream::Stream(uint64_t id, GenerateParams params, CancelFlag cancel, StreamSink sink,
               DoneFn<GenerateSummary> done, absl::Time admitted)
    : id_(id),
      params_(std::move(params)),
      cancel_(std::move(cancel)),
      sink_(std::move(sink)),
      done_(std::move(done)),
      admitted_(admitted) {}

void Stream::Begin(model::KvCache cache, at::Tensor logits, absl::Span<const int> history, std::vector<int> eos_ids,
                   const model::Tokenizer* tokenizer) {
  cache_ = std::move(cache);
  logits_ = logits.to(at::kFloat).contiguous();
  prompt_tokens_ = static_cast<int64_t>(history.size());
  sampler_ = std::make_unique<model::Sampler>(params_.sampling, history);
  stop_.max_tokens = params_.max_tokens;
  if (!params_.ignore_eos) stop_.eos_ids = std::move(eos_ids);
  stop_.stop_ids = params_.stop_ids;
  // The history is the decoder's context: deltas are exactly Decode(history + output)
  // minus Decode(history) (a SentencePiece first token keeps its leading space).
  decoder_ = std::make_unique<model::IncrementalDecoder>(tokenizer, history);
}

bool Stream::ready(int max_backlog) const { return !sink_.backlog || sink_.backlog() < max_backlog; }

void Stream::SetLogits(at::Tensor logits) {
  logits_ = logits.to(at::kFloat).contiguous();
  pending_token_ = -1;
}

absl::StatusOr<bool> Stream::Emit(absl::Time now, EngineObserver* observer) {
  model::SampledToken sampled =
      sampler_->Next(absl::MakeConstSpan(logits_.data_ptr<float>(), static_cast<size_t>(logits_.numel())));
  const int token = sampled.token;
  const model::StopReason stop = stop_.Check(token, static_cast<int>(generated_.size()) + 1);
  bool finished = false;
  switch (stop) {
    case model::StopReason::kEos:
      reason_ = FinishReason::kEos;
      stop_token_ = token;
      finished = true;
      break;
    case model::StopReason::kStopId:
      reason_ = FinishReason::kStopToken;
      stop_token_ = token;
      finished = true;
      break;
    case model::StopReason::kLength:
    case model::StopReason::kNone:
      break;
  }
  GenerateDelta delta;
  if (!finished) {
    generated_.push_back(token);
    if (generated_.size() == 1) {
      first_token_ = now;
      if (observer != nullptr) observer->OnFirstToken(absl::ToDoubleSeconds(now - admitted_));
    } else if (observer != nullptr) {
      observer->OnInterToken(absl::ToDoubleSeconds(now - last_token_));
    }
    last_token_ = now;
    absl::StatusOr<std::string> text = decoder_->Add(token);
    if (!text.ok()) return text.status();
    held_ += *text;
    delta.ids.push_back(token);
    if (params_.sampling.logprobs) delta.logprobs.push_back(std::move(sampled));
    // Stop strings: emit up to the first match and finish, else hold back any tail
    // that could begin one.
    size_t cut = std::string::npos;
    for (const std::string& s : params_.stop) {
      const size_t p = held_.find(s);
      if (p != std::string::npos) cut = std::min(cut, p);
    }
    if (cut != std::string::npos) {
      delta.text = held_.substr(0, cut);
      held_.clear();
      reason_ = FinishReason::kStopString;
      finished = true;
    } else {
      const size_t keep = HeldSuffix(held_, params_.stop);
      delta.text = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      if (stop == model::StopReason::kLength) {
        reason_ = FinishReason::kLength;
        finished = true;
      }
    }
    if (!finished) pending_token_ = token;
  }
  if (finished && reason_ != FinishReason::kStopString) {
    absl::StatusOr<std::string> rest = decoder_->Finish();
    if (!rest.ok()) return rest.status();
    held_ += *rest;
    delta.text += held_;
    held_.clear();
  }
  text_ += delta.text;
  if ((!delta.text.empty() || !delta.ids.empty()) && sink_.on_delta) sink_.on_delta(std::move(delta));
  return finished;
}

GenerateSummary Stream::Summary(absl::Time now) const {
  GenerateSummary summary;
  summary.reason = reason_;
  summary.prompt_tokens = prompt_tokens_;
  summary.generated_tokens = static_cast<int>(generated_.size());
  summary.total_seconds = absl::ToDoubleSeconds(now - admitted_);
  if (!generated_.empty()) {
    summary.time_to_first_token_seconds = absl::ToDoubleSeconds(first_token_ - admitted_);
    const double decode = absl::ToDoubleSeconds(last_token_ - first_token_);
    summary.tokens_per_second = (generated_.size() > 1 && decode > 0) ? (generated_.size() - 1) / decode : 0;
  }
  return summary;
}

void Stream::Finish(absl::StatusOr<GenerateSummary> result) {
  if (!done_) return;
  DoneFn<GenerateSummary> done = std::move(done_);
  done_ = nullptr;
  done(std::move(result));
}

}  // namespace echokv::server
