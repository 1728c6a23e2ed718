#include "tests/model/naive_reference.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "nlohmann/json.hpp"

namespace echokv::testing {
namespace {

using Vec = std::vector<double>;

Vec MatVec(const Vec& w, int rows, int cols, const Vec& x) {
  Vec y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int c = 0; c < cols; ++c) s += w[static_cast<size_t>(r) * cols + c] * x[c];
    y[r] = s;
  }
  return y;
}

Vec RmsNorm(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// float32 inverse frequencies: the given ones rounded, else HF's float32 recipe.
std::vector<float> InvFreq(const model::ModelConfig& c, const std::vector<double>& given) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = !given.empty() ? static_cast<float>(given.at(i))
                            : 1.0f / std::pow(static_cast<float>(c.rope_theta),
                                              static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
  }
  return inv;
}

// HF rotate_half RoPE on one head vector; angle = float32(pos * float32 inv_freq).
void Rope(double* v, int d, int pos, const std::vector<float>& inv_freq) {
  const int half = d / 2;
  std::vector<double> out(d);
  for (int i = 0; i < half; ++i) {
    float angle = static_cast<float>(pos) * inv_freq[i];
    double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
    out[i] = v[i] * c - v[i + half] * s;
    out[i + half] = v[i + half] * c + v[i] * s;
  }
  for (int i = 0; i < d; ++i) v[i] = out[i];
}

}  // namespace

