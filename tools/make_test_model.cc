#include "tools/make_test_model.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "model/safetensors.h"
#include "model/sentencepiece_tokenizer.h"
#include "nlohmann/json.hpp"

namespace echokv::tools {
namespace {

using ::nlohmann::ordered_json;

// Largest checkpoint the tool builds in memory (elements, 4 bytes each).
constexpr int64_t kMaxParameters = int64_t{1} << 29;
// Fixed seed of the built-in corpus: the tokenizer is the same for every --seed.
constexpr uint64_t kCorpusSeed = 0x5EED0F5EEDULL;
constexpr int kCorpusSentences = 600;
// Most pieces trained from the corpus (it supports ~840); the rest are padding.
constexpr int kMaxTrainedVocab = 640;
constexpr double kPi = 3.14159265358979323846;

// splitmix64: a tiny, well-mixed, fully specified generator (same bits everywhere).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller (the cosine branch only, so one draw = two uniforms).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]: log is finite
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;  // advanced by the golden-ratio increment on every draw
};

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ULL;
  }
  return h;
}

// How a tensor is initialised.
enum class Init { kNormal, kNorm, kBias };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
};

std::vector<TensorSpec> TensorSpecs(const TestModelOptions& o) {
  const int64_t d = o.hidden;
  const int64_t hd = o.head_dim > 0 ? o.head_dim : o.hidden / o.heads;
  const int64_t q = o.heads * hd;
  const int64_t kv = o.kv_heads * hd;
  const int64_t inter = o.intermediate;
  const bool qkv_bias = o.arch == "qwen2";
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {o.vocab, d}, Init::kNormal});
  for (int i = 0; i < o.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", {d}, Init::kNorm});
    specs.push_back({p + "self_attn.q_proj.weight", {q, d}, Init::kNormal});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, d}, Init::kNormal});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, d}, Init::kNormal});
    if (qkv_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q}, Init::kBias});
      specs.push_back({p + "self_attn.k_proj.bias", {kv}, Init::kBias});
      specs.push_back({p + "self_attn.v_proj.bias", {kv}, Init::kBias});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {d, q}, Init::kNormal});
    specs.push_back({p + "post_attention_layernorm.weight", {d}, Init::kNorm});
    specs.push_back({p + "mlp.gate_proj.weight", {inter, d}, Init::kNormal});
    specs.push_back({p + "mlp.up_proj.weight", {inter, d}, Init::kNormal});
    specs.push_back({p + "mlp.down_proj.weight", {d, inter}, Init::kNormal});
  }
  specs.push_back({"model.norm.weight", {d}, Init::kNorm});
  if (!o.tie_word_embeddings) specs.push_back({"lm_head.weight", {o.vocab, d}, Init::kNormal});
  return specs;
}

void AppendFloatLe(float value, std::string* out) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  for (int b = 0; b < 4; ++b) out->push_back(static_cast<char>((bits >> (8 * b)) & 0xFF));
}

// Deterministic values for one tensor: its own generator seeded by (seed, name), so
// values do not depend on the order tensors are made in.
model::TensorToWrite MakeTensor(const TensorSpec& spec, uint64_t seed) {
  int64_t count = 1;
  for (int64_t dim : spec.shape) count *= dim;
  const int64_t fan_in = spec.shape.size() == 2 ? spec.shape[1] : spec.shape[0];
  double scale = 0.0;
  switch (spec.init) {
    case Init::kNormal:
      // ~1/(2 sqrt(fan_in)), kept in [0.02, 0.1] so activations stay of order one.
      scale = std::min(0.1, std::max(0.02, 0.5 / std::sqrt(static_cast<double>(fan_in))));
      break;
    case Init::kNorm:
      scale = 0.05;  // around 1.0, see below
      break;
    case Init::kBias:
      scale = 0.02;
      break;
  }
  SplitMix64 rng(seed ^ Fnv1a(spec.name));
  model::TensorToWrite t;
  t.name = spec.name;
  t.dtype = model::DType::kF32;
  t.shape = spec.shape;
  t.bytes.reserve(static_cast<size_t>(count) * 4);
  for (int64_t i = 0; i < count; ++i) {
    double v = rng.Normal() * scale;
    if (spec.init == Init::kNorm) v += 1.0;
    AppendFloatLe(static_cast<float>(v), &t.bytes);
  }
  return t;
}

