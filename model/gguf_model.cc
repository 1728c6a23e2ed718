#include "model/gguf_model.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "model/ggml_types.h"

namespace echokv::model {
namespace {

// GGUF per-layer tensor suffix -> Hugging Face suffix under model.layers.N.
struct LayerName {
  const char* gguf;
  const char* hf;
};
constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

constexpr char kRopeFreqs[] = "rope_freqs.weight";

absl::StatusOr<int> PositiveInt(const GgufFile& f, const std::string& key) {
  ECHOKV_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v < 1 || v > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", key, "' must be in [1, 2^31), got ", v));
  }
  return static_cast<int>(v);
}

// An optional key: `fallback` when absent, the error when present but wrong.
absl::StatusOr<int> OptionalPositiveInt(const GgufFile& f, const std::string& key, int fallback) {
  if (f.Find(key) == nullptr) return fallback;
  return PositiveInt(f, key);
}

absl::StatusOr<double> OptionalFloat(const GgufFile& f, const std::string& key, double fallback) {
  if (f.Find(key) == nullptr) return fallback;
  ECHOKV_ASSIGN_OR_RETURN(double v, f.GetFloat(key));
  if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat("metadata '", key, "' is not finite"));
  return v;
}

// A token id key (tokenizer.ggml.*_token_id): -1 when absent; must be < vocab.
absl::StatusOr<int> OptionalTokenId(const GgufFile& f, const std::string& key, int vocab) {
  if (f.Find(key) == nullptr) return -1;
  ECHOKV_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v >= static_cast<uint64_t>(vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata '", key, "' is ", v, ", outside the vocabulary [0, ", vocab, ")"));
  }
  return static_cast<int>(v);
}

// Undoes llama.cpp's LlamaModel.permute on the rows of a [heads * d, cols] matrix (or
// a [heads * d] bias): GGUF row h*d + 2i + t holds Hugging Face row h*d + t*(d/2) + i.
void UnpermuteRows(const float* in, float* out, int64_t rows, int64_t cols, int heads) {
  const int64_t d = rows / heads, half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int t = 0; t < 2; ++t) {
        const float* src = in + (h * d + 2 * i + t) * cols;
        float* dst = out + (h * d + t * half + i) * cols;
        std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
}

}  // namespace

std::string GgufToHfName(absl::string_view name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (!absl::StartsWith(name, "blk.")) return "";
  absl::string_view rest = name.substr(4);
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0) return "";
  int layer = 0;
  if (!absl::SimpleAtoi(rest.substr(0, dot), &layer) || layer < 0) return "";
  if (rest.substr(0, dot) != absl::StrCat(layer)) return "";  // no "blk.01."
  const absl::string_view suffix = rest.substr(dot + 1);
  for (const LayerName& n : kLayerNames) {
    if (suffix == n.gguf) return absl::StrCat("model.layers.", layer, ".", n.hf);
  }
  return "";
}

absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& f) {
  ECHOKV_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  ModelConfig c;
  if (arch == "llama") {
    c.type = ModelType::kLlama;
  } else if (arch == "mistral") {
    c.type = ModelType::kMistral;
  } else if (arch == "qwen2") {
    c.type = ModelType::kQwen2;
  } else {
    return absl::UnimplementedError(absl::StrCat("metadata 'general.architecture' is '", arch.substr(0, 64),
                                                 "': only llama, mistral and qwen2 GGUF models are supported"));
  }
  const std::string a = arch + ".";
  ECHOKV_ASSIGN_OR_RETURN(c.num_layers, PositiveInt(f, a + "block_count"));
  ECHOKV_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(f, a + "embedding_length"));
  ECHOKV_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(f, a + "feed_forward_length"));
  ECHOKV_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(f, a + "attention.head_count"));
  ECHOKV_ASSIGN_OR_RETURN(c.num_kv_heads, OptionalPositiveInt(f, a + "attention.head_count_kv", c.num_heads));
  ECHOKV_ASSIGN_OR_RETURN(c.max_position_embeddings, PositiveInt(f, a + "context_length"));
  ECHOKV_ASSIGN_OR_RETURN(c.rms_norm_eps, f.GetFloat(a + "attention.layer_norm_rms_epsilon"));
  ECHOKV_ASSIGN_OR_RETURN(c.rope_theta, OptionalFloat(f, a + "rope.freq_base", 10000.0));
  const int default_head_dim = c.hidden_size % c.num_heads == 0 ? c.hidden_size / c.num_heads : 0;
  ECHOKV_ASSIGN_OR_RETURN(c.head_dim, OptionalPositiveInt(f, a + "attention.key_length", default_head_dim));
  ECHOKV_ASSIGN_OR_RETURN(int value_dim, OptionalPositiveInt(f, a + "attention.value_length", c.head_dim));
  if (value_dim != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat("metadata '", a, "attention.value_length' (", value_dim,
                                                 ") differs from the key length (", c.head_dim, ")"));
  }
  ECHOKV_ASSIGN_OR_RETURN(int rope_dims, OptionalPositiveInt(f, a + "rope.dimension_count", c.head_dim));
  if (rope_dims != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat("metadata '", a, "rope.dimension_count' is ", rope_dims,
                                                 ": partial rotary embeddings (head dim ", c.head_dim,
                                                 ") are not supported"));
  }
  if (f.Find(a + "attention.sliding_window") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(c.sliding_window, PositiveInt(f, a + "attention.sliding_window"));
  }
  // RoPE scaling as llama.cpp's converter writes it (rope.scaling.type: none, linear,
  // yarn, longrope; rope.scale_linear: the older linear key).
  if (f.Find(a + "rope.scaling.type") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(std::string type, f.GetString(a + "rope.scaling.type"));
    if (type == "linear") {
      c.rope_scaling.type = RopeScalingType::kLinear;
      ECHOKV_ASSIGN_OR_RETURN(c.rope_scaling.factor, f.GetFloat(a + "rope.scaling.factor"));
    } else if (type != "none") {
      return absl::UnimplementedError(absl::StrCat("metadata '", a, "rope.scaling.type' '", type.substr(0, 64),
                                                   "' is not supported (none and linear are)"));
    }
  } else if (f.Find(a + "rope.scale_linear") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(double factor, f.GetFloat(a + "rope.scale_linear"));
    if (factor != 1.0) {
      c.rope_scaling.type = RopeScalingType::kLinear;
      c.rope_scaling.factor = factor;
    }
  }

  const GgufTensor* embed = f.FindTensor("token_embd.weight");
  if (embed == nullptr) return absl::InvalidArgumentError("missing tensor 'token_embd.weight'");
  if (embed->dims.size() != 2) {
    return absl::InvalidArgumentError("tensor 'token_embd.weight' must have 2 dimensions");
  }
  const int64_t embed_rows = embed->dims[1];
  if (embed_rows > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError("tensor 'token_embd.weight' has too many rows");
  }
  ECHOKV_ASSIGN_OR_RETURN(c.vocab_size, OptionalPositiveInt(f, a + "vocab_size", static_cast<int>(embed_rows)));
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = f.FindTensor("blk.0.attn_output.bias") != nullptr;

  ECHOKV_ASSIGN_OR_RETURN(c.bos_token_id, OptionalTokenId(f, "tokenizer.ggml.bos_token_id", c.vocab_size));
  ECHOKV_ASSIGN_OR_RETURN(int eos, OptionalTokenId(f, "tokenizer.ggml.eos_token_id", c.vocab_size));
  if (eos >= 0) c.eos_token_ids.push_back(eos);
  // llama.cpp also ends generation at the end-of-turn / end-of-message tokens.
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    ECHOKV_ASSIGN_OR_RETURN(int id, OptionalTokenId(f, key, c.vocab_size));
    if (id >= 0 && id != eos) c.eos_token_ids.push_back(id);
  }
  if (const GgufValue* ft = f.Find("general.file_type"); ft != nullptr && ft->is_integer()) {
    c.torch_dtype = absl::StrCat("gguf file type ", ft->u);
  } else {
    c.torch_dtype = "gguf";
  }

  if (const GgufTensor* rf = f.FindTensor(kRopeFreqs); rf != nullptr) {
    if (rf->type != static_cast<uint32_t>(GgmlType::kF32) || rf->dims.size() != 1 ||
        rf->dims[0] != c.head_dim / 2) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", kRopeFreqs, "' must be F32 [", c.head_dim / 2,
                                                     "] (one factor per RoPE frequency)"));
    }
    absl::string_view bytes = f.TensorBytes(*rf);
    c.rope_freq_factors.resize(static_cast<size_t>(rf->dims[0]));
    std::memcpy(c.rope_freq_factors.data(), bytes.data(), bytes.size());
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return absl::Status(valid.code(), absl::StrCat("GGUF metadata: ", valid.message()));
  return c;
}

absl::StatusOr<std::unique_ptr<GgufModel>> GgufModel::Open(const std::string& path) {
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  std::shared_ptr<const GgufFile> shared(std::move(file));
  absl::StatusOr<std::unique_ptr<GgufModel>> m = FromFile(shared);
  if (!m.ok()) return absl::Status(m.status().code(), absl::StrCat(path, ": ", m.status().message()));
  return m;
}

absl::StatusOr<std::unique_ptr<GgufModel>> GgufModel::FromFile(std::shared_ptr<const GgufFile> file) {
  std::unique_ptr<GgufModel> m(new GgufModel());
  m->file_ = std::move(file);
  ECHOKV_ASSIGN_OR_RETURN(m->config_, GgufModelConfig(*m->file_));
  ECHOKV_RETURN_IF_ERROR(m->Build());
  return m;
}

