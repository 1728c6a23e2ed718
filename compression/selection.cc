#include "compression/selection.h"

#include "common/status_macros.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/score.h"

namespace echokv::compression::internal {

at::Tensor KeepAll(int64_t groups, int64_t n) { return Range(groups, 0, n); }

at::Tensor Range(int64_t groups, int64_t begin, int64_t n) {
  return at::arange(begin, n, at::kLong).unsqueeze(0).expand({groups, n - begin}).contiguous();
}

at::Tensor TopKPrefixPlusTail(const at::Tensor& group_scores, int64_t prefix, int64_t k,
                              int64_t n) {
  const int64_t groups = group_scores.size(0);
  at::Tensor tail = Range(groups, prefix, n);
  if (prefix <= 0 || k <= 0) return tail;
  // Every top-k index is < prefix <= every tail index, so the result stays ascending.
  at::Tensor top = kernels::TopKIndices(group_scores.narrow(1, 0, prefix), k);
  return at::cat({top, tail}, 1);
}

int64_t MassTargetCount(const at::Tensor& rank_scores, const at::Tensor& mass_scores, int64_t prefix,
                        int64_t k_max, double target) {
  k_max = std::min(k_max, prefix);
  if (k_max <= 1) return std::max<int64_t>(k_max, 0);
  const int64_t groups = mass_scores.size(0);
  // Float64 on the CPU: the shares are small and n can be 8K+.
  const at::Tensor mass = mass_scores.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor rank = rank_scores.detach().narrow(1, 0, prefix).to(at::kCPU, at::kFloat).contiguous();
  // Descending and stable: equal scores keep the lower index first, as TopKIndices does.
  const at::Tensor order = std::get<1>(rank.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true));
  const at::Tensor held = mass.narrow(1, 0, prefix).gather(1, order).cumsum(1).contiguous();  // [G, prefix]
  const at::Tensor total = mass.sum(1);                                                      // [G]
  const at::Tensor tail = mass.narrow(1, prefix, mass.size(1) - prefix).sum(1);               // [G]
  int64_t k = 1;
  for (int64_t g = 0; g < groups; ++g) {
    const double t = total[g].item<double>();
    if (!(t > 0)) continue;
    const double need = target * t - tail[g].item<double>();
    const double* c = held.data_ptr<double>() + g * prefix;
    // The first k whose top-k reaches `need` (cumulative sums rise: binary search);
    // rounding can leave target = 1 a hair short of the total, so k_max is the cap.
    const int64_t first = std::lower_bound(c, c + k_max, need) - c + 1;
    k = std::max(k, std::min(first, k_max));
    if (k == k_max) break;
  }
  return k;
}

at::Tensor PooledPrefixGroupScores(const at::Tensor& head_scores, int64_t prefix,
                                   int64_t kernel, int64_t groups) {
  // docs/ALGORITHM.md §8.2: restrict to the candidate prefix, pool per head, then sum the
  // r heads of each group.
  at::Tensor pooled = kernels::MaxPool1d(head_scores.narrow(1, 0, prefix).contiguous(), kernel);
  return kernels::SumHeadsPerGroup(pooled, groups);
}

WindowQueries LastQueries(const CompressionInput& input, int layer, int64_t count) {
  WindowQueries w;
  if (layer >= static_cast<int>(input.last_queries.size())) return w;
  const at::Tensor& q = input.last_queries[layer];
  if (!q.defined() || q.dim() != 3) return w;
  const int64_t n = q.size(1);
  const int64_t m = count < 0 ? n : std::min(count, n);
  const at::Device device = input.context->keys(layer).device();
  w.queries = q.narrow(1, n - m, m).to(device, at::kFloat);
  std::vector<int64_t> pos(input.last_query_positions.end() - m,
                           input.last_query_positions.end());
  w.positions = at::tensor(pos, at::kLong);
  return w;
}

at::Tensor CausalHeadScores(const model::KvCache& context, int layer, const WindowQueries& q) {
  kernels::ScoreOptions so;
  so.query_positions = q.positions;
  so.key_positions = context.positions(layer);
  return kernels::AttentionScores(q.queries, context.keys(layer), so);
}

at::Tensor FutureHeadScores(const model::KvCache& context, int layer, const at::Tensor& queries) {
  const at::Tensor keys = context.keys(layer);
  kernels::ScoreOptions so;  // no positions: every context key is visible
  return kernels::AttentionScores(queries.to(keys.device(), at::kFloat), keys, so);
}

absl::StatusOr<at::Tensor> SnapKvSelect(const model::KvCache& context, int layer,
                                        const WindowQueries& window_queries, int64_t window,
                                        int64_t kernel, int64_t capacity, bool* scored,
                                        at::Tensor* scores_out, at::Tensor* probe_out,
                                        std::optional<double> target_mass) {
  const int64_t groups = context.num_kv_heads();
  const int64_t n = context.size(layer);
  if (n <= capacity) return KeepAll(groups, n);  // §8.3: L <= capacity keeps all
  // A capacity below the window keeps the last `capacity` entries (the window shrinks).
  const int64_t w = std::min(window, capacity);
  const int64_t prefix = n - w;
  int64_t k = capacity - w;
  if (k == 0) return Range(groups, prefix, n);  // §8.3: B = window keeps only the window
  if (window_queries.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "last_queries: layer ", layer, " has no context queries; SnapKV scoring needs the "
        "last snapkv_window queries of the prefill (PrefillNeeds::last_queries)"));
  }
  at::Tensor head_scores = CausalHeadScores(context, layer, window_queries);  // [H, n]
  at::Tensor probe;
  if (probe_out != nullptr || target_mass.has_value()) probe = kernels::SumHeadsPerGroup(head_scores, groups);
  if (probe_out != nullptr) *probe_out = probe;
  at::Tensor group_scores = PooledPrefixGroupScores(head_scores, prefix, kernel, groups);
  if (target_mass.has_value()) k = MassTargetCount(group_scores, probe, prefix, k, *target_mass);
  if (scored != nullptr) *scored = true;
  if (scores_out != nullptr) *scores_out = group_scores.to(at::kCPU, at::kFloat);
  return TopKPrefixPlusTail(group_scores, prefix, k, n);
}

