// Internal building blocks shared by the policies of compression/ (not a public API):
// index sets of a layer ([G, n] int64 CPU, ascending per group), SnapKV-style pooled
// selection, PyramidKV budgets, greedy argmax, overlap, and the per-policy entry points
// that Compress() dispatches to. docs/ALGORITHM.md §3-§4, §8.
//
//   at::Tensor keep = internal::KeepAll(/*groups=*/4, /*n=*/100);      // [4, 100]
//   std::vector<int64_t> b = internal::PyramidKvBudgets(64, 32, 5);    // 95 80 64 48 33
//   ECHOKV_ASSIGN_OR_RETURN(at::Tensor w, internal::SnapKvSelect(ctx, l, win, 7, 32, 128, &scored));
#ifndef ECHOKV_COMPRESSION_SELECTION_H_
#define ECHOKV_COMPRESSION_SELECTION_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/config.h"
#include "compression/policy.h"
#include "compression/report.h"
#include "model/kv_cache.h"

namespace echokv::compression::internal {

// Every entry of a layer: [G, n] int64 CPU rows 0..n-1.
at::Tensor KeepAll(int64_t groups, int64_t n);

// The entries [begin, n) of every group: [G, n - begin] int64 CPU.
at::Tensor Range(int64_t groups, int64_t begin, int64_t n);

// TopK_k of group_scores restricted to its first `prefix` columns, then the entries
// prefix..n-1 appended. group_scores: [G, >= prefix] float. Returns [G, min(k, prefix) +
// n - prefix] int64 CPU, ascending per group (ties of the top-k go to the lower index).
at::Tensor TopKPrefixPlusTail(const at::Tensor& group_scores, int64_t prefix, int64_t k,
                              int64_t n);

// The quality-targeted budget of docs/ALGORITHM.md §9: the fewest prefix entries k in
// [1, k_max] such that, in every group g, the top-k of rank_scores[g] (the order
// TopKPrefixPlusTail keeps; ties to the lower index) plus the tail prefix..n-1 hold at
// least `target` of mass_scores[g]'s total. rank_scores: [G, >= prefix]; mass_scores:
// [G, n] (unpooled, every entry; any device). k_max when no smaller k reaches it; a group
// whose mass sums to 0 asks for nothing.
int64_t MassTargetCount(const at::Tensor& rank_scores, const at::Tensor& mass_scores, int64_t prefix,
                        int64_t k_max, double target);

// Pooling of docs/ALGORITHM.md §8.2: head_scores [H, n] float -> first `prefix` columns ->
// max-pool(kernel) per head -> sum of the r heads of each group: [G, prefix] float32.
at::Tensor PooledPrefixGroupScores(const at::Tensor& head_scores, int64_t prefix,
                                   int64_t kernel, int64_t groups);

// Context queries with their positions (SnapKV's observation window, LAQ's last 8,
// H2O's queries): the last `count` of a layer's input.last_queries.
struct WindowQueries {
  at::Tensor queries;    // [H, m, d] float32 post-RoPE (device of the context)
  at::Tensor positions;  // [m] int64 CPU
  int64_t size() const { return queries.defined() ? queries.size(1) : 0; }
};
// The last min(count, N) of input.last_queries[layer] (count < 0: all N).
WindowQueries LastQueries(const CompressionInput& input, int layer, int64_t count);

// Per-head Eq. 3 scores [H, n] of context queries (causal denominators, §8.1) against
// layer `layer` of `context`.
at::Tensor CausalHeadScores(const model::KvCache& context, int layer, const WindowQueries& q);
// Per-head Eq. 3 scores [H, n] of queries at positions >= L ([H, m, d]): every context
// key visible, no lookahead key in the denominator (§8.1).
at::Tensor FutureHeadScores(const model::KvCache& context, int layer, const at::Tensor& queries);

// SnapKV selection of capacity `capacity` (§8.3 / §8.7): all n entries when n <=
// capacity; otherwise TopK_{capacity-w} of the pooled prefix 0..n-w-1 plus the last w
// entries, w = min(window, capacity). The window queries score the prefix; when fewer
// than `window` are available (grown sessions) the available ones are used. Sets
// *scored when Eq. 3 ran. Returns [G, min(capacity, n)] int64 CPU ascending.
// `scores_out` (may be null) receives the pooled group scores [G, prefix] it ranked.
// `probe_out` (may be null) receives the unpooled group scores [G, n] of the window
// queries over every entry (RecordRetainedMass), left alone when nothing was scored.
// `target_mass` (set: RunSnapKv with CompressionConfig::target_mass) keeps the fewest
// prefix entries that reach it (MassTargetCount), capacity - w at most.
absl::StatusOr<at::Tensor> SnapKvSelect(const model::KvCache& context, int layer,
                                        const WindowQueries& window_queries, int64_t window,
                                        int64_t kernel, int64_t capacity, bool* scored,
                                        at::Tensor* scores_out = nullptr, at::Tensor* probe_out = nullptr,
                                        std::optional<double> target_mass = std::nullopt);

// SnapKvSelect for every layer of input.context, layer l with capacity capacities[l],
// scored by the last config.snapkv_window context queries. Sets *scored when Eq. 3 ran.
// `scores_out` (may be null) receives each layer's ranked scores (SnapKvSelect).
absl::StatusOr<std::vector<at::Tensor>> SnapKvSelectLayers(const CompressionConfig& config,
                                                           const CompressionInput& input,
                                                           const std::vector<int64_t>& capacities,
                                                           bool* scored,
                                                           std::vector<at::Tensor>* scores_out = nullptr,
                                                           std::vector<at::Tensor>* probe_out = nullptr,
                                                           std::optional<double> target_mass = std::nullopt);

// The fidelity signal (CompressionReport::retained_mass): for layer `layer`, each
// group's share sum_{i in kept_g} s[g, i] / sum_i s[g, i] of the probe scores
// `group_scores` [G, n] (unpooled, every entry of the layer; any device) over the
// selection `kept` [G, k] int64. Sizes report->retained_mass to layers x G (-1) first.
// A group whose scores sum to 0 stays -1.
void RecordRetainedMass(const at::Tensor& group_scores, const at::Tensor& kept, int layer, int num_layers,
                        CompressionReport* report);

// PyramidKV per-layer budgets (window included) of docs/ALGORITHM.md §8.4: with
// w = min(window, budget), C = budget - w, B_min = floor(C/20), B_max = 2C - B_min,
// layer l gets round-half-to-even(B_max - (B_max - B_min)·l/(layers-1)) + w, computed
// with exact integer arithmetic. One layer: C + w. The mean over layers is budget.
std::vector<int64_t> PyramidKvBudgets(int64_t budget, int64_t window, int num_layers);

// argmax of logits [V] (any device/float dtype); ties -> lowest id (§8.9).
int GreedyToken(const at::Tensor& logits);

// Sum over groups of |a_g ∩ b_g| / |b_g| (a, b: [G, *] int64 CPU ascending); adds the
// group count to *count. Empty b_g counts as overlap 1.
double OverlapSum(const at::Tensor& a, const at::Tensor& b, int64_t* count);

// Times phases with std::chrono::steady_clock and reports them (and progress).
class PhaseClock {
 public:
  PhaseClock(const CompressionInput& input, CompressionReport* report)
      : input_(input), report_(report), start_(std::chrono::steady_clock::now()) {}
  // Records the time since the previous End (or construction) as `phase` and reports
  // progress (phase, done, total) when a callback is set.
  void End(const std::string& phase, int64_t done = 1, int64_t total = 1);
  // Reports step progress within a phase (no timing).
  void Progress(const std::string& phase, int64_t done, int64_t total) const;

 private:
  const CompressionInput& input_;                 // progress callback
  CompressionReport* report_;                     // phases are appended here
  std::chrono::steady_clock::time_point start_;   // start of the current phase
};

// The single-phase policies (LAQ and EchoKV are state machines in task.cc). Each fills result->indices (one [G, n_l] tensor per layer) and the
// report's phases, forward/scoring passes, overlaps and lookahead tokens; Compress()
// fills the rest. Called only when some layer holds more than `budget` entries (except
// RunFull) and after the input was checked for the policy's needs.
absl::Status RunFull(const CompressionConfig& config, const CompressionInput& input,
                     CompressionResult* result);
absl::Status RunStreamingLlm(const CompressionConfig& config, const CompressionInput& input,
                             CompressionResult* result);
absl::Status RunH2o(const CompressionConfig& config, const CompressionInput& input,
                    CompressionResult* result);
absl::Status RunSnapKv(const CompressionConfig& config, const CompressionInput& input,
                       CompressionResult* result);
absl::Status RunPyramidKv(const CompressionConfig& config, const CompressionInput& input,
                          CompressionResult* result);

}  // namespace echokv::compression::internal

#endif  // ECHOKV_COMPRESSION_SELECTION_H_
