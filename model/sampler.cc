#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/errors.h"

namespace echokv::model {

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return MakeError(ErrorKind::kInvalidArgument, "temperature",
        absl::StrCat("temperature must be finite and >= 0, got ", temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {  // also rejects NaN
    return MakeError(ErrorKind::kInvalidArgument, "top_p", absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (top_k < 0) {
    return MakeError(ErrorKind::kInvalidArgument, "top_k", absl::StrCat("top_k must be >= 0, got ", top_k));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return MakeError(ErrorKind::kInvalidArgument, "min_p", absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  if (!std::isfinite(repetition_penalty) || !(repetition_penalty > 0.0f)) {
    return MakeError(ErrorKind::kInvalidArgument, "repetition_penalty",
        absl::StrCat("repetition_penalty must be finite and > 0, got ", repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return MakeError(ErrorKind::kInvalidArgument, "presence_penalty",
        absl::StrCat("presence_penalty must be in [-2, 2], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return MakeError(ErrorKind::kInvalidArgument, "frequency_penalty",
        absl::StrCat("frequency_penalty must be in [-2, 2], got ", frequency_penalty));
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return MakeError(ErrorKind::kInvalidArgument, "top_logprobs",
        absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "], got ", top_logprobs));
  }
  if (top_logprobs > 0 && !logprobs) {
    return MakeError(ErrorKind::kInvalidArgument, "top_logprobs",
        absl::StrCat("top_logprobs (", top_logprobs, ") needs logprobs to be true"));
  }
  return absl::OkStatus();
}

bool SamplingParams::HasPenalties() const {
  return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
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

namespace {

// Argmax over doubles without NaN; ties go to the lowest index.
int ArgmaxOf(const std::vector<double>& z) {
  int best = 0;
  for (size_t i = 1; i < z.size(); ++i) {
    if (z[i] > z[best]) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, absl::Span<const int> prompt_ids)
    : params_(params), state_(params.seed) {
  // Only repetition_penalty reads the prompt, and only which ids occur.
  if (params_.repetition_penalty != 1.0f) {
    prompt_ids_.assign(prompt_ids.begin(), prompt_ids.end());
    std::sort(prompt_ids_.begin(), prompt_ids_.end());
    prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
  }
}

double Sampler::NextUniform() {
  // splitmix64 (Steele, Lea, Flood 2014), the top 53 bits as a double in [0, 1).
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

std::vector<double> Sampler::Penalized(absl::Span<const float> logits) const {
  const int64_t v = static_cast<int64_t>(logits.size());
  std::vector<double> z(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    z[i] = std::isnan(logits[i]) ? -INFINITY : static_cast<double>(logits[i]);
  }
  if (!params_.HasPenalties()) return z;
  // Repetition: each distinct id of prompt + generated once (HF gathers and scatters
  // the same value for repeated ids; vLLM uses a mask).
  if (params_.repetition_penalty != 1.0f) {
    const double rp = params_.repetition_penalty;
    auto penalize = [&](int id) {
      double& x = z[id];
      x = x > 0 ? x / rp : x * rp;
    };
    for (int id : prompt_ids_) {
      if (id >= 0 && id < v) penalize(id);
    }
    for (const auto& [id, count] : counts_) {
      if (id >= 0 && id < v && !std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) {
        penalize(id);
      }
    }
  }
  // OpenAI: mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty.
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : counts_) {
      if (id < 0 || id >= v) continue;
      z[id] -= static_cast<double>(params_.frequency_penalty) * count +
               static_cast<double>(params_.presence_penalty);
    }
  }
  return z;
}

Sampler::Candidates Sampler::Prepare(absl::Span<const float> logits) const {
  Candidates c;
  if (params_.temperature <= 0.0f) {
    // Without penalties exactly the plain argmax of the raw logits (the behaviour
    // before penalties existed).
    c.ids.push_back(params_.HasPenalties() ? ArgmaxOf(Penalized(logits)) : Argmax(logits));
    c.weights.push_back(1.0);
    c.total = 1.0;
    return c;
  }
  const std::vector<double> z = Penalized(logits);
  const int greedy = ArgmaxOf(z);
  const double max_z = z[greedy];
  if (!std::isfinite(max_z)) {  // +inf, or every logit -inf/NaN: no distribution
    c.ids.push_back(greedy);
    c.weights.push_back(1.0);
    c.total = 1.0;
    return c;
  }

  // Candidates in descending order, ties by lower id (the order top-k and top-p cut
  // in). Without a cut, id order is enough.
  const bool cut = params_.top_k > 0 || params_.top_p < 1.0f;
  c.draw = true;  // even when the cuts leave one candidate, as the sequence always did
  std::vector<int>& order = c.ids;
  order.resize(z.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&z](int a, int b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < order.size()) {
    const size_t keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
    order.resize(keep);
  } else if (cut) {
    std::sort(order.begin(), order.end(), before);
  }

  // Unnormalised softmax(z / T) over the kept candidates, in double; the maximum has
  // weight exactly 1.
  const double inv_t = 1.0 / static_cast<double>(params_.temperature);
  std::vector<double>& weights = c.weights;
  weights.resize(order.size());
  double total = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    const double w = std::exp((z[order[i]] - max_z) * inv_t);
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

  // min-p: p_i < min_p * p_max  <=>  w_i < min_p * w_max, and w_max = 1 (the maximum
  // survives top-k and top-p). Dropped candidates keep a zero weight, never drawn.
  if (params_.min_p > 0.0f) {
    const double threshold = static_cast<double>(params_.min_p);
    total = 0.0;
    for (double& w : weights) {
      if (w < threshold) w = 0.0;
      total += w;
    }
  }
  c.total = total;
  return c;
}

std::vector<double> Sampler::Probabilities(absl::Span<const float> logits) const {
  std::vector<double> p(logits.size(), 0.0);
  if (logits.empty()) return p;
  const Candidates c = Prepare(logits);
  for (size_t i = 0; i < c.ids.size(); ++i) p[c.ids[i]] += c.weights[i] / c.total;
  return p;
}

void Sampler::FillLogprobs(absl::Span<const float> logits, SampledToken* out) const {
  // Raw log_softmax in double; NaN counts as -inf (probability 0).
  auto value = [&logits](size_t i) {
    return std::isnan(logits[i]) ? -INFINITY : static_cast<double>(logits[i]);
  };
  double max = -INFINITY;
  for (size_t i = 0; i < logits.size(); ++i) max = std::max(max, value(i));
  double lse;
  if (std::isinf(max)) {
    // Every logit -inf (all probabilities 0) or some +inf (all mass on those):
    // log_softmax is -inf everywhere, or 0 at the +inf ones shared equally.
    lse = max;
    if (max > 0) {
      int n_inf = 0;
      for (size_t i = 0; i < logits.size(); ++i) n_inf += value(i) == max;
      lse = std::log(static_cast<double>(n_inf));
    }
  } else {
    double sum = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) sum += std::exp(value(i) - max);
    lse = max + std::log(sum);
  }
  auto logprob = [&](size_t i) -> double {
    const double l = value(i);
    if (std::isinf(max) && max > 0) return l == max ? -lse : -INFINITY;
    if (l == -INFINITY) return -INFINITY;
    return l - lse;
  };
  out->logprob = static_cast<float>(logprob(static_cast<size_t>(out->token)));
  if (params_.top_logprobs <= 0) return;
  std::vector<int> ids;
  ids.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logprob(i) != -INFINITY) ids.push_back(static_cast<int>(i));
  }
  const size_t k = std::min(ids.size(), static_cast<size_t>(params_.top_logprobs));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
    const double va = value(a), vb = value(b);
    return va > vb || (va == vb && a < b);
  });
  out->top_logprobs.clear();
  for (size_t i = 0; i < k; ++i) {
    out->top_logprobs.push_back({ids[i], static_cast<float>(logprob(ids[i]))});
  }
}

SampledToken Sampler::Next(absl::Span<const float> logits) {
  SampledToken out;
  if (logits.empty()) return out;
  const Candidates c = Prepare(logits);
  out.token = c.ids[0];
  if (c.draw) {
    const double u = NextUniform() * c.total;
    double acc = 0.0;
    bool drawn = false;
    for (size_t i = 0; i < c.weights.size(); ++i) {
      acc += c.weights[i];
      if (u < acc) {
        out.token = c.ids[i];
        drawn = true;
        break;
      }
    }
    if (!drawn) {
      // Rounding left u at the very top: the last candidate with non-zero weight.
      for (size_t i = c.weights.size(); i > 0; --i) {
        if (c.weights[i - 1] > 0.0) {
          out.token = c.ids[i - 1];
          break;
        }
      }
    }
  }
  if (params_.logprobs) FillLogprobs(logits, &out);
  generated_.push_back(out.token);
  ++counts_[out.token];
  return out;
}

int Sampler::Sample(absl::Span<const float> logits) { return Next(logits).token; }

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
