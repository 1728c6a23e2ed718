#include "tools/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config.h"
#include "model/ggml_types.h"
#include "model/safetensors.h"
#include "model/spm_model_proto.h"
#include "model/weights.h"
#include "nlohmann/json.hpp"

namespace echokv::tools {
namespace {

using model::ModelConfig;
using model::ModelType;

constexpr uint32_t kAlignment = 32;

// GGUF value type ids.
enum : uint32_t { kU32 = 4, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kI32 = 5 };

class Writer {
 public:
  template <typename T>
  static std::string Le(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));
    return s;
  }
  static std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }

  void U32(const std::string& k, uint32_t v) { Kv(k, kU32, Le(v)); }
  void F32(const std::string& k, float v) { Kv(k, kF32, Le(v)); }
  void Bool(const std::string& k, bool v) { Kv(k, kBool, Le<uint8_t>(v ? 1 : 0)); }
  void String(const std::string& k, const std::string& v) { Kv(k, kString, Str(v)); }
  void Strings(const std::string& k, const std::vector<std::string>& v) {
    std::string b = Le<uint32_t>(kString) + Le<uint64_t>(v.size());
    for (const std::string& s : v) b += Str(s);
    Kv(k, kArray, b);
  }
  void F32s(const std::string& k, const std::vector<float>& v) {
    std::string b = Le<uint32_t>(kF32) + Le<uint64_t>(v.size());
    for (float x : v) b += Le(x);
    Kv(k, kArray, b);
  }
  void I32s(const std::string& k, const std::vector<int32_t>& v) {
    std::string b = Le<uint32_t>(kI32) + Le<uint64_t>(v.size());
    for (int32_t x : v) b += Le(x);
    Kv(k, kArray, b);
  }
  // `dims` in GGUF order (dims[0] contiguous).
  void Tensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t type, std::string data) {
    std::string t = Str(name) + Le<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) t += Le<uint64_t>(static_cast<uint64_t>(d));
    t += Le(type) + Le<uint64_t>(data_.size());
    infos_.push_back(t);
    data_ += data;
    while (data_.size() % kAlignment != 0) data_.push_back('\0');
  }
  std::string Build() const {
    std::string out = "GGUF" + Le<uint32_t>(3) + Le<uint64_t>(infos_.size()) + Le<uint64_t>(kvs_.size());
    for (const std::string& k : kvs_) out += k;
    for (const std::string& t : infos_) out += t;
    while (out.size() % kAlignment != 0) out.push_back('\0');
    return out + data_;
  }

 private:
  void Kv(const std::string& k, uint32_t type, const std::string& value) {
    kvs_.push_back(Str(k) + Le(type) + value);
  }
  std::vector<std::string> kvs_, infos_;
  std::string data_;
};

uint16_t FloatToHalf(float f) {  // round to nearest even (the values here are finite)
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFFu;
  if ((x & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

// ggml's reference Q8_0 quantizer (quantize_row_q8_0_ref; the gguf package's Q8_0):
// d = max|x| / 127, q = round-half-away(x / d) with x * (1/d).
std::string QuantizeQ8_0(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    out += Writer::Le<uint16_t>(FloatToHalf(d));
    for (size_t i = 0; i < 32; ++i) out.push_back(static_cast<char>(static_cast<int8_t>(std::round(x[b + i] * id))));
  }
  return out;
}

// bfloat16 by round to nearest even (the inputs are finite).
uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1)) >> 16);
}

int RoundClamp(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::lround(v)), lo, hi); }

