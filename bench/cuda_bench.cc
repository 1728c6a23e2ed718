// echokv-bench-cuda (CUDA build only): the CUDA kernels against the machine's own
// ceilings and LibTorch baselines on the same shapes, for scripts/gpu-check.sh.
// First the two ceilings, measured here: device-to-device copy bandwidth (bytes read +
// written) and a bf16 8192^3 matrix product. Then, with Llama-3-8B-like attention shapes
// (G = 8 KV groups, r = 4 query heads per group, d = 128, bf16):
//   decode   DecodeAttentionBatch over B sessions with n entries each (compact caches of
//            256 and 1,024 against a full 8,192), as a share of the copy bandwidth (K and
//            V bytes per step), beside scaled_dot_product_attention(enable_gqa) per session;
//   scores   the Eq. 3 kernel (32 window queries, L = 8K / 32K) beside its ATen composition;
//   top-k    1,024 of 32K per group;
//   prefill  ChunkAttention (FlashAttention) on an 8K / 32K causal prefill, as a share of
//            the bf16 peak (causal FLOPs: 2 H L^2 d).
// Every time is the median of 20 runs after 3 warm-ups, with CUDA events; inputs that are
// read are larger than the 60 MB L2 except where a row says "L2". Rows are markdown.
//   echokv-bench-cuda            # about a minute on an H200
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/prefill_attention.h"
#include "kernels/score.h"
#include "kernels/torch_compat.h"

namespace {

using echokv::kernels::ScoreOptions;
namespace kc = echokv::kernels::cuda;

bool Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "echokv-bench-cuda: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

// Median milliseconds of `fn` over `reps` runs (events on the current stream).
double MedianMs(const std::function<void()>& fn, int reps = 20, int warmup = 3) {
  cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    fn();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  Check(cudaGetLastError(), "timed work");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
T Value(absl::StatusOr<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "echokv-bench-cuda: %s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(r);
}

}  // namespace

int main() {
  if (!kc::DeviceAvailable()) {
    std::fprintf(stderr, "echokv-bench-cuda: no CUDA device\n");
    return 2;
  }
  const at::Device dev(at::kCUDA, 0);
  const at::TensorOptions bf16 = at::TensorOptions().dtype(at::kBFloat16).device(dev);
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("| device | %s, %d SMs, %.0f MB L2, %.0f GiB |\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6, prop.totalGlobalMem / 1073741824.0);

  // ---- ceilings ----
  at::Tensor src = at::rand({int64_t{1} << 30}, at::TensorOptions().dtype(at::kFloat).device(dev));  // 4 GiB
  at::Tensor dst = at::empty_like(src);
  const double copy_ms = MedianMs([&] { dst.copy_(src); });
  const double copy_gbs = 2.0 * src.nbytes() / (copy_ms * 1e6);
  src = at::Tensor();
  dst = at::Tensor();
  at::Tensor ma = at::randn({8192, 8192}, bf16), mb = at::randn({8192, 8192}, bf16);
  const double mm_ms = MedianMs([&] { at::mm(ma, mb); }, 10);
  const double peak_tflops = 2.0 * 8192.0 * 8192.0 * 8192.0 / (mm_ms * 1e9);
  ma = at::Tensor();
  mb = at::Tensor();
  std::printf("| ceiling | copy %.0f GB/s (read + write) | bf16 matmul 8192^3 %.0f TFLOP/s |\n", copy_gbs, peak_tflops);

  const int64_t G = 8, r = 4, H = G * r, d = 128;
  // ---- decode ----
  std::printf("| decode B | n | echokv ms | GB/s | %% of copy | SDPA per session ms | speed-up |\n");
  for (int64_t n : {int64_t{256}, int64_t{1024}, int64_t{8192}}) {
    for (int64_t batch : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{256}}) {
      at::Tensor k = at::randn({batch, G, n, d}, bf16), v = at::randn({batch, G, n, d}, bf16);
      at::Tensor q = at::randn({batch, H, d}, bf16);
      kc::DecodeBatchInput in;
      in.q = q;
      for (int64_t b = 0; b < batch; ++b) {
        in.keys.push_back(k[b]);
        in.values.push_back(v[b]);
      }
      const double ms = MedianMs([&] { Value(kc::DecodeAttentionBatch(in), "decode"); });
      const double bytes = 2.0 * batch * G * n * d * 2;
      const double gbs = bytes / (ms * 1e6);
      double sdpa_ms = 0;
#if ECHOKV_TORCH_HAS_SDPA_GQA
      sdpa_ms = MedianMs([&] {
        for (int64_t b = 0; b < batch; ++b) {
          at::scaled_dot_product_attention(q[b].view({1, H, 1, d}), k[b].unsqueeze(0), v[b].unsqueeze(0), {}, 0.0,
                                           false, {}, /*enable_gqa=*/true);
        }
      });
#endif
      std::printf("| %ld | %ld%s | %.3f | %.0f | %.0f%% | %.3f | %.1fx |\n", static_cast<long>(batch),
                  static_cast<long>(n), bytes < 60e6 ? " (L2)" : "", ms, gbs, 100.0 * gbs / copy_gbs, sdpa_ms,
                  sdpa_ms / ms);
    }
  }

  // ---- scores and top-k ----
  std::printf("| scores L | echokv ms | GB/s (2 passes over K) | ATen composition ms | top-k 1024 ms |\n");
  for (int64_t L : {int64_t{8192}, int64_t{32768}}) {
    at::Tensor keys = at::randn({G, L, d}, bf16);
    at::Tensor queries = at::randn({H, 32, d}, at::TensorOptions().dtype(at::kFloat).device(dev));
    const double ms = MedianMs([&] { Value(kc::AttentionScores(queries, keys, ScoreOptions()), "scores"); });
    echokv::kernels::RegisterDeviceScoreKernels(nullptr);
    const double aten_ms = MedianMs([&] { echokv::kernels::AttentionScores(queries, keys, ScoreOptions()); }, 5, 1);
    at::Tensor scores = Value(kc::AttentionScores(queries, keys, ScoreOptions()), "scores").view({G, r, L}).sum(1);
    const double topk_ms = MedianMs([&] { Value(kc::TopKIndices(scores, 1024), "top-k"); });
    std::printf("| %ld | %.3f | %.0f | %.3f | %.3f |\n", static_cast<long>(L), ms, 2.0 * keys.nbytes() / (ms * 1e6),
                aten_ms, topk_ms);
  }

  // ---- prefill attention ----
  std::printf("| prefill L | backend | ms | TFLOP/s | %% of bf16 peak |\n");
  for (int64_t L : {int64_t{8192}, int64_t{32768}}) {
    at::Tensor q = at::randn({H, L, d}, bf16), k = at::randn({G, L, d}, bf16), v = at::randn({G, L, d}, bf16);
    const double ms = MedianMs([&] { Value(echokv::kernels::ChunkAttention(q, k, v), "prefill"); }, 5, 1);
    const double tflops = 2.0 * H * static_cast<double>(L) * L * d / (ms * 1e9);
    std::printf("| %ld | %s | %.2f | %.0f | %.0f%% |\n", static_cast<long>(L),
                echokv::kernels::ChunkAttentionBackend(q).c_str(), ms, tflops, 100.0 * tflops / peak_tflops);
  }
  return Check(cudaDeviceSynchronize(), "end") ? 0 : 1;
}
