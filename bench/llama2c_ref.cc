// llama2.c's run.c forward pass (karpathy/llama2.c commit 350e04fe: one token at a
// time, float32, naive loops, `#pragma omp parallel for` over matmul rows and heads),
// reading the same Hugging Face directory (config.json + F32 model.safetensors) that
// echokv reads. It is the baseline of the decode-speed target in docs/BENCHMARKS.md:
// echokv must decode at least as fast on the same weights. Only the loader uses C++
// (JSON); forward() is run.c's, line for line, except that rms_norm_eps, rope_theta,
// head_dim and the query width come from config.json instead of being 1e-5, 10000,
// dim / n_heads and dim.
// bench/CMakeLists.txt builds it with each of llama2.c's Makefile recipes (run,
// runfast, runomp).
//
//   echokv-bench-llama2c-runomp --model DIR --context 512 --decode 128
//   -> prints prefill (token-by-token) and decode tokens/s, and the first greedy ids.
//   echokv-bench-llama2c-runomp --model DIR --golden DIR/golden_public.json
//   -> replays each golden case's prompt, decodes greedily, exits 1 on any differing id.
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

typedef struct {
  int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, head_dim;
  float eps, theta;
  int tied;
} Config;

typedef struct {
  const float* embed;                 // [V, D]
  const float *ln1[256], *ln2[256];   // [D]
  const float *wq[256], *wk[256], *wv[256], *wo[256];
  const float *w1[256], *w2[256], *w3[256];  // gate, down, up
  const float* norm;
  const float* cls;
} Weights;

typedef struct {
  float *x, *xb, *xb2, *hb, *hb2, *q, *k, *v, *att, *logits;
  float *key_cache, *value_cache;  // [layers, seq, kv_dim]
} RunState;

static void rmsnorm(float* o, const float* x, const float* w, int n, float eps) {
  float ss = 0.0f;
  for (int j = 0; j < n; j++) ss += x[j] * x[j];
  ss /= n;
  ss += eps;
  ss = 1.0f / sqrtf(ss);
  for (int j = 0; j < n; j++) o[j] = w[j] * (ss * x[j]);
}

static void softmax(float* x, int size) {
  float max_val = x[0];
  for (int i = 1; i < size; i++)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (int i = 0; i < size; i++) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int i = 0; i < size; i++) x[i] /= sum;
}

// W (d,n) @ x (n,) -> xout (d,)
static void matmul(float* xout, const float* x, const float* w, int n, int d) {
  int i;
#pragma omp parallel for private(i)
  for (i = 0; i < d; i++) {
    float val = 0.0f;
    for (int j = 0; j < n; j++) val += w[(size_t)i * n + j] * x[j];
    xout[i] = val;
  }
}

static float* forward(const Config* p, const Weights* w, RunState* s, int token, int pos) {
  int dim = p->dim, hd = p->head_dim, kv_dim = p->n_kv_heads * hd, q_dim = p->n_heads * hd;
  int kv_mul = p->n_heads / p->n_kv_heads, hidden_dim = p->hidden_dim;
  memcpy(s->x, w->embed + (size_t)token * dim, dim * sizeof(float));
  for (int l = 0; l < p->n_layers; l++) {
    rmsnorm(s->xb, s->x, w->ln1[l], dim, p->eps);
    size_t loff = (size_t)l * p->seq_len * kv_dim;
    s->k = s->key_cache + loff + (size_t)pos * kv_dim;
    s->v = s->value_cache + loff + (size_t)pos * kv_dim;
    matmul(s->q, s->xb, w->wq[l], dim, q_dim);
    matmul(s->k, s->xb, w->wk[l], dim, kv_dim);
    matmul(s->v, s->xb, w->wv[l], dim, kv_dim);
    // RoPE exactly as run.c: one powf/cosf/sinf per pair index over the query
    // width, rotating k in the same pass while i < kv_dim. The pairs are llama2.c's
    // interleaved (i, i+1): main() undid HF's rotate_half row permutation of wq and wk.
    for (int i = 0; i < q_dim; i += 2) {
      int head_dim = i % hd;
      float freq = 1.0f / powf(p->theta, head_dim / (float)hd);
      float val = pos * freq;
      float fcr = cosf(val);
      float fci = sinf(val);
      int rotn = i < kv_dim ? 2 : 1;  // how many vectors? 2 = q & k, 1 = q only
      for (int v = 0; v < rotn; v++) {
        float* vec = v == 0 ? s->q : s->k;  // the vector to rotate (query or key)
        float v0 = vec[i];
        float v1 = vec[i + 1];
        vec[i] = v0 * fcr - v1 * fci;
        vec[i + 1] = v0 * fci + v1 * fcr;
      }
    }
    int h;
#pragma omp parallel for private(h)
    for (h = 0; h < p->n_heads; h++) {
      float* q = s->q + h * hd;
      float* att = s->att + (size_t)h * p->seq_len;
      for (int t = 0; t <= pos; t++) {
        const float* k = s->key_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * hd;
        float score = 0.0f;
        for (int i = 0; i < hd; i++) score += q[i] * k[i];
        att[t] = score / sqrtf((float)hd);
      }
      softmax(att, pos + 1);
      float* xb = s->xb + h * hd;
      memset(xb, 0, hd * sizeof(float));
      for (int t = 0; t <= pos; t++) {
        const float* v = s->value_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * hd;
        float a = att[t];
        for (int i = 0; i < hd; i++) xb[i] += a * v[i];
      }
    }
    matmul(s->xb2, s->xb, w->wo[l], q_dim, dim);
    for (int i = 0; i < dim; i++) s->x[i] += s->xb2[i];
    rmsnorm(s->xb, s->x, w->ln2[l], dim, p->eps);
    matmul(s->hb, s->xb, w->w1[l], dim, hidden_dim);
    matmul(s->hb2, s->xb, w->w3[l], dim, hidden_dim);
    for (int i = 0; i < hidden_dim; i++) {
      float val = s->hb[i];
      val *= (1.0f / (1.0f + expf(-val)));
      val *= s->hb2[i];
      s->hb[i] = val;
    }
    matmul(s->xb, s->hb, w->w2[l], hidden_dim, dim);
    for (int i = 0; i < dim; i++) s->x[i] += s->xb[i];
  }
  rmsnorm(s->x, s->x, w->norm, dim, p->eps);
  matmul(s->logits, s->x, w->cls, p->dim, p->vocab_size);
  return s->logits;
}