// Q4_K and Q6_K by plain min / max rounding (not ggml's searched scales: valid blocks of
// the layout for tests, a little less accurate than llama-quantize's).
// Q4_K: per 32 values scale s = (max - min') / 15 with min' = min(min, 0), m = -min';
// the super-block's d = max s / 63, dmin = max m / 63, 6-bit sc = s / d, mn = m / dmin;
// q = (x + dmin mn) / (d sc) in 0..15.
std::string QuantizeQ4_K(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size(); b += 256) {
    float s[8], m[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, x[b + 32 * j + l]);
        hi = std::max(hi, x[b + 32 * j + l]);
      }
      s[j] = (hi - lo) / 15.0f;
      m[j] = -lo;
      smax = std::max(smax, s[j]);
      mmax = std::max(mmax, m[j]);
    }
    const float d = model::HalfToFloat(FloatToHalf(smax / 63.0f)), dmin = model::HalfToFloat(FloatToHalf(mmax / 63.0f));
    int sc[8], mn[8];
    uint8_t scales[12] = {}, qs[128] = {};
    for (int j = 0; j < 8; ++j) {
      sc[j] = d > 0 ? RoundClamp(s[j] / d, 0, 63) : 0;
      mn[j] = dmin > 0 ? RoundClamp(m[j] / dmin, 0, 63) : 0;
      if (j < 4) {
        scales[j] |= static_cast<uint8_t>(sc[j]);
        scales[j + 4] |= static_cast<uint8_t>(mn[j]);
      } else {
        scales[j + 4] = static_cast<uint8_t>((sc[j] & 15) | ((mn[j] & 15) << 4));
        scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
        scales[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
      }
      const float step = d * static_cast<float>(sc[j]), off = dmin * static_cast<float>(mn[j]);
      for (int l = 0; l < 32; ++l) {
        const int q = step > 0 ? RoundClamp((x[b + 32 * j + l] + off) / step, 0, 15) : 0;
        qs[32 * (j / 2) + l] |= static_cast<uint8_t>(j % 2 == 0 ? q : q << 4);
      }
    }
    out += Writer::Le<uint16_t>(FloatToHalf(d));
    out += Writer::Le<uint16_t>(FloatToHalf(dmin));
    out.append(reinterpret_cast<const char*>(scales), 12);
    out.append(reinterpret_cast<const char*>(qs), 128);
  }
  return out;
}

// Q6_K: per 16 values s = max|x| / 31; d = max s / 127, 8-bit sc = s / d;
// q = x / (d sc) in -32..31, stored + 32 as ql (low 4 bits) and qh (high 2).
std::string QuantizeQ6_K(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size(); b += 256) {
    float s[16], smax = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[b + 16 * j + l]));
      s[j] = amax / 31.0f;
      smax = std::max(smax, s[j]);
    }
    const float d = model::HalfToFloat(FloatToHalf(smax / 127.0f));
    uint8_t ql[128] = {}, qh[64] = {};
    int8_t sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(d > 0 ? RoundClamp(s[j] / d, -128, 127) : 0);
    for (int i = 0; i < 256; ++i) {
      const float step = d * static_cast<float>(sc[i / 16]);
      const int q = (step > 0 ? RoundClamp(x[b + i] / step, -32, 31) : 0) + 32;
      const int h = i / 128, g = (i % 128) / 32, l = i % 32;
      ql[64 * h + l + 32 * (g % 2)] |= static_cast<uint8_t>(g < 2 ? (q & 15) : (q & 15) << 4);
      qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * g));
    }
    out.append(reinterpret_cast<const char*>(ql), 128);
    out.append(reinterpret_cast<const char*>(qh), 64);
    out.append(reinterpret_cast<const char*>(sc), 16);
    out += Writer::Le<uint16_t>(FloatToHalf(d));
  }
  return out;
}

absl::StatusOr<uint32_t> TypeId(const std::string& name) {
  if (name == "f32") return static_cast<uint32_t>(model::GgmlType::kF32);
  if (name == "f16") return static_cast<uint32_t>(model::GgmlType::kF16);
  if (name == "bf16") return static_cast<uint32_t>(model::GgmlType::kBF16);
  if (name == "q8_0") return static_cast<uint32_t>(model::GgmlType::kQ8_0);
  if (name == "q4_k") return static_cast<uint32_t>(model::GgmlType::kQ4_K);
  if (name == "q6_k") return static_cast<uint32_t>(model::GgmlType::kQ6_K);
  return absl::InvalidArgumentError(
      absl::StrCat("type must be f32, f16, bf16, q8_0, q4_k or q6_k, got '", name, "'"));
}

bool IsKType(uint32_t type) {
  return type == static_cast<uint32_t>(model::GgmlType::kQ4_K) || type == static_cast<uint32_t>(model::GgmlType::kQ6_K);
}

