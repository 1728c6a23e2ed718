// echokv-bench-kv-quant: how close int8 retained caches keep attention on a real model's
// keys, queries and values (kernels/kv_quant.h), per key scaling. Prefills a prompt (a
// docs file of this repository, the first --tokens tokens), keeps the post-RoPE queries
// of the last --queries tokens, and for every layer, KV group and query head compares the
// attention over the float32 cache with the attention over its quantized copy:
//   logit error  |scale * (q.k^ - q.k)| over every visible (query, key) pair (mean, max);
//   KL           KL(softmax(float32) || softmax(quantized)) per query and head (mean, max);
//   out error    ||o^ - o||_2 / ||o||_2 with the values quantized per token (mean, max).
// Key variants: int8 per token, int8 per channel over blocks of 32 / 64 / 128 tokens,
// bfloat16; "+q8" rows also quantize the query per head to int8, "+q8x2" to two int8
// halves (hi + lo / 254: what the int8 decode attention kernel multiplies with). The
// per-channel rows quantize the float32 query, not the query scaled by each block's
// key scales as the kernel does (an approximation of the kernel's query error there).
// Everything after the prefill is in float64.
//
// Then, end to end (--decode N, default 32): N decode steps after the prompt, the same
// tokens fed to every cache (the float32 cache's greedy choices), each cache's stored
// K and V replaced by their round trip through a format (the decode itself in float32,
// so the int8 query of the kernel is not in these rows: its two halves measured as
// close as a float32 query above). Per step: KL(float32 || format) of the next-token
// distribution and whether the top-1 token agrees. int8 per channel: the prompt's keys in
// full blocks of 64, the decoded keys kept in float32 (KIVI's residual); values per token.
//
//   build/bin/echokv-bench-kv-quant --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/kv_quant.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

namespace {

using echokv::kernels::KvDtype;

struct Stats {
  double sum = 0, max = 0;
  int64_t n = 0;
  void Add(double x) {
    sum += x;
    max = std::max(max, x);
    ++n;
  }
  double mean() const { return n ? sum / n : 0; }
};

struct Variant {
  Variant(std::string n, std::function<void(std::vector<float>&, int64_t, int64_t)> k, bool qq = false)
      : name(std::move(n)), keys(std::move(k)), quantize_query(qq) {}
  Variant(std::string n, std::function<void(std::vector<float>&, int64_t, int64_t)> k, bool qq, bool halves)
      : name(std::move(n)), keys(std::move(k)), quantize_query(qq), query_two_halves(halves) {}
  std::string name;
  // Quantizes then dequantizes n key rows of d floats in place.
  std::function<void(std::vector<float>&, int64_t, int64_t)> keys;
  bool quantize_query = false;
  bool query_two_halves = false;  // the query as hi + lo / 254 (two int8 dot products)
  Stats logit, kl, out;
};

void RoundTripRows(std::vector<float>& x, int64_t n, int64_t d) {
  std::vector<int8_t> q(n * d);
  std::vector<float> s(n);
  echokv::kernels::QuantizeRowsInt8(x.data(), n, d, q.data(), s.data());
  echokv::kernels::DequantizeRowsInt8(q.data(), s.data(), n, d, x.data());
}

void RoundTripBlocks(std::vector<float>& x, int64_t n, int64_t d, int64_t block) {
  std::vector<int8_t> q(n * d);
  std::vector<float> s(((n + block - 1) / block) * d);
  echokv::kernels::QuantizeChannelBlocksInt8(x.data(), n, d, block, q.data(), s.data());
  echokv::kernels::DequantizeChannelBlocksInt8(q.data(), s.data(), n, d, block, x.data());
}

// The query as two int8 halves: hi = round(q / s), lo = round((q / s - hi) * 254),
// q^ = s (hi + lo / 254): steps of s / 254.
void RoundTripHalves(std::vector<float>& q, int64_t d) {
  float amax = 0;
  for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(q[c]));
  if (amax == 0) return;
  const float s = amax / 127.0f;
  for (int64_t c = 0; c < d; ++c) {
    const float hi = std::nearbyint(q[c] / s), lo = std::nearbyint((q[c] / s - hi) * 254.0f);
    q[c] = s * (hi + lo / 254.0f);
  }
}

