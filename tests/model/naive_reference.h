// An independent, deliberately naive float64 reference of the Llama-family forward
// pass for tests: per-position, per-head loops, no batching, no KV cache, no torch.
// It reads weights as plain double vectors keyed by Hugging Face tensor names.
//
//   NaiveModel ref = MakeRandomModel(cfg, /*seed=*/1);   // also writes safetensors
//   std::vector<std::vector<double>> logits = ref.Forward(tokens, /*mask=*/nullptr);
#ifndef ECHOKV_TESTS_MODEL_NAIVE_REFERENCE_H_
#define ECHOKV_TESTS_MODEL_NAIVE_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace echokv::testing {

// allowed(layer, kv_group, query_index, key_index): may the query at sequence index
// query_index read key key_index (key_index <= query_index always holds)? nullptr =
// plain causal (plus the model's sliding window).
using NaiveMask = std::function<bool(int, int, int, int)>;

struct NaiveModel {
  model::ModelConfig config;
  std::map<std::string, std::vector<double>> weights;  // HF name -> row-major values
  // RoPE inverse frequencies [d/2] supplied by the test (e.g. a rope_scaling formula
  // evaluated in double); the reference ignores config.rope_scaling. Each is rounded
  // to float32 and angles are float32(pos * inv) as the runtime's convention.
  // Empty: theta^(-2i/d) by HF's float32 recipe.
  std::vector<double> rope_inv_freq;

  // Logits [T][V] at every position 0..T-1 for tokens at positions 0..T-1.
  std::vector<std::vector<double>> Forward(const std::vector<int>& tokens, const NaiveMask& mask) const;
};

// Random weights (normal * scale, norms around 1) for `config`, deterministic in `seed`.
NaiveModel MakeRandomModel(const model::ModelConfig& config, uint32_t seed);

// Writes config.json (with m.config.rope_scaling) and model.safetensors (float32) for
// `m` into `dir`.
void WriteModelDir(const NaiveModel& m, const std::string& dir);

// A tiny config of the given family: llama (GQA), mistral (sliding window 5),
// qwen2 (q/k/v biases).
model::ModelConfig TinyConfig(model::ModelType type);

}  // namespace echokv::testing

#endif  // ECHOKV_TESTS_MODEL_NAIVE_REFERENCE_H_
