#include "bench/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"

namespace echokv::eval {
namespace {

// log Σ exp(x_i) in double.
double LogSumExp(absl::Span<const float> x) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

}  // namespace

absl::StatusOr<double> KlFromLogits(absl::Span<const float> p_logits,
                                    absl::Span<const float> q_logits) {
  if (p_logits.empty() || p_logits.size() != q_logits.size()) {
    return absl::InvalidArgumentError(absl::StrCat("logits: sizes differ or are empty (p ",
                                                   p_logits.size(), ", q ", q_logits.size(), ")"));
  }
  for (size_t i = 0; i < p_logits.size(); ++i) {
    if (!std::isfinite(p_logits[i]) || !std::isfinite(q_logits[i])) {
      return absl::InvalidArgumentError(absl::StrCat("logits: non-finite value at index ", i));
    }
  }
  const double zp = LogSumExp(p_logits);
  const double zq = LogSumExp(q_logits);
  double kl = 0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double lp = p_logits[i] - zp;
    const double lq = q_logits[i] - zq;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical inputs
}

int MatchLength(absl::Span<const int> reference, absl::Span<const int> candidate, int cap) {
  const size_t n = std::min({reference.size(), candidate.size(), static_cast<size_t>(std::max(cap, 0))});
  size_t i = 0;
  while (i < n && reference[i] == candidate[i]) ++i;
  return static_cast<int>(i);
}

bool ExactMatch(absl::Span<const int> output, absl::Span<const int> answer) {
  if (answer.empty() || output.size() < answer.size()) return false;
  return std::equal(answer.begin(), answer.end(), output.begin());
}

double SetOverlap(absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  if (b.empty()) return 1.0;
  size_t i = 0, j = 0, common = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++common, ++i, ++j;
    }
  }
  return static_cast<double>(common) / static_cast<double>(b.size());
}

absl::StatusOr<double> EvidenceRetention(
    const std::vector<std::vector<std::vector<int64_t>>>& kept, absl::Span<const Span64> spans) {
  std::set<int64_t> evidence;
  for (const Span64& s : spans) {
    if (s.first < 0 || s.second <= s.first) {
      return absl::InvalidArgumentError(
          absl::StrCat("evidence_spans: [", s.first, ", ", s.second, ") is empty or negative"));
    }
    for (int64_t p = s.first; p < s.second; ++p) evidence.insert(p);
  }
  if (evidence.empty()) return absl::InvalidArgumentError("evidence_spans: no evidence tokens");
  const std::vector<int64_t> ev(evidence.begin(), evidence.end());
  double sum = 0;
  int64_t count = 0;
  for (const auto& layer : kept) {
    for (const auto& group : layer) {
      sum += SetOverlap(group, ev);
      ++count;
    }
  }
  if (count == 0) return absl::InvalidArgumentError("kept: no layers or groups");
  return sum / static_cast<double>(count);
}

MeanInterval BootstrapMeanInterval(absl::Span<const double> values, const BootstrapOptions& options) {
  MeanInterval out;
  out.count = static_cast<int>(values.size());
  if (values.empty()) return out;
  double sum = 0;
  for (double v : values) sum += v;
  out.mean = sum / values.size();
  out.lo = out.hi = out.mean;
  if (values.size() < 2 || options.resamples < 1) return out;
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
  std::vector<double> means(options.resamples);
  for (int r = 0; r < options.resamples; ++r) {
    double s = 0;
    for (size_t i = 0; i < values.size(); ++i) s += values[pick(rng)];
    means[r] = s / values.size();
  }
  std::sort(means.begin(), means.end());
  const double tail = (1.0 - options.level) / 2.0;
  auto at = [&](double q) {
    const double idx = q * (means.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(idx));
    const size_t hi = std::min(lo + 1, means.size() - 1);
    return means[lo] + (idx - lo) * (means[hi] - means[lo]);
  };
  // A percentile interval need not contain the mean for tiny skewed samples; clamp so
  // the reported interval always brackets the point estimate.
  out.lo = std::min(at(tail), out.mean);
  out.hi = std::max(at(1.0 - tail), out.mean);
  return out;
}

}  // namespace echokv::eval