absl::Status GgufModel::Build() {
  const bool permuted = config_.type == ModelType::kLlama || config_.type == ModelType::kMistral;
  for (const GgufTensor& t : file_->tensors()) {
    if (t.name == kRopeFreqs) continue;  // in the config
    std::string hf = GgufToHfName(t.name);
    if (hf.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name.substr(0, 64),
                                                     "' is not one a ", ModelTypeName(config_.type),
                                                     " model uses (unknown GGUF tensor name)"));
    }
    Entry e;
    e.tensor = &t;
    e.shape = t.shape();
    if (permuted && absl::StrContains(hf, "self_attn.q_proj.")) e.permute_heads = config_.num_heads;
    if (permuted && absl::StrContains(hf, "self_attn.k_proj.")) e.permute_heads = config_.num_kv_heads;
    if (e.permute_heads > 0) {
      const int64_t rows = e.shape[0];
      if (rows % e.permute_heads != 0 || (rows / e.permute_heads) % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has ", rows,
                                                       " rows, not a whole number of ", e.permute_heads,
                                                       " heads of even size"));
      }
    }
    const GgmlType type = static_cast<GgmlType>(t.type);
    if (e.permute_heads == 0 && (type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16)) {
      e.has_view = true;
      e.view.name = hf;
      e.view.dtype = type == GgmlType::kF32 ? DType::kF32 : type == GgmlType::kF16 ? DType::kF16 : DType::kBF16;
      e.view.shape = e.shape;
      absl::string_view bytes = file_->TensorBytes(t);
      e.view.data = reinterpret_cast<const uint8_t*>(bytes.data());
      e.view.nbytes = bytes.size();
    } else if (!FindGgmlType(t.type)->dequantizable) {
      return absl::UnimplementedError(absl::StrCat("tensor '", t.name, "' is stored as ", FindGgmlType(t.type)->name,
                                                   ", which echokv cannot decode (supported: F32, F16, BF16, Q4_0, "
                                                   "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
                                                   "IQ4_XS)"));
    }
    if (!entries_.emplace(hf, std::move(e)).second) {
      return absl::InvalidArgumentError(absl::StrCat("two tensors map to '", hf, "'"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> GgufModel::Names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const std::vector<int64_t>* GgufModel::Shape(absl::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second.shape;
}

const TensorView* GgufModel::View(absl::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() || !it->second.has_view ? nullptr : &it->second.view;
}

const GgufTensor* GgufModel::Tensor(absl::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.tensor;
}

std::string GgufModel::StoredType(absl::string_view name) const {
  const GgufTensor* t = Tensor(name);
  return t == nullptr ? "" : FindGgmlType(t->type)->name;
}

int GgufModel::StoredGgmlType(absl::string_view name) const {
  const GgufTensor* t = Tensor(name);
  return t == nullptr ? -1 : static_cast<int>(t->type);
}

absl::Status GgufModel::ReadStoredRows(absl::string_view name, uint8_t* out) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
  const Entry& e = it->second;
  if (e.shape.size() != 2) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is not 2-D"));
  absl::string_view bytes = file_->TensorBytes(*e.tensor);
  const int64_t rows = e.shape[0];
  const size_t row_bytes = bytes.size() / static_cast<size_t>(rows);
  if (e.permute_heads == 0) {
    std::memcpy(out, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  // As UnpermuteRows, on whole stored rows: GGUF row h*d + 2i + t is HF row h*d + t*(d/2) + i.
  const int64_t d = rows / e.permute_heads, half = d / 2;
  for (int64_t h = 0; h < e.permute_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int t = 0; t < 2; ++t) {
        std::memcpy(out + (h * d + t * half + i) * row_bytes, bytes.data() + (h * d + 2 * i + t) * row_bytes,
                    row_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GgufModel::ReadFloat32(absl::string_view name, float* out) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
  const Entry& e = it->second;
  absl::string_view bytes = file_->TensorBytes(*e.tensor);
  const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
  absl::Status s;
  if (e.permute_heads == 0) {
    s = DequantizeGgml(e.tensor->type, src, e.tensor->elements, out);
  } else {
    std::vector<float> tmp(static_cast<size_t>(e.tensor->elements));
    s = DequantizeGgml(e.tensor->type, src, e.tensor->elements, tmp.data());
    if (s.ok()) {
      const int64_t rows = e.shape[0];
      UnpermuteRows(tmp.data(), out, rows, e.tensor->elements / rows, e.permute_heads);
    }
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("tensor '", e.tensor->name, "': ", s.message()));
  return absl::OkStatus();
}

}  // namespace echokv::model