// A few hundred simple English sentences from fixed word lists (TinyStories-like, so
// "Once upon a time" tokenizes into real pieces). Letters and . , ! ? " only.
std::string MakeCorpus() {
  const std::vector<std::string> names = {"Lily", "Tom", "Sam", "Mia", "Ben", "Anna",
                                          "Max", "Sue", "Tim", "Kate", "Bob", "Lucy"};
  const std::vector<std::string> adjs = {"little", "big",   "happy", "red",   "shiny",
                                         "small",  "kind",  "funny", "sunny", "green",
                                         "soft",   "brave", "quiet", "blue",  "warm"};
  const std::vector<std::string> nouns = {"dog",  "cat",  "ball", "bird", "tree",  "box",
                                          "girl", "boy",  "fish", "cake", "toy",   "car",
                                          "frog", "hat",  "boat", "book", "flower"};
  const std::vector<std::string> verbs = {"play",  "run",  "jump", "sing", "read",
                                          "dance", "swim", "draw", "help", "look"};
  const std::vector<std::string> places = {"park",   "garden", "house", "forest", "sky",
                                           "river",  "school", "town",  "sea",    "hill"};
  SplitMix64 rng(kCorpusSeed);
  auto pick = [&rng](const std::vector<std::string>& words) -> const std::string& {
    return words[rng.Below(words.size())];
  };
  std::string corpus;
  for (int i = 0; i < kCorpusSentences; ++i) {
    const std::string& name = pick(names);
    const std::string& name2 = pick(names);
    const std::string& adj = pick(adjs);
    const std::string& noun = pick(nouns);
    const std::string& verb = pick(verbs);
    const std::string& place = pick(places);
    switch (rng.Below(12)) {
      case 0:
        absl::StrAppend(&corpus, "Once upon a time, there was a ", adj, " ", noun, " named ",
                        name, ".");
        break;
      case 1:
        absl::StrAppend(&corpus, name, " liked to ", verb, " in the ", place, ".");
        break;
      case 2:
        absl::StrAppend(&corpus, "One day, ", name, " saw a ", adj, " ", noun, " near the ",
                        place, ".");
        break;
      case 3:
        absl::StrAppend(&corpus, name, " and ", name2, " went to the ", place, " to ", verb, ".");
        break;
      case 4:
        absl::StrAppend(&corpus, "\"Let's ", verb, " together!\" said ", name, ".");
        break;
      case 5:
        absl::StrAppend(&corpus, "The ", noun, " was very ", adj, ", and ", name,
                        " was happy.");
        break;
      case 6:
        absl::StrAppend(&corpus, name, " asked, \"Can we ", verb, " in the ", place,
                        " today?\"");
        break;
      case 7:
        absl::StrAppend(&corpus, "They played with the ", adj, " ", noun, " all day long.");
        break;
      case 8:
        absl::StrAppend(&corpus, "At the end of the day, ", name, " went home and slept.");
        break;
      case 9:
        absl::StrAppend(&corpus, name, " found a ", noun, " under the ", adj, " tree.");
        break;
      case 10:
        absl::StrAppend(&corpus, "It was a ", adj, " day, so ", name, " wanted to ", verb, ".");
        break;
      case 11:
        absl::StrAppend(&corpus, "She smiled at the ", noun, " and said, \"Thank you!\"");
        break;
    }
    corpus += "\n";
  }
  return corpus;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, " for writing"));
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

std::string ConfigJson(const TestModelOptions& o) {
  ordered_json c;
  if (o.arch == "llama") {
    c["architectures"] = {"LlamaForCausalLM"};
  } else if (o.arch == "mistral") {
    c["architectures"] = {"MistralForCausalLM"};
  } else {
    c["architectures"] = {"Qwen2ForCausalLM"};
  }
  c["model_type"] = o.arch;
  c["vocab_size"] = o.vocab;
  c["hidden_size"] = o.hidden;
  c["intermediate_size"] = o.intermediate;
  c["num_hidden_layers"] = o.layers;
  c["num_attention_heads"] = o.heads;
  c["num_key_value_heads"] = o.kv_heads;
  if (o.head_dim > 0) c["head_dim"] = o.head_dim;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = o.max_pos;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = o.rms_norm_eps;
  c["rope_theta"] = o.rope_theta;
  if (o.rope_scaling == "linear") {
    c["rope_scaling"] = {{"factor", o.rope_factor}, {"rope_type", "linear"}};
  } else if (o.rope_scaling == "llama3") {
    c["rope_scaling"] = {{"factor", o.rope_factor},
                         {"high_freq_factor", o.rope_high_freq_factor},
                         {"low_freq_factor", o.rope_low_freq_factor},
                         {"original_max_position_embeddings", o.rope_original_max_pos},
                         {"rope_type", "llama3"}};
  } else if (o.arch != "mistral") {
    c["rope_scaling"] = nullptr;
  }
  if (o.arch == "llama") {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  } else if (o.arch == "mistral") {
    c["sliding_window"] = o.sliding_window;
  } else {
    c["use_sliding_window"] = false;
    c["sliding_window"] = o.max_pos;
    c["max_window_layers"] = o.layers;
  }
  c["attention_dropout"] = 0.0;
  c["tie_word_embeddings"] = o.tie_word_embeddings;
  c["bos_token_id"] = 1;
  c["eos_token_id"] = 2;
  c["torch_dtype"] = "float32";
  c["use_cache"] = true;
  c["transformers_version"] = "4.44.0";
  return c.dump(2) + "\n";
}

