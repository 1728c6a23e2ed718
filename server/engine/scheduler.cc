#include "server/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace echokv::server {

absl::Status SchedulerOptions::Validate() const {
  if (max_step_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_step_tokens must be >= 1, got ", max_step_tokens));
  }
  if (min_prefill_tokens < 1 || min_prefill_tokens > max_step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_prefill_tokens must be in [1, max_step_tokens], got ",
                                                   min_prefill_tokens));
  }
  if (max_phase_jobs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_phase_jobs must be >= 1, got ", max_phase_jobs));
  }
  return absl::OkStatus();
}

int64_t Plan::tokens() const {
  int64_t n = static_cast<int64_t>(decode_streams.size() + decode_jobs.size());
  for (const PrefillSlice& s : prefill) n += s.tokens;
  return n;
}

Plan Scheduler::Schedule(absl::Span<const StreamView> streams, absl::Span<const JobView> jobs) {
  Plan plan;
  for (const StreamView& s : streams) {
    if (s.ready) plan.decode_streams.push_back(s.id);
  }
  std::vector<const JobView*> ordered;
  ordered.reserve(jobs.size());
  for (const JobView& j : jobs) ordered.push_back(&j);
  std::sort(ordered.begin(), ordered.end(), [](const JobView* a, const JobView* b) { return a->id < b->id; });

  std::vector<uint64_t> phase_candidates;
  for (const JobView* j : ordered) {
    if (j->next == JobView::Next::kDecode) plan.decode_jobs.push_back(j->id);
    if (j->next == JobView::Next::kPhase) phase_candidates.push_back(j->id);
  }

  // Prefill within what the decode rows leave of the budget, oldest job first.
  const int64_t rows = static_cast<int64_t>(plan.decode_streams.size() + plan.decode_jobs.size());
  int64_t budget = std::max(options_.max_step_tokens - rows, options_.min_prefill_tokens);
  for (const JobView* j : ordered) {
    if (budget <= 0) break;
    if (j->next != JobView::Next::kPrefill || j->prefill_remaining <= 0) continue;
    const int64_t n = std::min(budget, j->prefill_remaining);
    plan.prefill.push_back({j->id, n});
    budget -= n;
  }

  // Policy phases: round robin from the job after the last one served.
  if (!phase_candidates.empty()) {
    auto first = std::upper_bound(phase_candidates.begin(), phase_candidates.end(), last_phase_job_);
    std::rotate(phase_candidates.begin(), first, phase_candidates.end());
    const size_t take = std::min<size_t>(phase_candidates.size(), static_cast<size_t>(options_.max_phase_jobs));
    plan.phase_jobs.assign(phase_candidates.begin(), phase_candidates.begin() + take);
    last_phase_job_ = plan.phase_jobs.back();
  }
  return plan;
}

}  // namespace echokv::server
