// Pure fidelity metrics of the evaluator (torch-free): next-token KL between two
// logit vectors, greedy match length, exact match, set overlap of retained indices,
// evidence retention, and a seeded percentile-bootstrap interval of a mean.
//
//   ECHOKV_ASSIGN_OR_RETURN(double kl, KlFromLogits(full_logits, policy_logits));
//   int ml = MatchLength(full_tokens, policy_tokens, /*cap=*/32);
//   double o = SetOverlap(kept_sorted, oracle_sorted);           // |a ∩ b| / |b|
//   MeanInterval ci = BootstrapMeanInterval(per_case_values, {});  // 95 %, seed 0
#ifndef ECHOKV_BENCH_EVAL_METRICS_H_
#define ECHOKV_BENCH_EVAL_METRICS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace echokv::eval {

// KL(softmax(p) ‖ softmax(q)) in nats, computed in double with a stable
// log-sum-exp. p_logits, q_logits: V floats each (V >= 1, same V, finite).
// Mismatched sizes or non-finite values -> InvalidArgument.
absl::StatusOr<double> KlFromLogits(absl::Span<const float> p_logits,
                                    absl::Span<const float> q_logits);

// Number of leading positions where `reference` and `candidate` agree, capped at
// `cap` (and at the shorter length).
int MatchLength(absl::Span<const int> reference, absl::Span<const int> candidate, int cap);

// True when `output` starts with `answer` (output may be longer; an empty answer
// never matches, it is not a task).
bool ExactMatch(absl::Span<const int> output, absl::Span<const int> answer);

// |a ∩ b| / |b| for two sets given as sorted ascending, duplicate-free index lists;
// an empty b gives 1 (nothing to retain).
double SetOverlap(absl::Span<const int64_t> a, absl::Span<const int64_t> b);

// A half-open token span [start, end) of a prompt.
using Span64 = std::pair<int64_t, int64_t>;

// Evidence retention (the paper's Table 6): for each layer and KV group, the share of
// evidence tokens (union of `spans`) whose positions are in that group's retained set;
// averaged over layers and groups. kept[l][g]: sorted ascending positions retained in
// layer l, group g. No evidence tokens -> InvalidArgument; no layers/groups -> too.
absl::StatusOr<double> EvidenceRetention(
    const std::vector<std::vector<std::vector<int64_t>>>& kept, absl::Span<const Span64> spans);

struct BootstrapOptions {
  int resamples = 2000;     // bootstrap resamples of the case set
  double level = 0.95;      // central interval mass
  uint64_t seed = 0;        // the RNG seed (std::mt19937_64): same seed, same interval
};

struct MeanInterval {
  int count = 0;            // number of values
  double mean = 0;          // their mean (0 when count = 0)
  double lo = 0, hi = 0;    // percentile bootstrap interval of the mean (= mean if count < 2)
};

// The mean of `values` and its percentile bootstrap interval.
MeanInterval BootstrapMeanInterval(absl::Span<const double> values, const BootstrapOptions& options);

}  // namespace echokv::eval

#endif  // ECHOKV_BENCH_EVAL_METRICS_H_
