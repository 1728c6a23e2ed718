// The embedded default model: writes a deterministic tiny random Hugging Face
// checkpoint (config.json, generation_config.json, model.safetensors in F32,
// tokenizer.model trained with SentencePiece on a built-in English text,
// tokenizer_config.json) for llama, mistral (with a small sliding window) or qwen2
// (with q/k/v biases), optionally with rope_scaling linear or llama3 (Llama 3.1 /
// 3.2 style). The same options always give byte-identical files.
//
//   TestModelOptions options;
//   options.arch = "mistral";
//   options.out_dir = "/tmp/tiny-mistral";
//   ECHOKV_RETURN_IF_ERROR(MakeTestModel(options));   // then LoadModelConfig(out_dir) ...
#ifndef ECHOKV_TOOLS_MAKE_TEST_MODEL_H_
#define ECHOKV_TOOLS_MAKE_TEST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace echokv::tools {

struct TestModelOptions {
  std::string arch = "llama";   // "llama", "mistral" or "qwen2"
  std::string out_dir;          // created when missing; files in it are overwritten
  uint64_t seed = 0;            // weights only; the tokenizer does not depend on it
  int layers = 2;               // num_hidden_layers
  int hidden = 64;              // hidden_size
  int heads = 4;                // num_attention_heads
  int kv_heads = 2;             // num_key_value_heads
  int head_dim = 0;             // 0 = hidden / heads (written to config.json when set)
  int intermediate = 128;       // intermediate_size
  int vocab = 320;              // vocab_size = SentencePiece vocabulary size (>= 300)
  int max_pos = 2048;           // max_position_embeddings
  int sliding_window = 16;      // mistral only: config.json "sliding_window"
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  // Write only config.json, generation_config.json and the weights (no tokenizer
  // files): for tests that pair the model with a real tokenizer of `vocab` ids. The
  // vocabulary may then be up to 262144.
  bool weights_only = false;
  // config.json rope_scaling: "" (null), "linear" or "llama3" (written with
  // "rope_type", as Llama 3.1 / 3.2 checkpoints do).
  std::string rope_scaling;
  double rope_factor = 8.0;            // rope_scaling.factor (linear, llama3): >= 1
  double rope_low_freq_factor = 1.0;   // llama3: > 0
  double rope_high_freq_factor = 4.0;  // llama3: > rope_low_freq_factor
  int rope_original_max_pos = 0;       // llama3: original_max_position_embeddings, in [1, max_pos]

  // Ranges and consistency (heads % kv_heads, hidden % heads, even head_dim, size
  // limits); the error names the bad field.
  absl::Status Validate() const;
};

// Writes the model directory. `written` (optional) receives the paths written, in order.
absl::Status MakeTestModel(const TestModelOptions& options,
                           std::vector<std::string>* written = nullptr);

}  // namespace echokv::tools

#endif  // ECHOKV_TOOLS_MAKE_TEST_MODEL_H_
