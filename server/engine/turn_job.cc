#include "server/engine/turn_job.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/errors.h"
#include "common/status_macros.h"
#include "kernels/score.h"

namespace echokv::server {
namespace {

// Runs `fn`, turning any exception into an INTERNAL status naming `what`.
template <typename Fn>
absl::Status Guard(const char* what, Fn fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

// The window every tiered session keeps: SnapKV/PyramidKV's observation window and
// LAQ's last 8 (docs/SESSION_MEMORY.md §3).
int64_t TieredWindow(const compression::CompressionConfig& c) { return std::max(c.snapkv_window, 8); }

}  // namespace

TurnJob::TurnJob(const model::Transformer* model, TurnSpec spec) : model_(model), spec_(std::move(spec)) {}

TurnJob::~TurnJob() { Abort(); }

absl::StatusOr<std::unique_ptr<TurnJob>> TurnJob::Start(const model::Transformer* model, TurnSpec spec) {
  if (spec.tokens.empty()) return MakeError(ErrorKind::kInvalidArgument, "input", "input: at least one token is required");
  if (spec.prefill_chunk < 1) return absl::InvalidArgumentError("prefill_chunk must be >= 1");
  ECHOKV_RETURN_IF_ERROR(spec.config.Validate());
  const bool on_session = spec.kind == TurnKind::kAppend || spec.kind == TurnKind::kCommit;
  if (on_session && spec.base == nullptr) return absl::InternalError("append/commit job without a session");
  std::unique_ptr<TurnJob> job(new TurnJob(model, std::move(spec)));
  ECHOKV_RETURN_IF_ERROR(Guard("starting the job", [&] { return job->Init(); }));
  return job;
}

absl::Status TurnJob::Init() {
  const TurnSpec& s = spec_;
  total_ = static_cast<int64_t>(s.tokens.size());
  needs_ = compression::NeedsFor(s.config);
  rolled_back_ = true;  // nothing shared is touched until a tiered append starts
  switch (s.kind) {
    case TurnKind::kCompress:
      own_cache_ = model_->NewCache();
      cache_ = &own_cache_;
      break;
    case TurnKind::kCreate:
      if (s.memory == MemoryMode::kTiered) {
        tiered_ = true;
        cold_ = std::make_shared<model::KvCache>(model_->NewCache());
        cache_ = cold_.get();
      } else {
        own_cache_ = model_->NewCache();
        cache_ = &own_cache_;
      }
      break;
    case TurnKind::kAppend:
    case TurnKind::kCommit:
      if (s.base->cold != nullptr) {
        tiered_ = true;
        cold_ = s.base->cold;
        cold_mark_ = s.base->cold_len;
        if (cold_->size(0) != cold_mark_ || cold_->next_position() != cold_mark_) {
          return absl::InternalError(absl::StrCat("cold tier holds ", cold_->size(0), " entries, the session ",
                                                  cold_mark_, ": an earlier turn was not rolled back"));
        }
        cache_ = cold_.get();
        window_q_ = s.base->window_queries;
        window_pos_ = s.base->window_positions;
        h2o_ = s.base->h2o_scores;
        rolled_back_ = false;
      } else {
        own_cache_ = s.base->hot.Clone();
        cache_ = &own_cache_;
      }
      break;
  }
  if (tiered_) {
    keep_window_ = TieredWindow(s.config);
    h2o_accumulate_ = s.config.policy == compression::PolicyKind::kH2o;
  } else if (needs_.last_queries < 0) {
    keep_all_queries_ = true;  // H2O over every context query, exactly as the pipeline
  } else {
    keep_window_ = needs_.last_queries;
  }
  if (window_q_.empty()) window_q_.resize(model_->config().num_layers);
  if (h2o_.empty() && h2o_accumulate_) h2o_.resize(model_->config().num_layers);
  return absl::OkStatus();
}

JobView::Next TurnJob::next() const {
  if (finalized_) return JobView::Next::kWaiting;
  if (done_tokens_ < total_) return JobView::Next::kPrefill;
  if (task_ != nullptr && task_->pending_decode().has_value()) return JobView::Next::kDecode;
  return JobView::Next::kPhase;
}

void TurnJob::AccumulateH2o(const std::vector<at::Tensor>& queries, const std::vector<int64_t>& positions) {
  // docs/ALGORITHM.md §8.5 / docs/SESSION_MEMORY.md §3: each entry's causal column sum, summed
  // over the group's heads; a chunk's queries see exactly the keys the cache holds now.
  const at::Tensor qpos = at::tensor(positions, at::kLong);
  const int64_t groups = cache_->num_kv_heads();
  for (int l = 0; l < cache_->num_layers(); ++l) {
    at::Tensor col = kernels::CausalColumnSums(queries[l].to(at::kFloat), qpos, cache_->keys(l),
                                               cache_->positions(l));              // [H, n]
    at::Tensor g = kernels::SumHeadsPerGroup(col, groups).to(at::kCPU, at::kFloat);  // [G, n]
    if (h2o_[l].defined() && h2o_[l].size(1) > 0) {
      g.narrow(1, 0, h2o_[l].size(1)).add_(h2o_[l]);
    }
    h2o_[l] = g;
  }
}

absl::Status TurnJob::Prefill(int64_t max_tokens) {
  return Guard("prefill", [&]() -> absl::Status {
    int64_t todo = std::min(max_tokens, total_ - done_tokens_);
    while (todo > 0) {
      const int64_t m = std::min<int64_t>(todo, spec_.prefill_chunk);
      const bool last = done_tokens_ + m == total_;
      model::ForwardOptions fo;
      fo.chunk_size = static_cast<int>(m);
      fo.return_anchor_queries = last && needs_.anchor_queries;
      const bool want_all = h2o_accumulate_ || keep_all_queries_;
      fo.keep_last_queries = static_cast<int>(want_all ? m : std::min<int64_t>(keep_window_, m));
      const auto t0 = std::chrono::steady_clock::now();
      ECHOKV_ASSIGN_OR_RETURN(
          model::ForwardResult r,
          model_->Forward(absl::MakeConstSpan(spec_.tokens.data() + done_tokens_, static_cast<size_t>(m)), cache_, fo));
      if (fo.keep_last_queries > 0) {
        if (h2o_accumulate_) AccumulateH2o(r.queries, r.query_positions);
        if (keep_all_queries_ || keep_window_ > 0) {
          const int64_t keep = keep_all_queries_ ? -1 : keep_window_;
          for (size_t l = 0; l < r.queries.size(); ++l) {
            at::Tensor q = r.queries[l].to(at::kFloat);
            at::Tensor& acc = window_q_[l];
            acc = acc.defined() && acc.size(1) > 0 ? at::cat({acc, q}, 1) : q;
            if (keep >= 0 && acc.size(1) > keep) acc = acc.narrow(1, acc.size(1) - keep, keep).contiguous();
          }
          window_pos_.insert(window_pos_.end(), r.query_positions.begin(), r.query_positions.end());
          if (keep >= 0 && static_cast<int64_t>(window_pos_.size()) > keep) {
            window_pos_.erase(window_pos_.begin(), window_pos_.end() - keep);
          }
        }
      }
      if (last) {
        last_logits_ = r.logits.to(at::kFloat).contiguous();
        anchor_ = std::move(r.anchor_queries);
      }
      prefill_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      done_tokens_ += m;
      todo -= m;
      if (spec_.progress) spec_.progress("prefill", done_tokens_, total_);
    }
    return absl::OkStatus();
  });
}

absl::Status TurnJob::StartCompression() {
  compression::CompressionInput in;
  in.context = cache_;
  in.anchor_queries = anchor_;
  if (keep_all_queries_ || keep_window_ > 0) {
    in.last_queries = window_q_;
    in.last_query_positions = window_pos_;
  }
  if (h2o_accumulate_) in.h2o_scores = h2o_;
  in.last_logits = last_logits_;
  in.rope_inv_freq = model_->RopeInvFreq();
  in.progress = spec_.progress;
  in.record_scores = spec_.record_scores;
  ECHOKV_ASSIGN_OR_RETURN(task_, compression::CompressionTask::Start(spec_.config, std::move(in)));
  return absl::OkStatus();
}

absl::Status TurnJob::RunPhase() {
  if (finalized_) return absl::FailedPreconditionError("the job is done");
  if (done_tokens_ < total_) return absl::FailedPreconditionError("the prefill is not finished");
  return Guard("compression", [&]() -> absl::Status {
    if (task_ == nullptr) return StartCompression();
    if (!task_->done()) ECHOKV_RETURN_IF_ERROR(task_->Advance());
    if (task_->done()) return Finalize();
    return absl::OkStatus();
  });
}

std::optional<compression::CompressionTask::DecodeRequest> TurnJob::pending_decode() const {
  if (task_ == nullptr || finalized_) return std::nullopt;
  return task_->pending_decode();
}

absl::Status TurnJob::SupplyDecode(compression::LookaheadDecoder::Step step) {
  if (task_ == nullptr) return absl::FailedPreconditionError("no lookahead decode is pending");
  return Guard("lookahead", [&]() -> absl::Status {
    ECHOKV_RETURN_IF_ERROR(task_->SupplyDecode(std::move(step)));
    if (task_->done()) return Finalize();
    return absl::OkStatus();
  });
}

absl::Status TurnJob::Finalize() {
  ECHOKV_ASSIGN_OR_RETURN(compression::CompressionResult result, task_->TakeResult());
  report_ = std::move(result.report);
  report_.phases.insert(report_.phases.begin(), compression::PhaseTime{"prefill", prefill_seconds_});
  kept_ = std::move(result.indices);
  final_scores_ = std::move(result.final_scores);
  if (spec_.kind != TurnKind::kCompress) {
    auto data = std::make_shared<SessionData>();
    if (tiered_) {
      // The hot tier is always a gathered copy: the cold tier stays exact.
      ECHOKV_ASSIGN_OR_RETURN(data->hot, model::KvCache::Gather(*cold_, kept_));
      data->cold = cold_;
      data->cold_len = cold_->size(0);
      data->window_queries = window_q_;
      data->window_positions = window_pos_;
      data->h2o_scores = h2o_;
    } else if (report_.evicted) {
      ECHOKV_ASSIGN_OR_RETURN(data->hot, model::KvCache::Gather(own_cache_, kept_));
    } else {
      data->hot = std::move(own_cache_);  // nothing evicted: keep the cache as it is
    }
    // The retained tier in the session's storage (issue 31): selection scored the rows
    // above in full precision; only what is kept is quantized (a no-op when the hot tier
    // already is: an evict session's int8 rows moved by Gather keep their bits).
    ECHOKV_ASSIGN_OR_RETURN(data->hot, data->hot.ToStorage(spec_.config.cache_dtype));
    data->last_logits = last_logits_;
    data->segments_since_full = spec_.base != nullptr ? spec_.base->segments_since_full + 1 : 1;
    if (spec_.base != nullptr) data->tokens = spec_.base->tokens;
    data->tokens.insert(data->tokens.end(), spec_.tokens.begin(), spec_.tokens.end());
    result_ = std::move(data);
  }
  task_.reset();
  window_q_.clear();
  finalized_ = true;
  return absl::OkStatus();
}

std::shared_ptr<SessionData> TurnJob::TakeSessionData() { return std::move(result_); }

void TurnJob::Committed() { rolled_back_ = true; }  // the new cold entries belong to the new state

void TurnJob::Abort() {
  if (rolled_back_ || !tiered_ || cold_ == nullptr) return;
  rolled_back_ = true;
  // The committed session still reads the first cold_mark_ entries; drop the rest.
  if (absl::Status s = cold_->TruncateTo(cold_mark_, cold_mark_); !s.ok()) {
    // Only if the cache is smaller than the mark, which Init ruled out.
    cold_.reset();
  }
}

}  // namespace echokv::server