absl::StatusOr<std::vector<at::Tensor>> SnapKvSelectLayers(const CompressionConfig& config,
                                                           const CompressionInput& input,
                                                           const std::vector<int64_t>& capacities,
                                                           bool* scored,
                                                           std::vector<at::Tensor>* scores_out,
                                                           std::vector<at::Tensor>* probe_out,
                                                           std::optional<double> target_mass) {
  std::vector<at::Tensor> kept;
  if (scores_out != nullptr) scores_out->assign(input.context->num_layers(), at::Tensor());
  if (probe_out != nullptr) probe_out->assign(input.context->num_layers(), at::Tensor());
  for (int l = 0; l < input.context->num_layers(); ++l) {
    ECHOKV_ASSIGN_OR_RETURN(
        at::Tensor idx, SnapKvSelect(*input.context, l, LastQueries(input, l, config.snapkv_window),
                                     config.snapkv_window, config.snapkv_kernel, capacities[l], scored,
                                     scores_out != nullptr ? &(*scores_out)[l] : nullptr,
                                     probe_out != nullptr ? &(*probe_out)[l] : nullptr, target_mass));
    kept.push_back(std::move(idx));
  }
  return kept;
}

void RecordRetainedMass(const at::Tensor& group_scores, const at::Tensor& kept, int layer, int num_layers,
                        CompressionReport* report) {
  const int64_t groups = kept.size(0);
  const size_t size = static_cast<size_t>(num_layers) * static_cast<size_t>(groups);
  if (report->retained_mass.size() != size) report->retained_mass.assign(size, -1.0);
  // Sums in float64: n can be 8K+ entries of small shares.
  const at::Tensor s = group_scores.detach().to(at::kCPU, at::kDouble);
  const at::Tensor total = s.sum(1);                                       // [G]
  const at::Tensor held = s.gather(1, kept.to(at::kCPU, at::kLong)).sum(1);  // [G]
  const double* t = total.data_ptr<double>();
  const double* h = held.data_ptr<double>();
  for (int64_t g = 0; g < groups; ++g) {
    if (t[g] > 0) report->retained_mass[static_cast<size_t>(layer) * groups + g] = std::min(1.0, h[g] / t[g]);
  }
}

std::vector<int64_t> PyramidKvBudgets(int64_t budget, int64_t window, int num_layers) {
  const int64_t w = std::min(window, budget);
  const int64_t c = budget - w;
  const int64_t b_min = c / 20;
  const int64_t b_max = 2 * c - b_min;
  std::vector<int64_t> out;
  if (num_layers <= 1) {
    out.assign(std::max(num_layers, 0), c + w);
    return out;
  }
  const int64_t den = num_layers - 1;
  for (int l = 0; l < num_layers; ++l) {
    // B_max - (B_max - B_min)·l/den = num/den exactly; num >= 0.
    const int64_t num = b_max * den - (b_max - b_min) * l;
    int64_t q = num / den;
    const int64_t r2 = 2 * (num % den);
    if (r2 > den || (r2 == den && q % 2 != 0)) ++q;  // round half to even
    out.push_back(q + w);
  }
  return out;
}

int GreedyToken(const at::Tensor& logits) {
  at::Tensor l = logits.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const float* p = l.data_ptr<float>();
  const int64_t v = l.numel();
  int best = 0;
  bool found = false;
  for (int64_t i = 0; i < v; ++i) {
    if (p[i] != p[i]) continue;  // NaN never wins
    if (!found || p[i] > p[best]) {
      best = static_cast<int>(i);
      found = true;
    }
  }
  return best;
}

double OverlapSum(const at::Tensor& a, const at::Tensor& b, int64_t* count) {
  at::Tensor ac = a.to(at::kCPU, at::kLong).contiguous();
  at::Tensor bc = b.to(at::kCPU, at::kLong).contiguous();
  const int64_t groups = bc.size(0);
  const int64_t na = ac.size(1);
  const int64_t nb = bc.size(1);
  double sum = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t* pa = ac.data_ptr<int64_t>() + g * na;
    const int64_t* pb = bc.data_ptr<int64_t>() + g * nb;
    int64_t i = 0, j = 0, shared = 0;
    while (i < na && j < nb) {
      if (pa[i] == pb[j]) {
        ++shared;
        ++i;
        ++j;
      } else if (pa[i] < pb[j]) {
        ++i;
      } else {
        ++j;
      }
    }
    sum += nb == 0 ? 1.0 : static_cast<double>(shared) / static_cast<double>(nb);
  }
  *count += groups;
  return sum;
}

void PhaseClock::End(const std::string& phase, int64_t done, int64_t total) {
  const auto now = std::chrono::steady_clock::now();
  report_->phases.push_back({phase, std::chrono::duration<double>(now - start_).count()});
  Progress(phase, done, total);
  start_ = std::chrono::steady_clock::now();  // the callback's time belongs to no phase
}

void PhaseClock::Progress(const std::string& phase, int64_t done, int64_t total) const {
  if (input_.progress) input_.progress(phase, done, total);
}

}  // namespace echokv::compression::internal