static int argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const std::string& msg) {
  fprintf(stderr, "echokv-bench-llama2c: %s\n", msg.c_str());
  exit(1);
}

// HF checkpoints converted from llama2.c (and HF Llama in general) permute the rows of
// q_proj and k_proj within each head so that rotate_half pairs (j, j + hd/2); run.c
// pairs (2j, 2j+1). Undo it once at load time (HF row h*hd + a*hd/2 + j becomes
// llama2.c row h*hd + 2j + a), so that forward() can rotate exactly as run.c does.
// Scores q.k are sums over the same products in another order, so the model is the same.
static const float* unpermute_rope_rows(const float* w, int heads, int hd, int n) {
  float* out = (float*)malloc((size_t)heads * hd * n * sizeof(float));
  int half = hd / 2;
  for (int h = 0; h < heads; h++)
    for (int a = 0; a < 2; a++)
      for (int j = 0; j < half; j++)
        memcpy(out + ((size_t)h * hd + 2 * j + a) * n, w + ((size_t)h * hd + a * half + j) * n, n * sizeof(float));
  return out;
}

static void reset_cache(const Config* p, RunState* s) {
  size_t n = (size_t)p->n_layers * p->seq_len * p->n_kv_heads * p->head_dim;
  memset(s->key_cache, 0, n * sizeof(float));
  memset(s->value_cache, 0, n * sizeof(float));
}

