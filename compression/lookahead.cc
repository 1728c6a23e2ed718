// The lookahead policies: LAQ (ALGORITHM.md §4, §8.7) and EchoKV (§3, §8.8-§8.9).
// Both drive one-token decode steps through LookaheadDecoder on workspace views that
// hold, per layer and group, only the selected context entries plus the lookahead KV.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/selection.h"
#include "kernels/rope.h"
#include "kernels/score.h"

namespace echokv::compression::internal {
namespace {

// LAQ's final observation window (the official code's last 8 context queries).
constexpr int64_t kLaqWindow = 8;

// Per layer, the query vectors [H, d] recorded by the decode steps so far.
using QueryLog = std::vector<std::vector<at::Tensor>>;

// Runs `steps` greedy decode steps on `view` (§8.9): decodes *token, records every
// layer's post-RoPE queries into *log, appends argmax to *tokens and makes it *token.
absl::Status DecodeSteps(const CompressionInput& input, const std::string& phase, int steps,
                         PhaseClock* clock, model::KvCache* view, int* token, QueryLog* log,
                         CompressionReport* report) {
  const int layers = input.context->num_layers();
  const int64_t d = input.context->head_dim();
  const int64_t groups = input.context->num_kv_heads();
  for (int k = 1; k <= steps; ++k) {
    std::vector<int64_t> before(layers);
    for (int l = 0; l < layers; ++l) before[l] = view->size(l);
    ECHOKV_ASSIGN_OR_RETURN(LookaheadDecoder::Step step, input.decoder->DecodeStep(*token, view));
    ++report->forward_passes;
    if (static_cast<int>(step.queries.size()) != layers) {
      return absl::InternalError(absl::StrCat("decoder: step returned queries for ",
                                              step.queries.size(), " layers, expected ", layers));
    }
    if (!step.logits.defined() || step.logits.numel() == 0) {
      return absl::InternalError("decoder: step returned no logits");
    }
    for (int l = 0; l < layers; ++l) {
      const at::Tensor& q = step.queries[l];
      if (!q.defined() || q.dim() != 2 || q.size(1) != d || q.size(0) % groups != 0) {
        return absl::InternalError(absl::StrCat("decoder: layer ", l,
                                                " queries must be [H, ", d, "] with H a multiple of ",
                                                groups, ", got ", q.defined() ? q.dim() : -1, " dims"));
      }
      if (view->size(l) != before[l] + 1) {
        return absl::InternalError(absl::StrCat("decoder: layer ", l, " view holds ", view->size(l),
                                                " entries after a step, expected ", before[l] + 1));
      }
      (*log)[l].push_back(q.to(at::kFloat).clone());  // the decoder may reuse its buffers
    }
    *token = GreedyToken(step.logits);
    report->lookahead_tokens.push_back(*token);
    if (k < steps) clock->Progress(phase, k, steps);
  }
  clock->End(phase, steps, steps);
  return absl::OkStatus();
}

// [H, k, d] from k recorded [H, d] vectors of one layer.
at::Tensor Stack(const std::vector<at::Tensor>& qs) { return at::stack(qs, /*dim=*/1); }

}  // namespace

absl::Status RunLaq(const CompressionConfig& config, const CompressionInput& input,
                    CompressionResult* result) {
  CompressionReport& report = result->report;
  PhaseClock clock(input, &report);
  const model::KvCache& ctx = *input.context;
  const int layers = ctx.num_layers();
  const int64_t groups = ctx.num_kv_heads();
  const int64_t budget = config.budget;
  const int64_t b1 = config.EffectiveWorkspace();

  // Workspace: SnapKV selection of capacity B1 (§8.7); the whole context when n <= B1.
  bool scored = false;
  ECHOKV_ASSIGN_OR_RETURN(std::vector<at::Tensor> workspace,
                          SnapKvSelectLayers(config, input, std::vector<int64_t>(layers, b1), &scored));
  if (scored) ++report.scoring_passes;
  clock.End("bootstrap");

  // T greedy steps on the frozen workspace (reported as "round1": LAQ's one round).
  ECHOKV_ASSIGN_OR_RETURN(model::KvCache view, model::KvCache::Gather(ctx, workspace));
  int token = GreedyToken(input.last_logits);
  QueryLog log(layers);
  ECHOKV_RETURN_IF_ERROR(
      DecodeSteps(input, "round1", config.lookahead, &clock, &view, &token, &log, &report));

  // Final: last 8 context queries (causal) + the T lookahead queries over the full
  // context, pooled on the prefix 0..n-9, TopK_{B-8} plus the last 8 entries.
  double overlap = 0;
  int64_t count = 0;
  bool final_scored = false;
  for (int l = 0; l < layers; ++l) {
    const int64_t n = ctx.size(l);
    at::Tensor kept;
    if (n <= budget) {
      kept = KeepAll(groups, n);
    } else {
      const int64_t w = std::min(kLaqWindow, budget);
      const int64_t prefix = n - w;
      const int64_t k = budget - w;
      if (k == 0) {
        kept = Range(groups, prefix, n);
      } else {
        at::Tensor head = FutureHeadScores(ctx, l, Stack(log[l]));  // [H, n]
        // Fewer than 8 context queries (grown sessions): use the available ones.
        WindowQueries last = LastQueries(input, l, kLaqWindow);
        if (last.size() > 0) head = head + CausalHeadScores(ctx, l, last);
        kept = TopKPrefixPlusTail(
            PooledPrefixGroupScores(head, prefix, config.snapkv_kernel, groups), prefix, k, n);
        final_scored = true;
      }
    }
    overlap += OverlapSum(workspace[l], kept, &count);
    result->indices.push_back(kept);
  }
  if (final_scored) ++report.scoring_passes;
  report.overlap_w1_final = count > 0 ? overlap / count : -1;
  clock.End("final");
  return absl::OkStatus();
}

absl::Status RunEchoKv(const CompressionConfig& config, const CompressionInput& input,
                       CompressionResult* result) {
  CompressionReport& report = result->report;
  PhaseClock clock(input, &report);
  const model::KvCache& ctx = *input.context;
  const int layers = ctx.num_layers();
  const int64_t groups = ctx.num_kv_heads();
  const int64_t budget = config.budget;
  const int64_t b1 = config.EffectiveWorkspace();
  const int half = config.lookahead / 2;
  const int64_t w = config.stage2_window;

  // Stage 1 (§3 step 2): W1 = TopK_B1 of the proposals' scores, or SnapKV's (§8.8).
  std::vector<at::Tensor> w1;
  if (config.bootstrap == Bootstrap::kProposals) {
    std::vector<int64_t> future(config.lookahead);
    for (int t = 0; t < config.lookahead; ++t) future[t] = ctx.next_position() + t;
    for (int l = 0; l < layers; ++l) {
      const at::Tensor keys = ctx.keys(l);
      at::Tensor anchor = input.anchor_queries[l].to(keys.device(), at::kFloat);
      at::Tensor proposals = kernels::RotateToPositions(anchor, future, input.rope_inv_freq);
      at::Tensor group = kernels::SumHeadsPerGroup(FutureHeadScores(ctx, l, proposals), groups);
      w1.push_back(kernels::TopKIndices(group, b1));
    }
    ++report.scoring_passes;
  } else {
    bool scored = false;
    ECHOKV_ASSIGN_OR_RETURN(w1, SnapKvSelectLayers(config, input, std::vector<int64_t>(layers, b1), &scored));
    if (scored) ++report.scoring_passes;
  }
  clock.End("bootstrap");

  // Round 1 (§3 step 3) on W1.
  ECHOKV_ASSIGN_OR_RETURN(model::KvCache view, model::KvCache::Gather(ctx, w1));
  int token = GreedyToken(input.last_logits);
  QueryLog q1(layers);
  ECHOKV_RETURN_IF_ERROR(DecodeSteps(input, "round1", half, &clock, &view, &token, &q1, &report));

  // Repair (§3 step 4): W2 = TopK_B1 of Q1's scores over the full context.
  std::vector<at::Tensor> w2;
  if (config.repair) {
    for (int l = 0; l < layers; ++l) {
      at::Tensor group = kernels::SumHeadsPerGroup(FutureHeadScores(ctx, l, Stack(q1[l])), groups);
      w2.push_back(kernels::TopKIndices(group, b1));
    }
    ++report.scoring_passes;
    clock.End("repair");
  } else {
    w2 = w1;  // §8.8: round 2 continues on W1's view unchanged
  }

  // Round 2 (§3 step 5) on W2 plus round 1's lookahead KV exactly as computed (§8.9).
  QueryLog q2(layers);
  if (config.repair) {
    ECHOKV_ASSIGN_OR_RETURN(model::KvCache view2, model::KvCache::Gather(ctx, w2));
    ECHOKV_RETURN_IF_ERROR(view2.AppendTail(view, half));
    view = std::move(view2);
  }
  ECHOKV_RETURN_IF_ERROR(DecodeSteps(input, "round2", half, &clock, &view, &token, &q2, &report));

  // Final (§3 step 6): TopK_{B-w} of [Q1;Q2]'s scores on 0..n-w-1, plus the last w.
  double o12 = 0, o1f = 0, o2f = 0;
  int64_t c12 = 0, c1f = 0, c2f = 0;
  for (int l = 0; l < layers; ++l) {
    const int64_t n = ctx.size(l);
    at::Tensor kept;
    if (n <= budget) {
      kept = KeepAll(groups, n);
    } else {
      at::Tensor q = at::cat({Stack(q1[l]), Stack(q2[l])}, 1);  // [H, T, d]
      at::Tensor group = kernels::SumHeadsPerGroup(FutureHeadScores(ctx, l, q), groups);
      kept = TopKPrefixPlusTail(group, n - w, budget - w, n);
    }
    o12 += OverlapSum(w1[l], w2[l], &c12);
    o1f += OverlapSum(w1[l], kept, &c1f);
    o2f += OverlapSum(w2[l], kept, &c2f);
    result->indices.push_back(kept);
  }
  ++report.scoring_passes;
  report.overlap_w1_w2 = c12 > 0 ? o12 / c12 : -1;
  report.overlap_w1_final = c1f > 0 ? o1f / c1f : -1;
  report.overlap_w2_final = c2f > 0 ? o2f / c2f : -1;
  clock.End("final");
  return absl::OkStatus();
}

}  // namespace echokv::compression::internal