std::string GenerationConfigJson() {
  ordered_json g;
  g["_from_model_config"] = true;
  g["bos_token_id"] = 1;
  g["eos_token_id"] = 2;
  g["transformers_version"] = "4.44.0";
  return g.dump(2) + "\n";
}

std::string TokenizerConfigJson(const TestModelOptions& o) {
  ordered_json t;
  t["tokenizer_class"] = "LlamaTokenizer";
  t["add_bos_token"] = true;
  t["add_eos_token"] = false;
  t["bos_token"] = "<s>";
  t["eos_token"] = "</s>";
  t["unk_token"] = "<unk>";
  t["pad_token"] = nullptr;
  t["legacy"] = true;
  t["clean_up_tokenization_spaces"] = false;
  t["model_max_length"] = o.max_pos;
  return t.dump(2) + "\n";
}

std::string Readme(const TestModelOptions& o) {
  return absl::StrCat(
      "# Random test model (", o.arch, ")\n\n",
      "Written by echokv-make-test-model with seed ", o.seed,
      ". The weights are random: any text this model generates is meaningless.\n"
      "It exists so loaders, shapes and the runtime can be tested without downloads.\n");
}

// Trains tokenizer.model into `out_dir` from the built-in corpus.
absl::Status TrainTokenizer(const TestModelOptions& o, const std::string& out_dir) {
  std::string tmp_root = GetEnv("TMPDIR").value_or("/tmp");
  std::string pattern = tmp_root + "/echokv-make-test-model-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory from ", pattern,
                                            ": ", std::strerror(errno)));
  }
  const std::string tmp(buffer.data());
  struct Remover {
    std::string path;
    ~Remover() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remover{tmp};
  if (tmp.find_first_of(" \t\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temporary directory ", tmp, " contains whitespace (SentencePiece flags cannot hold it); "
        "set TMPDIR to another directory"));
  }
  // The built-in corpus supports a few hundred BPE merges; a larger vocabulary is
  // padded with user-defined pieces <extra_0>, <extra_1>, ... so that the tokenizer
  // still has exactly `vocab` pieces (random models may emit any id).
  std::string extra;
  if (o.vocab > kMaxTrainedVocab) {
    extra = " --user_defined_symbols=";
    for (int i = 0; i < o.vocab - kMaxTrainedVocab; ++i) {
      absl::StrAppend(&extra, i == 0 ? "" : ",", "<extra_", i, ">");
    }
  }
  const std::string corpus_path = tmp + "/corpus.txt";
  ECHOKV_RETURN_IF_ERROR(WriteFile(corpus_path, MakeCorpus()));
  const std::string args = absl::StrCat(
      "--input=", corpus_path, " --model_prefix=", tmp, "/tokenizer", " --model_type=bpe",
      " --vocab_size=", o.vocab,
      " --byte_fallback=true --character_coverage=1.0 --split_digits=true",
      " --normalization_rule_name=identity --add_dummy_prefix=true",
      " --remove_extra_whitespaces=false --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1",
      " --input_sentence_size=0 --shuffle_input_sentence=false --num_threads=1", extra);
  absl::Status trained = model::TrainSentencePiece(args);
  if (!trained.ok()) {
    return absl::Status(trained.code(),
                        absl::StrCat("training the tokenizer with vocab ", o.vocab,
                                     " failed: ", trained.message()));
  }
  std::error_code ec;
  std::filesystem::copy_file(tmp + "/tokenizer.model", out_dir + "/tokenizer.model",
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot copy tokenizer.model to ", out_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TestModelOptions::Validate() const {
  auto bad = [](absl::string_view field, auto value, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", rule, ", got ", value));
  };
  if (arch != "llama" && arch != "mistral" && arch != "qwen2") {
    return absl::InvalidArgumentError(
        absl::StrCat("arch must be llama, mistral or qwen2, got \"", arch, "\""));
  }
  if (out_dir.empty()) return absl::InvalidArgumentError("out_dir must be set");
  if (layers < 1 || layers > 256) return bad("layers", layers, "must be in [1, 256]");
  if (hidden < 2 || hidden > 16384) return bad("hidden", hidden, "must be in [2, 16384]");
  if (heads < 1 || heads > 1024) return bad("heads", heads, "must be in [1, 1024]");
  if (kv_heads < 1 || kv_heads > heads) return bad("kv_heads", kv_heads, "must be in [1, heads]");
  if (heads % kv_heads != 0) return bad("kv_heads", kv_heads, "must divide heads");
  if (head_dim < 0 || head_dim > 1024) return bad("head_dim", head_dim, "must be in [0, 1024]");
  if (head_dim == 0 && hidden % heads != 0) {
    return bad("hidden", hidden, "must be a multiple of heads (or set head_dim)");
  }
  const int hd = head_dim > 0 ? head_dim : hidden / heads;
  if (hd % 2 != 0) return bad("head_dim", hd, "must be even (rotary embeddings)");
  if (intermediate < 1 || intermediate > 65536) {
    return bad("intermediate", intermediate, "must be in [1, 65536]");
  }
  if (vocab < 300 || vocab > (weights_only ? 262144 : 65536)) {
    return bad("vocab", vocab, weights_only ? "must be in [300, 262144]" : "must be in [300, 65536]");
  }
  if (max_pos < 1 || max_pos > (1 << 20)) return bad("max_pos", max_pos, "must be in [1, 2^20]");
  if (arch == "mistral" && (sliding_window < 1 || sliding_window > max_pos)) {
    return bad("sliding_window", sliding_window, "must be in [1, max_pos]");
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return bad("rope_theta", rope_theta, "must be positive and finite");
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return bad("rms_norm_eps", rms_norm_eps, "must be positive and finite");
  }
  if (!rope_scaling.empty()) {
    if (rope_scaling != "linear" && rope_scaling != "llama3") {
      return absl::InvalidArgumentError(absl::StrCat(
          "rope_scaling must be empty, linear or llama3, got \"", rope_scaling, "\""));
    }
    if (!std::isfinite(rope_factor) || rope_factor < 1) {
      return bad("rope_factor", rope_factor, "must be a finite number >= 1");
    }
    if (rope_scaling == "llama3") {
      if (!std::isfinite(rope_low_freq_factor) || !(rope_low_freq_factor > 0)) {
        return bad("rope_low_freq_factor", rope_low_freq_factor, "must be positive and finite");
      }
      if (!std::isfinite(rope_high_freq_factor) || !(rope_high_freq_factor > rope_low_freq_factor)) {
        return bad("rope_high_freq_factor", rope_high_freq_factor,
                   "must be finite and greater than rope_low_freq_factor");
      }
      if (rope_original_max_pos < 1 || rope_original_max_pos > max_pos) {
        return bad("rope_original_max_pos", rope_original_max_pos,
                   "must be in [1, max_pos] for rope_scaling llama3");
      }
    }
  }
  // All factors are bounded above, so int64 cannot overflow here.
  int64_t params = 0;
  for (const TensorSpec& spec : TensorSpecs(*this)) {
    int64_t n = 1;
    for (int64_t dim : spec.shape) n *= dim;
    params += n;
  }
  if (params > kMaxParameters) {
    return absl::InvalidArgumentError(absl::StrCat("the model would have ", params,
                                                   " parameters; the tool's limit is ",
                                                   kMaxParameters));
  }
  return absl::OkStatus();
}

