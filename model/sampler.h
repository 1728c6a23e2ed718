// Token sampling (torch-free): greedy, temperature, top-k, top-p, min-p, repetition /
// presence / frequency penalties, log-probabilities of the chosen token and of the
// most likely alternatives; deterministic for a seed. And the stop rule of a generation.
//
//   SamplingParams p; p.temperature = 0.8f; p.top_p = 0.9f; p.seed = 42;
//   p.repetition_penalty = 1.1f; p.logprobs = true; p.top_logprobs = 5;
//   ECHOKV_RETURN_IF_ERROR(p.Validate());
//   Sampler sampler(p, prompt_ids);               // the ids the generation continues
//   SampledToken t = sampler.Next(logits);        // logits: V floats; t.token, t.logprob
//
// Semantics (docs/API.md "Sampling semantics" is the reference for clients). For each
// step, with l the model's raw logits of the next token:
//   1. Penalties (skipped when all are neutral), in double:
//      repetition (HF / vLLM): for every distinct id in prompt_ids or generated so far,
//        l = l / repetition_penalty if l > 0, else l * repetition_penalty;
//      presence / frequency (OpenAI / vLLM; generated tokens only, the prompt does not
//        count): l -= frequency_penalty * count + presence_penalty * (count > 0).
//   2. temperature == 0: the argmax of the penalized logits (ties -> lowest id); the
//      steps below do not apply (they never change the argmax).
//   3. Temperature: p ∝ exp(l / temperature).
//   4. top-k: the k highest (ties -> lower id); then top-p: the smallest prefix, highest
//      first, whose renormalized mass >= top_p; then min-p: drop tokens with
//      p < min_p * p_max (the order of vLLM's sampler and of HF's warpers).
//   5. Draw from the renormalized remainder with the seeded generator.
// Log-probabilities are the model's raw ones: log_softmax(l) of step 1's input, before
// penalties, temperature and truncation (as OpenAI reports them and vLLM does by
// default), so they describe the model, not the sampling settings.
#ifndef ECHOKV_MODEL_SAMPLER_H_
#define ECHOKV_MODEL_SAMPLER_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace echokv::model {

// The most alternatives top_logprobs may ask for (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;

struct SamplingParams {
  float temperature = 0.0f;         // >= 0; 0 = greedy (argmax, ties -> lowest id)
  float top_p = 1.0f;               // nucleus mass in (0, 1]; 1 = off
  int top_k = 0;                    // >= 0; 0 = off
  float min_p = 0.0f;               // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off; prompt and generated ids
  float presence_penalty = 0.0f;    // [-2, 2]; 0 = off; generated ids only
  float frequency_penalty = 0.0f;   // [-2, 2]; 0 = off; generated ids only
  bool logprobs = false;            // report the chosen token's raw log-probability
  int top_logprobs = 0;             // [0, 20] raw alternatives per token; needs logprobs
  uint64_t seed = 0;
  // Ranges above (NaN and infinities refused); the error names the field.
  absl::Status Validate() const;
  // Whether any of the three penalties is not neutral.
  bool HasPenalties() const;
};

// Index of the largest value; ties go to the lowest index.
int Argmax(absl::Span<const float> logits);

struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;  // natural log, <= 0
};

struct SampledToken {
  int token = -1;  // -1 only for empty logits
  // With SamplingParams::logprobs: log_softmax(raw logits)[token]; -inf only when every
  // logit is -inf or NaN. 0 otherwise.
  float logprob = 0.0f;
  // With top_logprobs = k: the k tokens of highest raw log-probability, highest first
  // (ties: lower id first); tokens of probability 0 (-inf or NaN logits) are left out,
  // so fewer than k when fewer have a non-zero probability. The chosen token appears
  // only when it is among them.
  std::vector<TokenLogprob> top_logprobs;
};

// One generation's sampler: owns the seeded generator and the token history the
// penalties need. Not thread-safe (the engine thread owns it).
class Sampler {
 public:
  // `params` must be valid (Validate()). `prompt_ids`: the ids the generation continues
  // (for a session: every token appended to it, kept by compression or not); only
  // repetition_penalty reads them. Ids outside [0, V) are ignored at each step.
  explicit Sampler(const SamplingParams& params, absl::Span<const int> prompt_ids = {});

  // Picks the next token from `logits` (V floats, the model's raw logits), records it
  // as generated (it counts for the penalties of later steps) and reports its
  // log-probabilities as asked. Deterministic for (params, prompt_ids, logits sequence).
  SampledToken Next(absl::Span<const float> logits);
  // Next(logits).token.
  int Sample(absl::Span<const float> logits);

  // The distribution Next would draw from now (V probabilities summing to 1; one-hot
  // for greedy), without drawing or recording anything. For tests and diagnostics.
  std::vector<double> Probabilities(absl::Span<const float> logits) const;

  // Every token Next has returned, in order.
  const std::vector<int>& generated() const { return generated_; }

 private:
  // The candidates of one step: ids with unnormalized weights (greedy: one id).
  struct Candidates {
    bool draw = false;  // false: ids[0] without consuming the generator (greedy)
    std::vector<int> ids;
    std::vector<double> weights;
    double total = 0.0;
  };
  Candidates Prepare(absl::Span<const float> logits) const;
  // l after step 1 (penalties), in double; NaN becomes -inf.
  std::vector<double> Penalized(absl::Span<const float> logits) const;
  void FillLogprobs(absl::Span<const float> logits, SampledToken* out) const;
  double NextUniform();  // [0, 1) from the generator below

  SamplingParams params_;                  // validated by the caller
  uint64_t state_;                         // splitmix64 state, seeded from params_.seed
  std::vector<int> prompt_ids_;            // distinct prompt ids, ascending
  std::vector<int> generated_;             // every token returned by Next, in order
  std::unordered_map<int, int> counts_;    // generated token -> times generated
};

enum class StopReason { kNone, kLength, kEos, kStopId };
absl::string_view StopReasonName(StopReason reason);  // "none", "length", "eos", "stop_id"

struct StopCriteria {
  int max_tokens = 128;
  std::vector<int> eos_ids;   // the model's end-of-sequence ids
  std::vector<int> stop_ids;  // extra ids from the user
  // After `generated` tokens whose last is `token`: why to stop, or kNone.
  // An eos/stop id ends the generation and is not part of the output.
  StopReason Check(int token, int generated) const;
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_SAMPLER_H_
