// The non-lookahead policies of docs/ALGORITHM.md §4 / §8.3-§8.6: FullKV, StreamingLLM,
// H2O, SnapKV, PyramidKV. Each selects per layer and per KV group.
#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/selection.h"
#include "kernels/score.h"

namespace echokv::compression::internal {
namespace {

// The retained mass of every layer whose selection was scored (probes[l] defined).
void RecordLayersMass(const std::vector<at::Tensor>& probes, CompressionResult* result) {
  for (size_t l = 0; l < probes.size(); ++l) {
    if (!probes[l].defined()) continue;
    RecordRetainedMass(probes[l], result->indices[l], static_cast<int>(l), static_cast<int>(probes.size()),
                       &result->report);
  }
}

}  // namespace

absl::Status RunFull(const CompressionConfig& config, const CompressionInput& input,
                     CompressionResult* result) {
  PhaseClock clock(input, &result->report);
  const model::KvCache& ctx = *input.context;
  for (int l = 0; l < ctx.num_layers(); ++l) {
    result->indices.push_back(KeepAll(ctx.num_kv_heads(), ctx.size(l)));
  }
  clock.End("select");
  return absl::OkStatus();
}

absl::Status RunStreamingLlm(const CompressionConfig& config, const CompressionInput& input,
                             CompressionResult* result) {
  // docs/ALGORITHM.md §8.6: the first 4 entries (attention sinks) plus the last B-4; with
  // B < 4 only the first B sinks.
  PhaseClock clock(input, &result->report);
  const model::KvCache& ctx = *input.context;
  const int64_t groups = ctx.num_kv_heads();
  const int64_t budget = config.budget;
  const int64_t sinks = std::min<int64_t>(4, budget);
  const int64_t recent = budget - sinks;
  for (int l = 0; l < ctx.num_layers(); ++l) {
    const int64_t n = ctx.size(l);
    if (n <= budget) {
      result->indices.push_back(KeepAll(groups, n));
      continue;
    }
    result->indices.push_back(at::cat({Range(groups, 0, sinks), Range(groups, n - recent, n)}, 1));
  }
  clock.End("select");
  return absl::OkStatus();
}

absl::Status RunH2o(const CompressionConfig& config, const CompressionInput& input,
                    CompressionResult* result) {
  // docs/ALGORITHM.md §8.5: recent = floor(B/2) newest entries, heavy = B - recent from the
  // older entries by the group sum of the causal column sums (diagonal included) of all
  // available context queries (a grown session has only its new tokens' queries).
  PhaseClock clock(input, &result->report);
  const model::KvCache& ctx = *input.context;
  const int64_t groups = ctx.num_kv_heads();
  const int64_t budget = config.budget;
  const int64_t recent = budget / 2;
  const int64_t heavy = budget - recent;
  bool scored = false;
  if (input.record_scores) result->final_scores.assign(ctx.num_layers(), at::Tensor());
  for (int l = 0; l < ctx.num_layers(); ++l) {
    const int64_t n = ctx.size(l);
    if (n <= budget) {
      result->indices.push_back(KeepAll(groups, n));
      continue;
    }
    if (!input.h2o_scores.empty()) {  // accumulated by the caller (engine, tiered turns)
      const at::Tensor scores = input.h2o_scores[l].to(at::kCPU, at::kFloat);
      if (input.record_scores) result->final_scores[l] = scores.narrow(1, 0, n - recent).clone();
      result->indices.push_back(TopKPrefixPlusTail(scores, n - recent, heavy, n));
      RecordRetainedMass(scores, result->indices.back(), l, ctx.num_layers(), &result->report);
      scored = true;
      continue;
    }
    WindowQueries q = LastQueries(input, l, /*count=*/-1);
    if (q.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "last_queries: layer ", l, " has no context queries; h2o needs every context "
          "query of the prefill (PrefillNeeds::last_queries = -1)"));
    }
    at::Tensor col = kernels::CausalColumnSums(q.queries, q.positions, ctx.keys(l),
                                               ctx.positions(l));            // [H, n]
    at::Tensor group_scores = kernels::SumHeadsPerGroup(col, groups);       // [G, n]
    if (input.record_scores) {
      result->final_scores[l] = group_scores.narrow(1, 0, n - recent).to(at::kCPU, at::kFloat).clone();
    }
    result->indices.push_back(TopKPrefixPlusTail(group_scores, n - recent, heavy, n));
    RecordRetainedMass(group_scores, result->indices.back(), l, ctx.num_layers(), &result->report);
    scored = true;
  }
  result->report.scoring_passes = scored ? 1 : 0;
  clock.End("select");
  return absl::OkStatus();
}

absl::Status RunSnapKv(const CompressionConfig& config, const CompressionInput& input,
                       CompressionResult* result) {
  // docs/ALGORITHM.md §8.3.
  PhaseClock clock(input, &result->report);
  const model::KvCache& ctx = *input.context;
  bool scored = false;
  std::vector<at::Tensor> probes;
  ECHOKV_ASSIGN_OR_RETURN(
      result->indices,
      SnapKvSelectLayers(config, input, std::vector<int64_t>(ctx.num_layers(), config.budget), &scored,
                         input.record_scores ? &result->final_scores : nullptr, &probes, config.target_mass));
  RecordLayersMass(probes, result);
  result->report.scoring_passes = scored ? 1 : 0;
  clock.End("select");
  return absl::OkStatus();
}

absl::Status RunPyramidKv(const CompressionConfig& config, const CompressionInput& input,
                          CompressionResult* result) {
  // docs/ALGORITHM.md §8.4: SnapKV scoring with per-layer budgets falling linearly.
  PhaseClock clock(input, &result->report);
  const model::KvCache& ctx = *input.context;
  const std::vector<int64_t> budgets =
      PyramidKvBudgets(config.budget, config.snapkv_window, ctx.num_layers());
  bool scored = false;
  std::vector<at::Tensor> probes;
  ECHOKV_ASSIGN_OR_RETURN(result->indices,
                          SnapKvSelectLayers(config, input, budgets, &scored,
                                             input.record_scores ? &result->final_scores : nullptr, &probes));
  RecordLayersMass(probes, result);
  result->report.scoring_passes = scored ? 1 : 0;
  clock.End("select");
  return absl::OkStatus();
}

}  // namespace echokv::compression::internal