std::vector<std::vector<double>> NaiveModel::Forward(const std::vector<int>& tokens, const NaiveMask& mask) const {
  const auto& c = config;
  const int D = c.hidden_size, H = c.num_heads, G = c.num_kv_heads, d = c.head_dim, I = c.intermediate_size;
  const int V = c.vocab_size, T = static_cast<int>(tokens.size()), r = H / G;
  if (!rope_inv_freq.empty() && rope_inv_freq.size() != static_cast<size_t>(d / 2)) {
    ADD_FAILURE() << "rope_inv_freq has " << rope_inv_freq.size() << " values, head_dim / 2 = " << d / 2;
    return {};
  }
  const std::vector<float> inv = InvFreq(c, rope_inv_freq);
  std::vector<Vec> x(T, Vec(D));
  const Vec& emb = weights.at("model.embed_tokens.weight");
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D; ++i) x[t][i] = emb[static_cast<size_t>(tokens[t]) * D + i];
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      Vec h = RmsNorm(x[t], weights.at(p + "input_layernorm.weight"), c.rms_norm_eps);
      q[t] = MatVec(weights.at(p + "self_attn.q_proj.weight"), H * d, D, h);
      k[t] = MatVec(weights.at(p + "self_attn.k_proj.weight"), G * d, D, h);
      v[t] = MatVec(weights.at(p + "self_attn.v_proj.weight"), G * d, D, h);
      if (c.qkv_bias) {
        const Vec& bq = weights.at(p + "self_attn.q_proj.bias");
        const Vec& bk = weights.at(p + "self_attn.k_proj.bias");
        const Vec& bv = weights.at(p + "self_attn.v_proj.bias");
        for (int i = 0; i < H * d; ++i) q[t][i] += bq[i];
        for (int i = 0; i < G * d; ++i) k[t][i] += bk[i], v[t][i] += bv[i];
      }
      for (int h2 = 0; h2 < H; ++h2) Rope(&q[t][h2 * d], d, t, inv);
      for (int g = 0; g < G; ++g) Rope(&k[t][g * d], d, t, inv);
    }
    std::vector<Vec> attn(T, Vec(H * d, 0.0));
    for (int t = 0; t < T; ++t) {
      for (int h2 = 0; h2 < H; ++h2) {
        const int g = h2 / r;
        std::vector<double> logits;
        std::vector<int> keys;
        for (int j = 0; j <= t; ++j) {
          if (c.UsesSlidingWindow(l) && t - j >= c.sliding_window) continue;
          if (mask && !mask(l, g, t, j)) continue;
          double s = 0;
          for (int i = 0; i < d; ++i) s += q[t][h2 * d + i] * k[j][g * d + i];
          logits.push_back(s / std::sqrt(static_cast<double>(d)));
          keys.push_back(j);
        }
        double mx = -1e300;
        for (double s : logits) mx = std::max(mx, s);
        double den = 0;
        for (double& s : logits) den += (s = std::exp(s - mx));
        for (size_t n = 0; n < keys.size(); ++n)
          for (int i = 0; i < d; ++i) attn[t][h2 * d + i] += logits[n] / den * v[keys[n]][g * d + i];
      }
    }
    for (int t = 0; t < T; ++t) {
      Vec o = MatVec(weights.at(p + "self_attn.o_proj.weight"), D, H * d, attn[t]);
      if (c.o_bias) {
        const Vec& bo = weights.at(p + "self_attn.o_proj.bias");
        for (int i = 0; i < D; ++i) o[i] += bo[i];
      }
      for (int i = 0; i < D; ++i) x[t][i] += o[i];
      Vec h = RmsNorm(x[t], weights.at(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
      Vec gate = MatVec(weights.at(p + "mlp.gate_proj.weight"), I, D, h);
      Vec up = MatVec(weights.at(p + "mlp.up_proj.weight"), I, D, h);
      Vec act(I);
      for (int i = 0; i < I; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      Vec down = MatVec(weights.at(p + "mlp.down_proj.weight"), D, I, act);
      for (int i = 0; i < D; ++i) x[t][i] += down[i];
    }
  }
  const Vec& head = c.tie_word_embeddings ? emb : weights.at("lm_head.weight");
  std::vector<Vec> out(T);
  for (int t = 0; t < T; ++t) out[t] = MatVec(head, V, D, RmsNorm(x[t], weights.at("model.norm.weight"), c.rms_norm_eps));
  return out;
}

NaiveModel MakeRandomModel(const model::ModelConfig& config, uint32_t seed) {
  NaiveModel m;
  m.config = config;
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (const model::ExpectedTensor& t : model::ExpectedTensors(config)) {
    size_t n = 1;
    for (int64_t s : t.shape) n *= static_cast<size_t>(s);
    Vec w(n);
    const bool norm = t.name.find("norm") != std::string::npos;
    const bool bias = t.name.find("bias") != std::string::npos;
    const double scale = norm ? 0.1 : bias ? 0.2 : (t.name.find("embed") != std::string::npos ? 0.5 : 0.25);
    for (double& v : w) {
      // Store exactly representable float32 values so both sides read identical weights.
      v = static_cast<float>((norm ? 1.0 : 0.0) + scale * normal(rng));
    }
    m.weights[t.name] = std::move(w);
  }
  return m;
}

void WriteModelDir(const NaiveModel& m, const std::string& dir) {
  const auto& c = m.config;
  nlohmann::json j;
  j["model_type"] = std::string(model::ModelTypeName(c.type));
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  switch (c.rope_scaling.type) {
    case model::RopeScalingType::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case model::RopeScalingType::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case model::RopeScalingType::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (c.type == model::ModelType::kMistral) j["sliding_window"] = c.sliding_window;
  if (c.type == model::ModelType::kQwen2) j["use_sliding_window"] = false;
  std::ofstream(dir + "/config.json") << j.dump(2);
  std::vector<model::TensorToWrite> tensors;
  for (const model::ExpectedTensor& t : model::ExpectedTensors(c)) {
    const Vec& w = m.weights.at(t.name);
    model::TensorToWrite out;
    out.name = t.name;
    out.dtype = model::DType::kF32;
    out.shape = t.shape;
    out.bytes.resize(w.size() * 4);
    for (size_t i = 0; i < w.size(); ++i) {
      float f = static_cast<float>(w[i]);
      std::memcpy(&out.bytes[i * 4], &f, 4);
    }
    tensors.push_back(std::move(out));
  }
  absl::Status s = model::WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  ASSERT_TRUE(s.ok()) << s;
}

model::ModelConfig TinyConfig(model::ModelType type) {
  model::ModelConfig c;
  c.type = type;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = type == model::ModelType::kLlama;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (type == model::ModelType::kMistral) c.sliding_window = 5;
  if (type == model::ModelType::kQwen2) c.qkv_bias = true;
  return c;
}

}  // namespace echokv::testing