std::string Encode(const std::vector<float>& v, uint32_t type) {
  if (type == static_cast<uint32_t>(model::GgmlType::kF16)) {
    std::string s;
    for (float f : v) s += Writer::Le<uint16_t>(FloatToHalf(f));
    return s;
  }
  if (type == static_cast<uint32_t>(model::GgmlType::kBF16)) {
    std::string s;
    for (float f : v) s += Writer::Le<uint16_t>(FloatToBf16(f));
    return s;
  }
  if (type == static_cast<uint32_t>(model::GgmlType::kQ8_0)) return QuantizeQ8_0(v);
  if (type == static_cast<uint32_t>(model::GgmlType::kQ4_K)) return QuantizeQ4_K(v);
  if (type == static_cast<uint32_t>(model::GgmlType::kQ6_K)) return QuantizeQ6_K(v);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// convert_hf_to_gguf.py LlamaModel.permute: rows of each head reordered so that RoPE
// pairs (i, i + d/2) become adjacent (2i, 2i + 1).
std::vector<float> Permute(const std::vector<float>& w, int64_t rows, int64_t cols, int heads) {
  std::vector<float> out(w.size());
  const int64_t d = rows / heads, half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int t = 0; t < 2; ++t) {
        std::memcpy(&out[(h * d + 2 * i + t) * cols], &w[(h * d + t * half + i) * cols],
                    static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::Status ExportGguf(const std::string& dir, const std::string& out_path, const GgufExportOptions& options) {
  ECHOKV_ASSIGN_OR_RETURN(uint32_t type, TypeId(options.type));
  ECHOKV_ASSIGN_OR_RETURN(uint32_t embed_type,
                          TypeId(options.embedding_type.empty() ? options.type : options.embedding_type));
  ECHOKV_ASSIGN_OR_RETURN(uint32_t v_type, TypeId(options.v_type.empty() ? options.type : options.v_type));
  ECHOKV_ASSIGN_OR_RETURN(ModelConfig c, model::LoadModelConfig(dir));
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt, model::Checkpoint::Open(dir));
  ECHOKV_RETURN_IF_ERROR(model::ValidateCheckpoint(*ckpt, c));
  if (c.sliding_window > 0 && c.sliding_window_first_layer > 0) {
    return absl::UnimplementedError("a sliding window from a later layer on has no GGUF key");
  }
  const model::CheckpointWeights weights(ckpt.get());
  const std::string arch(model::ModelTypeName(c.type));
  Writer w;
  w.String("general.architecture", arch);
  w.String("general.name", "echokv export");
  w.U32("general.alignment", kAlignment);
  w.U32(arch + ".block_count", c.num_layers);
  w.U32(arch + ".context_length", c.max_position_embeddings);
  w.U32(arch + ".embedding_length", c.hidden_size);
  w.U32(arch + ".feed_forward_length", c.intermediate_size);
  w.U32(arch + ".attention.head_count", c.num_heads);
  w.U32(arch + ".attention.head_count_kv", c.num_kv_heads);
  w.U32(arch + ".attention.key_length", c.head_dim);
  w.U32(arch + ".attention.value_length", c.head_dim);
  w.U32(arch + ".rope.dimension_count", c.head_dim);
  w.F32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  w.F32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.U32(arch + ".vocab_size", c.vocab_size);
  if (c.sliding_window > 0) w.U32(arch + ".attention.sliding_window", c.sliding_window);
  if (c.rope_scaling.type == model::RopeScalingType::kLinear) {
    w.String(arch + ".rope.scaling.type", "linear");
    w.F32(arch + ".rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }
  if (c.bos_token_id >= 0) w.U32("tokenizer.ggml.bos_token_id", c.bos_token_id);
  if (!c.eos_token_ids.empty()) w.U32("tokenizer.ggml.eos_token_id", c.eos_token_ids[0]);

  // The tokenizer: SentencePiece (tokenizer.model) as llama.cpp's converter writes it
  // (tokens, scores, token types, add_space_prefix, the trainer's special ids,
  // add_bos_token from tokenizer_config.json, default true), or byte-level BPE.
  const absl::StatusOr<std::string> spm_bytes = ReadText(dir + "/tokenizer.model");
  absl::StatusOr<model::SpmModelSpec> spm = spm_bytes.ok() ? model::ParseSpmModel(*spm_bytes)
                                                            : absl::StatusOr<model::SpmModelSpec>(spm_bytes.status());
  if (spm.ok() && ReadText(dir + "/tokenizer.json").status().code() == absl::StatusCode::kNotFound) {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    for (const model::SpmPiece& p : spm->pieces) {
      tokens.push_back(p.piece);
      scores.push_back(p.score);
      types.push_back(p.type);
    }
    w.String("tokenizer.ggml.model", "llama");
    w.String("tokenizer.ggml.pre", "default");
    w.Strings("tokenizer.ggml.tokens", tokens);
    w.F32s("tokenizer.ggml.scores", scores);
    w.I32s("tokenizer.ggml.token_type", types);
    w.Bool("tokenizer.ggml.add_space_prefix", spm->add_dummy_prefix);
    if (spm->unk_id >= 0) w.U32("tokenizer.ggml.unknown_token_id", spm->unk_id);
    bool add_bos = true;
    if (absl::StatusOr<std::string> cfg = ReadText(dir + "/tokenizer_config.json"); cfg.ok()) {
      const nlohmann::json j = nlohmann::json::parse(*cfg, nullptr, false);
      if (j.is_object() && j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) {
        add_bos = j["add_bos_token"].get<bool>();
      }
      if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
        w.String("tokenizer.chat_template", j["chat_template"].get<std::string>());
      }
    }
    w.Bool("tokenizer.ggml.add_bos_token", add_bos);
  } else if (absl::StatusOr<std::string> tj = ReadText(dir + "/tokenizer.json"); tj.ok()) {
    const nlohmann::json t = nlohmann::json::parse(*tj, nullptr, false);
    if (t.is_object() && t.contains("model") && t["model"].value("type", "") == "BPE") {
      std::vector<std::string> tokens(static_cast<size_t>(c.vocab_size));
      std::vector<int32_t> types(tokens.size(), 1);
      for (const auto& [piece, id] : t["model"]["vocab"].items()) {
        if (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < c.vocab_size) {
          tokens[id.get<size_t>()] = piece;
        }
      }
      for (const auto& a : t.value("added_tokens", nlohmann::json::array())) {
        const int64_t id = a.value("id", -1);
        if (id < 0 || id >= c.vocab_size) continue;
        tokens[static_cast<size_t>(id)] = a.value("content", "");
        types[static_cast<size_t>(id)] = a.value("special", false) ? 3 : 4;
      }
      std::vector<std::string> merges;
      for (const auto& m : t["model"].value("merges", nlohmann::json::array())) {
        merges.push_back(m.is_string() ? m.get<std::string>()
                                       : absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
      }
      w.String("tokenizer.ggml.model", "gpt2");
      w.String("tokenizer.ggml.pre", "default");
      w.Strings("tokenizer.ggml.tokens", tokens);
      w.I32s("tokenizer.ggml.token_type", types);
      w.Strings("tokenizer.ggml.merges", merges);
      if (absl::StatusOr<std::string> cfg = ReadText(dir + "/tokenizer_config.json"); cfg.ok()) {
        const nlohmann::json j = nlohmann::json::parse(*cfg, nullptr, false);
        if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
          w.String("tokenizer.chat_template", j["chat_template"].get<std::string>());
        }
        if (j.is_object() && j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) {
          w.Bool("tokenizer.ggml.add_bos_token", j["add_bos_token"].get<bool>());
        }
      }
    }
  }

  auto values = [&](const std::string& name) -> absl::StatusOr<std::vector<float>> {
    const std::vector<int64_t>* shape = weights.Shape(name);
    int64_t n = 1;
    for (int64_t d : *shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    ECHOKV_RETURN_IF_ERROR(weights.ReadFloat32(name, v.data()));
    return v;
  };
  const bool permute = c.type == ModelType::kLlama || c.type == ModelType::kMistral;
  // name (GGUF), HF name, storage type, permute over this many heads (0 = no).
  auto put = [&](const std::string& gguf, const std::string& hf, uint32_t t, int heads) -> absl::Status {
    ECHOKV_ASSIGN_OR_RETURN(std::vector<float> v, values(hf));
    const std::vector<int64_t>& shape = *weights.Shape(hf);
    if (heads > 0) v = Permute(v, shape[0], static_cast<int64_t>(v.size()) / shape[0], heads);
    if (shape.size() == 1 || shape.back() % 32 != 0) t = static_cast<uint32_t>(model::GgmlType::kF32);
    // K-quant rows are whole super-blocks: other rows fall back to Q8_0 (as llama-quantize
    // falls back to another type).
    if (IsKType(t) && shape.back() % 256 != 0) t = static_cast<uint32_t>(model::GgmlType::kQ8_0);
    std::vector<int64_t> dims(shape.rbegin(), shape.rend());
    w.Tensor(gguf, dims, t, Encode(v, t));
    return absl::OkStatus();
  };
  const uint32_t f32 = static_cast<uint32_t>(model::GgmlType::kF32);
  ECHOKV_RETURN_IF_ERROR(put("token_embd.weight", "model.embed_tokens.weight", embed_type, 0));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string g = absl::StrCat("blk.", l, "."), h = absl::StrCat("model.layers.", l, ".");
    ECHOKV_RETURN_IF_ERROR(put(g + "attn_norm.weight", h + "input_layernorm.weight", f32, 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "attn_q.weight", h + "self_attn.q_proj.weight", type, permute ? c.num_heads : 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "attn_k.weight", h + "self_attn.k_proj.weight", type, permute ? c.num_kv_heads : 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "attn_v.weight", h + "self_attn.v_proj.weight", v_type, 0));
    if (c.qkv_bias) {
      ECHOKV_RETURN_IF_ERROR(put(g + "attn_q.bias", h + "self_attn.q_proj.bias", f32, permute ? c.num_heads : 0));
      ECHOKV_RETURN_IF_ERROR(put(g + "attn_k.bias", h + "self_attn.k_proj.bias", f32, permute ? c.num_kv_heads : 0));
      ECHOKV_RETURN_IF_ERROR(put(g + "attn_v.bias", h + "self_attn.v_proj.bias", f32, 0));
    }
    ECHOKV_RETURN_IF_ERROR(put(g + "attn_output.weight", h + "self_attn.o_proj.weight", type, 0));
    if (c.o_bias) ECHOKV_RETURN_IF_ERROR(put(g + "attn_output.bias", h + "self_attn.o_proj.bias", f32, 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "ffn_norm.weight", h + "post_attention_layernorm.weight", f32, 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "ffn_gate.weight", h + "mlp.gate_proj.weight", type, 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "ffn_up.weight", h + "mlp.up_proj.weight", type, 0));
    ECHOKV_RETURN_IF_ERROR(put(g + "ffn_down.weight", h + "mlp.down_proj.weight", type, 0));
  }
  ECHOKV_RETURN_IF_ERROR(put("output_norm.weight", "model.norm.weight", f32, 0));
  if (!c.tie_word_embeddings) ECHOKV_RETURN_IF_ERROR(put("output.weight", "lm_head.weight", type, 0));
  if (c.rope_scaling.type == model::RopeScalingType::kLlama3) {
    // convert_hf_to_gguf.py's rope_freqs for rope_type llama3: one divisor per frequency.
    const model::RopeScaling& rs = c.rope_scaling;
    std::vector<float> factors;
    for (int i = 0; i < c.head_dim / 2; ++i) {
      const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
      const double wavelen = 2 * M_PI / freq;
      const double low = rs.original_max_position_embeddings / rs.low_freq_factor;
      const double high = rs.original_max_position_embeddings / rs.high_freq_factor;
      double f = 1;
      if (wavelen < high) {
        f = 1;
      } else if (wavelen > low) {
        f = rs.factor;
      } else {
        const double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = 1 / ((1 - smooth) / rs.factor + smooth);
      }
      factors.push_back(static_cast<float>(f));
    }
    w.Tensor("rope_freqs.weight", {static_cast<int64_t>(factors.size())}, f32, Encode(factors, f32));
  }
  const std::string bytes = w.Build();
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write ", out_path));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return absl::DataLossError(absl::StrCat("writing ", out_path, " failed"));
  return absl::OkStatus();
}

}  // namespace echokv::tools