// Replays every case of a stories260K golden file (llama2.c run.c's greedy ids):
// prompt ids, then greedy decoding of as many tokens as the case has. 0 if all match.
static int check_golden(const Config* p, const Weights* w, RunState* s, const nlohmann::json& cases) {
  int failed = 0;
  for (const auto& c : cases) {
    std::vector<int> prompt = c.at("prompt_ids").get<std::vector<int>>();
    std::vector<int> want = c.at("generated_ids").get<std::vector<int>>();
    std::string name = c.at("name").get<std::string>();
    reset_cache(p, s);
    int pos = 0;
    for (int id : prompt) forward(p, w, s, id, pos++);
    int first_bad = -1;
    for (size_t i = 0; i < want.size(); i++) {
      int next = argmax(s->logits, p->vocab_size);
      if (next != want[i]) {
        first_bad = (int)i;
        printf("golden %s: generated id %zu is %d, run.c gave %d\n", name.c_str(), i, next, want[i]);
        break;
      }
      if (i + 1 < want.size()) forward(p, w, s, next, pos++);
    }
    if (first_bad < 0) printf("golden %s: %zu/%zu generated ids match run.c\n", name.c_str(), want.size(), want.size());
    else failed++;
  }
  return failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  std::string dir, golden;
  int context = 512, decode = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") dir = argv[i + 1];
    else if (a == "--context") context = atoi(argv[i + 1]);
    else if (a == "--decode") decode = atoi(argv[i + 1]);
    else if (a == "--golden") golden = argv[i + 1];
    else die("unknown flag " + a);
  }
  if (dir.empty()) die("usage: --model DIR [--context N] [--decode M] [--golden FILE]");
  std::ifstream cf(dir + "/config.json");
  if (!cf) die("cannot read " + dir + "/config.json");
  nlohmann::json cj = nlohmann::json::parse(cf);
  Config p;
  p.dim = cj.at("hidden_size");
  p.hidden_dim = cj.at("intermediate_size");
  p.n_layers = cj.at("num_hidden_layers");
  p.n_heads = cj.at("num_attention_heads");
  p.n_kv_heads = cj.value("num_key_value_heads", p.n_heads);
  p.head_dim = cj.contains("head_dim") && !cj["head_dim"].is_null() ? cj["head_dim"].get<int>() : p.dim / p.n_heads;
  p.vocab_size = cj.at("vocab_size");
  p.eps = cj.value("rms_norm_eps", 1e-6f);
  p.theta = cj.value("rope_theta", 10000.0f);
  p.tied = cj.value("tie_word_embeddings", false);
  p.seq_len = context + decode + 1;
  nlohmann::json golden_cases;
  if (!golden.empty()) {
    std::ifstream gf(golden);
    if (!gf) die("cannot read " + golden);
    golden_cases = nlohmann::json::parse(gf).at("cases");
    for (const auto& c : golden_cases) {
      int need = (int)(c.at("prompt_ids").size() + c.at("generated_ids").size());
      if (need > p.seq_len) p.seq_len = need;
    }
  }
  if (p.n_layers > 256) die("too many layers");
  if (p.head_dim % 2 != 0) die("head_dim must be even for RoPE");

  std::string path = dir + "/model.safetensors";
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + path);
  struct stat st;
  fstat(fd, &st);
  const uint8_t* base = (const uint8_t*)mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  uint64_t hlen;
  memcpy(&hlen, base, 8);
  nlohmann::json header = nlohmann::json::parse(std::string((const char*)base + 8, hlen));
  const uint8_t* data = base + 8 + hlen;
  auto get = [&](const std::string& name) -> const float* {
    if (!header.contains(name)) die("missing tensor " + name);
    if (header[name].at("dtype") != "F32") die("this reference reads F32 only: " + name);
    return (const float*)(data + header[name].at("data_offsets")[0].get<uint64_t>());
  };
  Weights w;
  w.embed = get("model.embed_tokens.weight");
  for (int l = 0; l < p.n_layers; l++) {
    std::string b = "model.layers." + std::to_string(l) + ".";
    w.ln1[l] = get(b + "input_layernorm.weight");
    w.ln2[l] = get(b + "post_attention_layernorm.weight");
    w.wq[l] = unpermute_rope_rows(get(b + "self_attn.q_proj.weight"), p.n_heads, p.head_dim, p.dim);
    w.wk[l] = unpermute_rope_rows(get(b + "self_attn.k_proj.weight"), p.n_kv_heads, p.head_dim, p.dim);
    w.wv[l] = get(b + "self_attn.v_proj.weight");
    w.wo[l] = get(b + "self_attn.o_proj.weight");
    w.w1[l] = get(b + "mlp.gate_proj.weight");
    w.w2[l] = get(b + "mlp.down_proj.weight");
    w.w3[l] = get(b + "mlp.up_proj.weight");
  }
  w.norm = get("model.norm.weight");
  w.cls = p.tied ? w.embed : get("lm_head.weight");

  int kv_dim = p.n_kv_heads * p.head_dim;
  RunState s;
  s.x = (float*)calloc(p.dim, sizeof(float));
  s.xb = (float*)calloc(p.n_heads * p.head_dim > p.dim ? p.n_heads * p.head_dim : p.dim, sizeof(float));
  s.xb2 = (float*)calloc(p.dim, sizeof(float));
  s.hb = (float*)calloc(p.hidden_dim, sizeof(float));
  s.hb2 = (float*)calloc(p.hidden_dim, sizeof(float));
  s.q = (float*)calloc(p.n_heads * p.head_dim, sizeof(float));
  s.att = (float*)calloc((size_t)p.n_heads * p.seq_len, sizeof(float));
  s.logits = (float*)calloc(p.vocab_size, sizeof(float));
  s.key_cache = (float*)calloc((size_t)p.n_layers * p.seq_len * kv_dim, sizeof(float));
  s.value_cache = (float*)calloc((size_t)p.n_layers * p.seq_len * kv_dim, sizeof(float));

  if (!golden.empty()) return check_golden(&p, &w, &s, golden_cases);

  // Context: BOS then a fixed pseudo-random token pattern (the same as echokv's bench).
  double t0 = now_s();
  for (int pos = 0; pos < context; pos++) {
    int token = pos == 0 ? 1 : (pos * 7919 + 13) % p.vocab_size;
    forward(&p, &w, &s, token, pos);
  }
  double t1 = now_s();
  int next = argmax(s.logits, p.vocab_size);
  printf("greedy:");
  for (int i = 0; i < decode; i++) {
    float* logits = forward(&p, &w, &s, next, context + i);
    next = argmax(logits, p.vocab_size);
    if (i < 16) printf(" %d", next);
  }
  double t2 = now_s();
  printf("\nllama2c-style: context %d: prefill(token-by-token) %.1f tok/s, decode %.1f tok/s (%d tokens)\n",
         context, context / (t1 - t0), decode / (t2 - t1), decode);
  return 0;
}
