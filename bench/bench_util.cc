#include "bench/bench_util.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/safetensors.h"
#include "model/weights.h"
#include "model/config.h"
#include "nlohmann/json.hpp"

namespace echokv::bench {
namespace {

// splitmix64 -> uniform -> Box-Muller normal; deterministic across platforms.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return ((Next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double Normal() { return std::sqrt(-2.0 * std::log(Uniform())) * std::cos(6.283185307179586 * Uniform()); }
};

int64_t ReadStatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream ss(line.substr(std::strlen(key)));
      int64_t kb = 0;
      ss >> kb;
      return kb;
    }
  }
  return 0;
}

}  // namespace

absl::Status WriteRandomLlama(const std::string& dir, const BenchModelSpec& spec, uint64_t seed) {
  nlohmann::json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = spec.hidden;
  j["intermediate_size"] = spec.intermediate;
  j["num_hidden_layers"] = spec.layers;
  j["num_attention_heads"] = spec.heads;
  j["num_key_value_heads"] = spec.kv_heads;
  j["vocab_size"] = spec.vocab;
  j["max_position_embeddings"] = spec.max_positions;
  j["rms_norm_eps"] = 1e-5;
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = spec.tied;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  j["torch_dtype"] = "float32";
  const std::string config_text = j.dump(2);
  std::filesystem::create_directories(dir);
  {
    std::ifstream old(dir + "/config.json");
    std::stringstream ss;
    ss << old.rdbuf();
    if (old && ss.str() == config_text && std::filesystem::exists(dir + "/model.safetensors")) {
      return absl::OkStatus();
    }
  }
  auto config = model::ParseModelConfig(config_text, "");
  if (!config.ok()) return config.status();
  Rng rng{seed};
  std::vector<model::TensorToWrite> tensors;
  for (const model::ExpectedTensor& t : model::ExpectedTensors(*config)) {
    size_t n = 1;
    for (int64_t s : t.shape) n *= static_cast<size_t>(s);
    model::TensorToWrite w;
    w.name = t.name;
    w.shape = t.shape;
    w.bytes.resize(n * 4);
    const bool norm = t.name.find("norm") != std::string::npos;
    for (size_t i = 0; i < n; ++i) {
      float v = norm ? 1.0f : static_cast<float>(0.02 * rng.Normal());
      std::memcpy(&w.bytes[i * 4], &v, 4);
    }
    tensors.push_back(std::move(w));
  }
  if (absl::Status s = model::WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}); !s.ok()) {
    return s;
  }
  std::ofstream(dir + "/config.json") << config_text;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveBenchModelDir(const std::string& model_dir, const std::string& random40m_dir) {
  if (random40m_dir.empty()) {
    if (model_dir.empty()) return absl::InvalidArgumentError("--model or --random40m is required");
    return model_dir;
  }
  std::fprintf(stderr, "writing/using the random ~40M llama in %s\n", random40m_dir.c_str());
  if (absl::Status s = WriteRandomLlama(random40m_dir, Bench40M(), 7); !s.ok()) return s;
  return random40m_dir;
}

absl::StatusOr<std::unique_ptr<model::Transformer>> LoadBenchModel(const std::string& model_dir,
                                                                   const std::string& random40m_dir, int threads,
                                                                   std::string* dir, const std::string& weights) {
  absl::StatusOr<std::string> resolved = ResolveBenchModelDir(model_dir, random40m_dir);
  if (!resolved.ok()) return resolved.status();
  *dir = *resolved;
  model::DeviceOptions dev;
  dev.num_threads = threads;
  dev.weights = weights;
  return model::Transformer::Load(*dir, dev);
}

int ReportBenchError(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

std::vector<int> BenchContext(int length, int vocab) {
  std::vector<int> ids(length);
  for (int i = 0; i < length; ++i) ids[i] = i == 0 ? 1 : (i * 7919 + 13) % vocab;
  return ids;
}

int64_t PeakRssBytes() { return ReadStatusKb("VmHWM:") * 1024; }
int64_t CurrentRssBytes() { return ReadStatusKb("VmRSS:") * 1024; }

double LoadAverage1() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

}  // namespace echokv::bench