absl::Status MakeTestModel(const TestModelOptions& options, std::vector<std::string>* written) {
  ECHOKV_RETURN_IF_ERROR(options.Validate());
  const std::string& dir = options.out_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  auto note = [written](const std::string& path) {
    if (written != nullptr) written->push_back(path);
  };

  const std::string config_path = dir + "/config.json";
  ECHOKV_RETURN_IF_ERROR(WriteFile(config_path, ConfigJson(options)));
  note(config_path);
  const std::string generation_path = dir + "/generation_config.json";
  ECHOKV_RETURN_IF_ERROR(WriteFile(generation_path, GenerationConfigJson()));
  note(generation_path);

  std::vector<model::TensorToWrite> tensors;
  for (const TensorSpec& spec : TensorSpecs(options)) {
    tensors.push_back(MakeTensor(spec, options.seed));
  }
  const std::string weights_path = dir + "/model.safetensors";
  ECHOKV_RETURN_IF_ERROR(model::WriteSafetensors(weights_path, tensors, {{"format", "pt"}}));
  note(weights_path);
  tensors.clear();
  if (options.weights_only) return absl::OkStatus();

  ECHOKV_RETURN_IF_ERROR(TrainTokenizer(options, dir));
  note(dir + "/tokenizer.model");
  const std::string tokenizer_config_path = dir + "/tokenizer_config.json";
  ECHOKV_RETURN_IF_ERROR(WriteFile(tokenizer_config_path, TokenizerConfigJson(options)));
  note(tokenizer_config_path);
  const std::string readme_path = dir + "/README.md";
  ECHOKV_RETURN_IF_ERROR(WriteFile(readme_path, Readme(options)));
  note(readme_path);
  return absl::OkStatus();
}

}  // namespace echokv::tools
