// echokv-make-test-model: writes a deterministic tiny random Llama / Mistral / Qwen2
// checkpoint with its own SentencePiece tokenizer (see tools/make_test_model.h).
//
//   echokv-make-test-model --arch mistral --out /tmp/tiny-mistral --seed 1
//   echokv-make-test-model --out /tmp/tiny-llama3 --rope_scaling llama3 --rope_factor 8
//       --rope_original_max_pos 256 --max_pos 2048 --tie_word_embeddings   (one line)
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"
#include "tools/make_test_model.h"

ABSL_FLAG(std::string, arch, "llama", "llama, mistral or qwen2");
ABSL_FLAG(std::string, out, "", "output directory (created when missing)");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights");
ABSL_FLAG(int, layers, 2, "num_hidden_layers");
ABSL_FLAG(int, hidden, 64, "hidden_size");
ABSL_FLAG(int, heads, 4, "num_attention_heads");
ABSL_FLAG(int, kv_heads, 2, "num_key_value_heads");
ABSL_FLAG(int, head_dim, 0, "head_dim (0 = hidden / heads, not written to config.json)");
ABSL_FLAG(int, intermediate, 128, "intermediate_size");
ABSL_FLAG(int, vocab, 320, "vocab_size, also the SentencePiece vocabulary size (>= 300)");
ABSL_FLAG(int, max_pos, 2048, "max_position_embeddings");
ABSL_FLAG(int, sliding_window, 16, "Mistral's sliding_window (mistral only)");
ABSL_FLAG(double, rope_theta, 10000.0, "rope_theta");
ABSL_FLAG(double, rms_norm_eps, 1e-5, "rms_norm_eps");
ABSL_FLAG(bool, tie_word_embeddings, false, "tie lm_head to the embeddings");
ABSL_FLAG(std::string, rope_scaling, "", "config.json rope_scaling: empty (null), linear or llama3");
ABSL_FLAG(double, rope_factor, 8.0, "rope_scaling.factor (linear, llama3)");
ABSL_FLAG(double, rope_low_freq_factor, 1.0, "rope_scaling.low_freq_factor (llama3)");
ABSL_FLAG(double, rope_high_freq_factor, 4.0, "rope_scaling.high_freq_factor (llama3)");
ABSL_FLAG(int, rope_original_max_pos, 0,
          "rope_scaling.original_max_position_embeddings (llama3; required, <= --max_pos)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a deterministic tiny random checkpoint + tokenizer.\n"
      "  echokv-make-test-model --arch llama|mistral|qwen2 --out DIR [--seed N] ...\n"
      "  [--rope_scaling linear|llama3 --rope_factor F --rope_low_freq_factor L\n"
      "   --rope_high_freq_factor H --rope_original_max_pos N]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  echokv::InitLogging(argv[0]);
  if (rest.size() > 1) {
    std::cerr << "echokv-make-test-model: unexpected argument \"" << rest[1] << "\"\n";
    return 2;
  }
  echokv::tools::TestModelOptions options;
  options.arch = absl::GetFlag(FLAGS_arch);
  options.out_dir = absl::GetFlag(FLAGS_out);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.layers = absl::GetFlag(FLAGS_layers);
  options.hidden = absl::GetFlag(FLAGS_hidden);
  options.heads = absl::GetFlag(FLAGS_heads);
  options.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  options.head_dim = absl::GetFlag(FLAGS_head_dim);
  options.intermediate = absl::GetFlag(FLAGS_intermediate);
  options.vocab = absl::GetFlag(FLAGS_vocab);
  options.max_pos = absl::GetFlag(FLAGS_max_pos);
  options.sliding_window = absl::GetFlag(FLAGS_sliding_window);
  options.rope_theta = absl::GetFlag(FLAGS_rope_theta);
  options.rms_norm_eps = absl::GetFlag(FLAGS_rms_norm_eps);
  options.tie_word_embeddings = absl::GetFlag(FLAGS_tie_word_embeddings);
  options.rope_scaling = absl::GetFlag(FLAGS_rope_scaling);
  options.rope_factor = absl::GetFlag(FLAGS_rope_factor);
  options.rope_low_freq_factor = absl::GetFlag(FLAGS_rope_low_freq_factor);
  options.rope_high_freq_factor = absl::GetFlag(FLAGS_rope_high_freq_factor);
  options.rope_original_max_pos = absl::GetFlag(FLAGS_rope_original_max_pos);
  if (options.out_dir.empty()) {
    std::cerr << "echokv-make-test-model: --out is required\n";
    return 2;
  }
  std::vector<std::string> written;
  absl::Status status = echokv::tools::MakeTestModel(options, &written);
  if (!status.ok()) {
    std::cerr << "echokv-make-test-model: " << status << "\n";
    return 1;
  }
  for (const std::string& path : written) std::cout << "wrote " << path << "\n";
  std::cout << "random " << options.arch << " test model (seed " << options.seed
            << ") in " << options.out_dir << ": its weights are random, so any text it "
            << "generates is meaningless\n";
  return 0;
}
