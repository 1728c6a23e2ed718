#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace echokv::model {

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be finite and >= 0, got ", temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {  // also rejects NaN
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  }
  return absl::OkStatus();
}

int Argmax(absl::Span<const float> logits) {
  int best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;  // NaN never wins
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int>(i);
  }
  // All NaN (or empty): fall back to 0 so callers always get a valid id when V > 0.
  if (best < 0 && !logits.empty()) best = 0;
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), state_(params.seed) {}

double Sampler::NextUniform() {
  // splitmix64 (Steele, Lea, Flood 2014), the top 53 bits as a double in [0, 1).
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int Sampler::Sample(absl::Span<const float> logits) {
  if (logits.empty()) return -1;
  if (params_.temperature <= 0.0f) return Argmax(logits);

  const int greedy = Argmax(logits);
  const float max_logit = logits[greedy];
  if (!std::isfinite(max_logit)) return greedy;  // +inf (or all -inf/NaN): no distribution

  // Candidates in descending logit order, ties by lower id (the order top-k and top-p
  // cut in). Without a cut, id order is enough.
  const bool cut = params_.top_k > 0 || params_.top_p < 1.0f;
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&logits](int a, int b) {
    const float la = std::isnan(logits[a]) ? -INFINITY : logits[a];
    const float lb = std::isnan(logits[b]) ? -INFINITY : logits[b];
    return la > lb || (la == lb && a < b);
  };
  size_t keep = order.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < order.size()) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
    order.resize(keep);
  } else if (cut) {
    std::sort(order.begin(), order.end(), before);
  }

  // Unnormalised softmax(logits / T) over the kept candidates, in double.
  const double inv_t = 1.0 / static_cast<double>(params_.temperature);
  std::vector<double> weights(order.size());
  double total = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    const float l = logits[order[i]];
    const double w = std::isnan(l) ? 0.0 : std::exp((static_cast<double>(l) - max_logit) * inv_t);
    weights[i] = w;
    total += w;
  }

  // Nucleus: the smallest prefix (highest probabilities first) whose mass >= top_p.
  if (params_.top_p < 1.0f) {
    const double target = static_cast<double>(params_.top_p) * total;
    double mass = 0.0;
    size_t n = 0;
    while (n < weights.size()) {
      mass += weights[n];
      ++n;
      if (mass >= target) break;
    }
    weights.resize(n);
    order.resize(n);
    total = mass;
  }

  const double u = NextUniform() * total;
  double acc = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) {
    acc += weights[i];
    if (u < acc) return order[i];
  }
  // Rounding left u at the very top: the last candidate with non-zero weight.
  for (size_t i = weights.size(); i > 0; --i) {
    if (weights[i - 1] > 0.0) return order[i - 1];
  }
  return greedy;
}

absl::string_view StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kNone:
      return "none";
    case StopReason::kLength:
      return "length";
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopId:
      return "stop_id";
  }
  return "unknown";
}

StopReason StopCriteria::Check(int token, int generated) const {
  if (std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) return StopReason::kEos;
  if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
    return StopReason::kStopId;
  }
  if (generated >= max_tokens) return StopReason::kLength;
  return StopReason::kNone;
}

}  // namespace echokv::model
