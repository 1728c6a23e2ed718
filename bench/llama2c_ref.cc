// A plain C implementation of the Llama forward pass in the style of llama2.c's
// run.c (one token at a time, float32, naive loops, OpenMP over matmul rows and
// heads), reading the same Hugging Face directory (config.json + F32
// model.safetensors) that echokv reads. It is the baseline of the decode-speed
// target in docs/BENCHMARKS.md: echokv must decode at least as fast on the same
// weights. Only the loader uses C++ (JSON); the compute is plain C.
//
//   echokv-bench-llama2c --model DIR --context 512 --decode 128
//   -> prints prefill (token-by-token) and decode tokens/s, and the greedy ids.
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

// HF rotate_half RoPE on one head vector (pairs i and i + hd/2).
static void rope(float* v, int hd, int pos, float theta) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    float freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    float val = (float)pos * freq;
    float fcr = cosf(val), fci = sinf(val);
    float v0 = v[i], v1 = v[i + half];
    v[i] = v0 * fcr - v1 * fci;
    v[i + half] = v0 * fci + v1 * fcr;
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
    for (int h = 0; h < p->n_heads; h++) rope(s->q + h * hd, hd, pos, p->theta);
    for (int h = 0; h < p->n_kv_heads; h++) rope(s->k + h * hd, hd, pos, p->theta);
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

int main(int argc, char** argv) {
  std::string dir;
  int context = 512, decode = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") dir = argv[i + 1];
    else if (a == "--context") context = atoi(argv[i + 1]);
    else if (a == "--decode") decode = atoi(argv[i + 1]);
    else die("unknown flag " + a);
  }
  if (dir.empty()) die("usage: --model DIR [--context N] [--decode M]");
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
  if (p.n_layers > 256) die("too many layers");

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
    w.wq[l] = get(b + "self_attn.q_proj.weight");
    w.wk[l] = get(b + "self_attn.k_proj.weight");
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
