// Token sampling (torch-free): greedy, temperature, top-k, top-p, deterministic for
// a seed; and the stop rule of a generation.
//
//   SamplingParams p; p.temperature = 0.8f; p.top_p = 0.9f; p.seed = 42;
//   ECHOKV_RETURN_IF_ERROR(p.Validate());
//   Sampler sampler(p);
//   int next = sampler.Sample(logits);            // logits: V floats
#ifndef ECHOKV_MODEL_SAMPLER_H_
#define ECHOKV_MODEL_SAMPLER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace echokv::model {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, ties -> lowest id)
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  int top_k = 0;             // 0 = no top-k cut
  uint64_t seed = 0;
  absl::Status Validate() const;  // names the bad field
};

// Index of the largest value; ties go to the lowest index.
int Argmax(absl::Span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from `logits` (V floats). Deterministic for (seed, logits sequence).
  int Sample(absl::Span<const float> logits);

 private:
  double NextUniform();    // [0, 1) from the generator below
  SamplingParams params_;  // validated by the caller
  uint64_t state_;         // splitmix64 state, seeded from params_.seed
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