void RoundTripBf16(std::vector<float>& x, int64_t, int64_t) {
  std::vector<uint16_t> b(x.size());
  echokv::kernels::FloatsToBFloat16(x.data(), x.size(), b.data());
  echokv::kernels::BFloat16ToFloats(b.data(), x.size(), x.data());
}

// softmax(scale * q.k_j) over keys [0, n) and the weighted sum of value rows.
void Attend(const float* q, const std::vector<float>& k, const std::vector<float>& v, int64_t n, int64_t d,
            double scale, std::vector<double>& logits, std::vector<double>& p, std::vector<double>& o) {
  logits.assign(n, 0);
  double mx = -1e300;
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += static_cast<double>(q[c]) * k[j * d + c];
    logits[j] = s * scale;
    mx = std::max(mx, logits[j]);
  }
  p.assign(n, 0);
  double den = 0;
  for (int64_t j = 0; j < n; ++j) den += p[j] = std::exp(logits[j] - mx);
  o.assign(d, 0);
  for (int64_t j = 0; j < n; ++j) {
    p[j] /= den;
    for (int64_t c = 0; c < d; ++c) o[c] += p[j] * v[j * d + c];
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", text_path = "docs/ALGORITHM.md";
  int tokens = 1024, queries = 32, decode = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") {
      model_path = argv[i + 1];
    } else if (a == "--text") {
      text_path = argv[i + 1];
    } else if (a == "--tokens") {
      tokens = std::atoi(argv[i + 1]);
    } else if (a == "--queries") {
      queries = std::atoi(argv[i + 1]);
    } else if (a == "--decode") {
      decode = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--model PATH] [--text FILE] [--tokens N] [--queries N] [--decode N]\n", argv[0]);
      return 2;
    }
  }
  echokv::model::DeviceOptions dev;
  auto model = echokv::model::Transformer::Load(model_path, dev);
  if (!model.ok()) return echokv::bench::ReportBenchError(model.status());
  auto tok = echokv::model::LoadTokenizer(model_path);
  if (!tok.ok()) return echokv::bench::ReportBenchError(tok.status());
  std::ifstream in(text_path);
  std::stringstream buf;
  buf << in.rdbuf();
  auto ids = (*tok)->Encode(buf.str());
  if (!ids.ok()) return echokv::bench::ReportBenchError(ids.status());
  if (static_cast<int>(ids->size()) < tokens) {
    std::fprintf(stderr, "%s has %zu tokens, fewer than --tokens %d\n", text_path.c_str(), ids->size(), tokens);
    return 2;
  }
  ids->resize(tokens);
  echokv::model::KvCache cache = (*model)->NewCache();
  echokv::model::ForwardOptions fo;
  fo.keep_last_queries = queries;
  auto fwd = (*model)->Forward(*ids, &cache, fo);
  if (!fwd.ok()) return echokv::bench::ReportBenchError(fwd.status());
  const auto& cfg = (*model)->config();
  const int64_t H = cfg.num_heads, G = cfg.num_kv_heads, d = cfg.head_dim, r = H / G;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::printf("model %s: %d layers, H %ld, G %ld, d %ld; %d tokens of %s, queries of the last %d\n",
              model_path.c_str(), cfg.num_layers, H, G, d, tokens, text_path.c_str(), queries);
  std::vector<Variant> variants;
  variants.emplace_back("int8 per token", RoundTripRows);
  variants.emplace_back("int8 per token +q8", RoundTripRows, true);
  variants.emplace_back("int8 per token +q8x2", RoundTripRows, true, true);
  for (int64_t b : {32, 64, 128}) {
    const std::string name = "int8 per channel, block " + std::to_string(b);
    variants.emplace_back(name, [b](std::vector<float>& x, int64_t n, int64_t dd) { RoundTripBlocks(x, n, dd, b); });
  }
  variants.emplace_back("int8 per channel, block 64 +q8",
                      [](std::vector<float>& x, int64_t n, int64_t dd) { RoundTripBlocks(x, n, dd, 64); }, true);
  variants.emplace_back("int8 per channel, block 64 +q8x2",
                        [](std::vector<float>& x, int64_t n, int64_t dd) { RoundTripBlocks(x, n, dd, 64); }, true, true);
  variants.emplace_back("bfloat16", RoundTripBf16);
  // Key statistics: the ratio of the largest channel's RMS to the median channel's.
  Stats outlier;
  std::vector<double> lf, pf, of, lq, pq, oq;
  for (int l = 0; l < cfg.num_layers; ++l) {
    at::Tensor K = cache.keys(l).contiguous(), V = cache.values(l).contiguous();
    at::Tensor Q = fwd->queries[l].contiguous();  // [H, N, d]
    const int64_t n = K.size(1), N = Q.size(1);
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> k(K.data_ptr<float>() + g * n * d, K.data_ptr<float>() + (g + 1) * n * d);
      std::vector<float> v(V.data_ptr<float>() + g * n * d, V.data_ptr<float>() + (g + 1) * n * d);
      std::vector<double> rms(d, 0);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < d; ++c) rms[c] += static_cast<double>(k[j * d + c]) * k[j * d + c];
      }
      std::vector<double> sorted = rms;
      std::sort(sorted.begin(), sorted.end());
      outlier.Add(std::sqrt(sorted.back() / sorted[d / 2]));
      std::vector<float> vq = v;
      RoundTripRows(vq, n, d);
      for (Variant& var : variants) {
        std::vector<float> kq = k;
        var.keys(kq, n, d);
        for (int64_t h = g * r; h < (g + 1) * r; ++h) {
          for (int64_t i = 0; i < N; ++i) {
            const int64_t visible = n - N + i + 1;  // causal: the query at position n - N + i
            std::vector<float> q(Q.data_ptr<float>() + (h * N + i) * d, Q.data_ptr<float>() + (h * N + i + 1) * d);
            Attend(q.data(), k, v, visible, d, scale, lf, pf, of);
            if (var.query_two_halves) {
              RoundTripHalves(q, d);
            } else if (var.quantize_query) {
              RoundTripRows(q, 1, d);
            }
            Attend(q.data(), kq, vq, visible, d, scale, lq, pq, oq);
            double kl = 0, err = 0, norm = 0;
            for (int64_t j = 0; j < visible; ++j) {
              var.logit.Add(std::fabs(lq[j] - lf[j]));
              if (pf[j] > 0) kl += pf[j] * (std::log(pf[j]) - std::log(std::max(pq[j], 1e-300)));
            }
            for (int64_t c = 0; c < d; ++c) {
              err += (oq[c] - of[c]) * (oq[c] - of[c]);
              norm += of[c] * of[c];
            }
            var.kl.Add(kl);
            var.out.Add(std::sqrt(err / norm));
          }
        }
      }
    }
  }
  std::printf("key channel RMS, largest / median channel: mean %.2f, max %.2f over %ld (layer, group)s\n",
              outlier.mean(), outlier.max, outlier.n);
  std::printf("values: int8 per token in every row\n");
  std::printf("%-32s %12s %12s %12s %12s %12s %12s\n", "keys", "logit mean", "logit max", "KL mean", "KL max",
              "out err mean", "out err max");
  for (const Variant& v : variants) {
    std::printf("%-32s %12.3e %12.3e %12.3e %12.3e %12.3e %12.3e\n", v.name.c_str(), v.logit.mean(), v.logit.max,
                v.kl.mean(), v.kl.max, v.out.mean(), v.out.max);
  }
  if (decode <= 0) return 0;
  // Round trips entries [b, e) of every layer's keys (per token or per channel block) and
  // values (per token) in place, through the views KvCache hands out.
  enum class Format { kFloat32, kBFloat16, kInt8PerToken, kInt8PerChannel };
  auto round_trip = [&](echokv::model::KvCache& c, Format f, int64_t b, int64_t e, bool keys_too) {
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        if (kv == 0 && !keys_too) continue;
        at::Tensor view = (kv == 0 ? c.keys(l) : c.values(l)).narrow(1, b, e - b);
        at::Tensor dense = view.contiguous().clone();
        float* data = dense.data_ptr<float>();
        const int64_t m = e - b;
        for (int64_t g = 0; g < G; ++g) {
          std::vector<float> x(data + g * m * d, data + (g + 1) * m * d);
          if (f == Format::kBFloat16) {
            RoundTripBf16(x, m, d);
          } else if (f == Format::kInt8PerChannel && kv == 0) {
            RoundTripBlocks(x, m, d, 64);
          } else {
            RoundTripRows(x, m, d);
          }
          std::copy(x.begin(), x.end(), data + g * m * d);
        }
        view.copy_(dense);
      }
    }
  };
  struct E2e {
    const char* name;
    Format format;
    echokv::model::KvCache cache;
    Stats kl;
    int64_t agree = 0;
  };
  std::vector<E2e> runs;
  const std::pair<const char*, Format> formats[] = {{"float32", Format::kFloat32},
                                                    {"bfloat16", Format::kBFloat16},
                                                    {"int8 per token", Format::kInt8PerToken},
                                                    {"int8 keys per channel 64", Format::kInt8PerChannel}};
  for (const auto& [name, f] : formats) {
    runs.push_back({name, f, cache.Clone(), {}, 0});
    const int64_t full = f == Format::kInt8PerChannel ? (tokens / 64) * 64 : tokens;
    if (f != Format::kFloat32) round_trip(runs.back().cache, f, 0, full, true);
    if (f == Format::kInt8PerChannel && full < tokens) round_trip(runs.back().cache, f, full, tokens, false);
  }
  int token = static_cast<int>(fwd->logits.argmax().item<int64_t>());
  for (int step = 0; step < decode; ++step) {
    std::vector<double> pf;
    int top_f = 0;
    for (E2e& r : runs) {
      auto res = (*model)->Decode(token, &r.cache);
      if (!res.ok()) return echokv::bench::ReportBenchError(res.status());
      const int64_t n = r.cache.size(0);
      if (r.format != Format::kFloat32) round_trip(r.cache, r.format, n - 1, n, r.format != Format::kInt8PerChannel);
      at::Tensor lg = res->logits.to(at::kDouble).contiguous();
      const double* x = lg.data_ptr<double>();
      const int64_t V = lg.numel();
      const double mx = *std::max_element(x, x + V);
      std::vector<double> p(V);
      double den = 0;
      for (int64_t i = 0; i < V; ++i) den += p[i] = std::exp(x[i] - mx);
      for (double& v : p) v /= den;
      const int top = static_cast<int>(std::max_element(p.begin(), p.end()) - p.begin());
      if (r.format == Format::kFloat32) {
        pf = p;
        top_f = top;
      }
      double kl = 0;
      for (int64_t i = 0; i < V; ++i) {
        if (pf[i] > 0) kl += pf[i] * (std::log(pf[i]) - std::log(std::max(p[i], 1e-300)));
      }
      r.kl.Add(kl);
      r.agree += top == top_f;
    }
    token = top_f;
  }
  std::printf("end to end: %d decode steps after the %d-token prompt (the float32 cache's greedy tokens)\n", decode,
              tokens);
  std::printf("%-28s %12s %12s %12s\n", "cache", "KL mean", "KL max", "top-1 agree");
  for (const E2e& r : runs) {
    std::printf("%-28s %12.3e %12.3e %11.1f%%\n", r.name, r.kl.mean(), r.kl.max, 100.0 * r.agree / decode);
  }
  return 0;
}
