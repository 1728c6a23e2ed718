// CompressionTask: every policy as a resumable state machine. The non-lookahead
// policies (and L <= B) are one "select" phase; LAQ (docs/ALGORITHM.md §4, §8.7) and
// EchoKV (§3, §8.8-§8.9) alternate scoring phases with one-token decode steps on a
// workspace view that the caller runs (the engine batches them with its streams).
#include "compression/task.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/selection.h"
#include "kernels/rope.h"
#include "kernels/score.h"

namespace echokv::compression {
namespace {

// LAQ's final observation window (the official code's last 8 context queries).
constexpr int64_t kLaqWindow = 8;

bool IsLookahead(PolicyKind kind) { return kind == PolicyKind::kLaq || kind == PolicyKind::kEchoKv; }

// Checks that `input` carries what `config.policy` needs; every message names the field.
absl::Status CheckInput(const CompressionConfig& config, const CompressionInput& input, bool over_budget) {
  if (input.context == nullptr) return absl::InvalidArgumentError("context: must not be null");
  const model::KvCache& ctx = *input.context;
  const int layers = ctx.num_layers();
  const int64_t groups = ctx.num_kv_heads();
  const int64_t d = ctx.head_dim();
  if (layers < 1 || groups < 1 || d < 1) {
    return absl::InvalidArgumentError(absl::StrCat("context: empty cache shape (layers=", layers,
                                                   ", kv heads=", groups, ", head dim=", d, ")"));
  }
  if (!over_budget || config.policy == PolicyKind::kFull) return absl::OkStatus();
  const absl::string_view name = PolicyName(config.policy);
  const PrefillNeeds needs = NeedsFor(config);

  const bool h2o_from_scores = config.policy == PolicyKind::kH2o && !input.h2o_scores.empty();
  if (h2o_from_scores) {
    if (static_cast<int>(input.h2o_scores.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat("h2o_scores: ", layers, " layers expected, got ",
                                                     input.h2o_scores.size()));
    }
    for (int l = 0; l < layers; ++l) {
      const at::Tensor& s = input.h2o_scores[l];
      if (!s.defined() || s.dim() != 2 || s.size(0) != groups || s.size(1) != ctx.size(l)) {
        return absl::InvalidArgumentError(
            absl::StrCat("h2o_scores: layer ", l, " must be [", groups, ", ", ctx.size(l), "]"));
      }
    }
  }
  if (needs.last_queries != 0 && !h2o_from_scores) {
    if (static_cast<int>(input.last_queries.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "last_queries: ", name, " needs the prefill's last context queries for each of the ",
          layers, " layers, got ", input.last_queries.size()));
    }
    for (int l = 0; l < layers; ++l) {
      const at::Tensor& q = input.last_queries[l];
      if (!q.defined() || q.dim() != 3 || q.size(2) != d || q.size(0) % groups != 0 || q.size(0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "last_queries: layer ", l, " must be [H, N, ", d, "] with H a multiple of ", groups));
      }
      if (q.size(1) != static_cast<int64_t>(input.last_query_positions.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "last_query_positions: holds ", input.last_query_positions.size(),
            " positions but last_queries[", l, "] has ", q.size(1), " queries"));
      }
    }
  }
  if (IsLookahead(config.policy)) {
    if (!input.last_logits.defined() || input.last_logits.numel() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("last_logits: ", name, " needs the prefill's last logits [V]"));
    }
  }
  if (needs.anchor_queries) {
    if (static_cast<int>(input.anchor_queries.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "anchor_queries: echokv needs the last token's pre-RoPE queries for each of the ", layers,
          " layers, got ", input.anchor_queries.size()));
    }
    for (int l = 0; l < layers; ++l) {
      const at::Tensor& a = input.anchor_queries[l];
      if (!a.defined() || a.dim() != 2 || a.size(1) != d || a.size(0) % groups != 0 || a.size(0) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("anchor_queries: layer ", l, " must be [H, ", d, "] with H a multiple of ", groups));
      }
    }
    if (!input.rope_inv_freq.defined() || input.rope_inv_freq.numel() != d / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope_inv_freq: echokv needs the model's RoPE inverse frequencies [", d / 2, "]"));
    }
  }
  return absl::OkStatus();
}

// The single-phase policies (§4, §8.3-§8.6).
absl::Status RunSinglePhase(const CompressionConfig& config, const CompressionInput& input,
                            CompressionResult* result) {
  switch (config.policy) {
    case PolicyKind::kFull:
      return internal::RunFull(config, input, result);
    case PolicyKind::kStreamingLlm:
      return internal::RunStreamingLlm(config, input, result);
    case PolicyKind::kH2o:
      return internal::RunH2o(config, input, result);
    case PolicyKind::kSnapKv:
      return internal::RunSnapKv(config, input, result);
    case PolicyKind::kPyramidKv:
      return internal::RunPyramidKv(config, input, result);
    case PolicyKind::kLaq:
    case PolicyKind::kEchoKv:
      break;
  }
  return absl::InternalError(absl::StrCat(PolicyName(config.policy), " is not a single-phase policy"));
}

// [H, k, d] from k recorded [H, d] vectors of one layer.
at::Tensor Stack(const std::vector<at::Tensor>& qs) { return at::stack(qs, /*dim=*/1); }

}  // namespace

class CompressionTask::Impl {
 public:
  Impl(const CompressionConfig& config, CompressionInput input)
      : config_(config), input_(std::move(input)), clock_(input_, &result_.report) {}

  absl::Status Init() {
    const model::KvCache& ctx = *input_.context;
    layers_ = ctx.num_layers();
    groups_ = ctx.num_kv_heads();
    CompressionReport& report = result_.report;
    report.config = config_;
    if (IsLookahead(config_.policy)) report.config.workspace = config_.EffectiveWorkspace();
    report.num_layers = layers_;
    report.num_kv_heads = static_cast<int>(groups_);
    int64_t max_n = 0;
    for (int l = 0; l < layers_; ++l) max_n = std::max(max_n, ctx.size(l));
    report.context_tokens = max_n;
    // docs/ALGORITHM.md §8.10: L <= B keeps everything and runs no lookahead.
    if (max_n <= config_.budget && config_.policy != PolicyKind::kFull) {
      phase_ = Phase::kKeepAll;
    } else if (config_.policy == PolicyKind::kLaq) {
      phase_ = Phase::kLaqWorkspace;
    } else if (config_.policy == PolicyKind::kEchoKv) {
      phase_ = Phase::kEchoBootstrap;
    } else {
      phase_ = Phase::kSelect;
    }
    return absl::OkStatus();
  }

  std::optional<DecodeRequest> pending_decode() const {
    if (phase_ != Phase::kDecode) return std::nullopt;
    return DecodeRequest{token_, const_cast<model::KvCache*>(&view_)};
  }

  const CompressionConfig& config() const { return config_; }

  absl::Status SupplyDecode(LookaheadDecoder::Step step) {
    if (phase_ != Phase::kDecode) return absl::FailedPreconditionError("no lookahead decode is pending");
    const std::vector<int64_t>& before = view_sizes_before_;
    const int64_t d = input_.context->head_dim();
    ++result_.report.forward_passes;
    if (static_cast<int>(step.queries.size()) != layers_) {
      return absl::InternalError(
          absl::StrCat("decoder: step returned queries for ", step.queries.size(), " layers, expected ", layers_));
    }
    if (!step.logits.defined() || step.logits.numel() == 0) return absl::InternalError("decoder: step returned no logits");
    QueryLog& log = round_ == 1 ? q1_ : q2_;
    for (int l = 0; l < layers_; ++l) {
      const at::Tensor& q = step.queries[l];
      if (!q.defined() || q.dim() != 2 || q.size(1) != d || q.size(0) % groups_ != 0) {
        return absl::InternalError(absl::StrCat("decoder: layer ", l, " queries must be [H, ", d,
                                                "] with H a multiple of ", groups_, ", got ",
                                                q.defined() ? q.dim() : -1, " dims"));
      }
      if (view_.size(l) != before[l] + 1) {
        return absl::InternalError(absl::StrCat("decoder: layer ", l, " view holds ", view_.size(l),
                                                " entries after a step, expected ", before[l] + 1));
      }
      log[l].push_back(q.to(at::kFloat).clone());  // the decoder may reuse its buffers
    }
    token_ = internal::GreedyToken(step.logits);
    result_.report.lookahead_tokens.push_back(token_);
    ++steps_done_;
    const std::string name = round_ == 1 ? "round1" : "round2";
    if (steps_done_ < steps_total_) {
      clock_.Progress(name, steps_done_, steps_total_);
      view_sizes_before_ = ViewSizes();
      return absl::OkStatus();
    }
    clock_.End(name, steps_total_, steps_total_);
    if (after_decode_ == Phase::kEchoRound2OnW1) {
      // §8.8: repair=off => W2 = W1 and round 2 continues on W1's view unchanged.
      BeginDecode(2, config_.lookahead / 2, Phase::kEchoFinal);
    } else {
      phase_ = after_decode_;
    }
    return absl::OkStatus();
  }

  absl::Status Advance() {
    switch (phase_) {
      case Phase::kKeepAll:
        for (int l = 0; l < layers_; ++l) {
          result_.indices.push_back(internal::KeepAll(groups_, input_.context->size(l)));
        }
        clock_.End("select");
        return Finish();
      case Phase::kSelect:
        ECHOKV_RETURN_IF_ERROR(RunSinglePhase(config_, input_, &result_));
        return Finish();
      case Phase::kLaqWorkspace:
        return LaqWorkspace();
      case Phase::kLaqFinal:
        return LaqFinal();
      case Phase::kEchoBootstrap:
        return EchoBootstrap();
      case Phase::kEchoRepair:
        return EchoRepair();
      case Phase::kEchoFinal:
        return EchoFinal();
      case Phase::kDecode:
        return absl::FailedPreconditionError("a lookahead decode is pending: SupplyDecode first");
      case Phase::kEchoRound2OnW1:
      case Phase::kDone:
        return absl::FailedPreconditionError("the compression is already done");
    }
    return absl::InternalError("unknown phase");
  }

  bool done() const { return phase_ == Phase::kDone; }

  std::string phase() const {
    switch (phase_) {
      case Phase::kKeepAll:
      case Phase::kSelect:
        return "select";
      case Phase::kLaqWorkspace:
      case Phase::kEchoBootstrap:
        return "bootstrap";
      case Phase::kDecode:
        return round_ == 1 ? "round1" : "round2";
      case Phase::kEchoRepair:
        return "repair";
      case Phase::kLaqFinal:
      case Phase::kEchoFinal:
        return "final";
      case Phase::kEchoRound2OnW1:
      case Phase::kDone:
        return "done";
    }
    return "unknown";
  }

  absl::StatusOr<CompressionResult> TakeResult() {
    if (phase_ != Phase::kDone) return absl::FailedPreconditionError("the compression is not done");
    if (taken_) return absl::FailedPreconditionError("the result was already taken");
    taken_ = true;
    return std::move(result_);
  }

  std::vector<int64_t> ViewSizes() const {
    std::vector<int64_t> sizes(layers_);
    for (int l = 0; l < layers_; ++l) sizes[l] = view_.size(l);
    return sizes;
  }

 private:
  enum class Phase {
    kKeepAll,        // L <= B: keep everything (§8.10)
    kSelect,         // a single-phase policy
    kLaqWorkspace,   // LAQ: SnapKV workspace of capacity B1
    kLaqFinal,       // LAQ: final scoring
    kEchoBootstrap,  // EchoKV stage 1 (§3 step 2)
    kEchoRepair,     // EchoKV repair (§3 step 4)
    kEchoFinal,      // EchoKV final selection (§3 step 6)
    kDecode,         // waiting for a lookahead decode step
    kEchoRound2OnW1, // (only as after_decode_) repair=off: round 2 right after round 1
    kDone,
  };
  // Per layer, the query vectors [H, d] recorded by the decode steps so far.
  using QueryLog = std::vector<std::vector<at::Tensor>>;

  // Starts `steps` greedy lookahead steps of round `round`, then goes to `next`.
  void BeginDecode(int round, int steps, Phase next) {
    round_ = round;
    steps_done_ = 0;
    steps_total_ = steps;
    after_decode_ = next;
    phase_ = Phase::kDecode;  // steps >= 1: T is even and >= 2 (docs/ALGORITHM.md §5)
    view_sizes_before_ = ViewSizes();
  }

  // §7 accounting and the checks of Compress()'s contract.
  absl::Status Finish() {
    const model::KvCache& ctx = *input_.context;
    CompressionReport& report = result_.report;
    if (static_cast<int>(result_.indices.size()) != layers_) {
      return absl::InternalError(absl::StrCat(PolicyName(config_.policy), " selected ", result_.indices.size(),
                                              " layers, expected ", layers_));
    }
    // §7 accounting: 2 · Σ_l G · n_l · d · sizeof(dtype).
    const int64_t entry_bytes = 2 * ctx.head_dim() * static_cast<int64_t>(ctx.options().dtype().itemsize());
    for (int l = 0; l < layers_; ++l) {
      const at::Tensor& idx = result_.indices[l];
      if (idx.dim() != 2 || idx.size(0) != groups_ || idx.size(1) > ctx.size(l)) {
        return absl::InternalError(absl::StrCat(PolicyName(config_.policy), ": layer ", l,
                                                " selection has a wrong shape"));
      }
      report.retained_per_layer.push_back(idx.size(1));
      report.retained_entries += groups_ * idx.size(1);
      report.total_entries += groups_ * ctx.size(l);
    }
    // A layer that kept every entry holds all of any probe's mass.
    if (report.retained_mass.size() != static_cast<size_t>(layers_) * groups_) {
      report.retained_mass.assign(static_cast<size_t>(layers_) * groups_, -1.0);
    }
    for (int l = 0; l < layers_; ++l) {
      if (result_.indices[l].size(1) != ctx.size(l)) continue;
      for (int g = 0; g < groups_; ++g) report.retained_mass[static_cast<size_t>(l) * groups_ + g] = 1.0;
    }
    // What is kept is stored in config_.cache_dtype (int8 rows count their scales); the
    // full cache it is measured against stays in the context's dtype.
    const int64_t kept_bytes = config_.cache_dtype == kernels::KvDtype::kInt8
                                   ? kernels::KvEntryBytes(kernels::KvDtype::kInt8, ctx.head_dim())
                                   : entry_bytes;
    report.retained_kv_bytes = report.retained_entries * kept_bytes;
    report.full_kv_bytes = report.total_entries * entry_bytes;
    report.evicted = report.retained_entries < report.total_entries;
    phase_ = Phase::kDone;
    view_ = model::KvCache();  // the workspace is discarded (§3 step 6)
    return absl::OkStatus();
  }

  // ---- LAQ (§4, §8.7) ----

  absl::Status LaqWorkspace() {
    const int64_t b1 = config_.EffectiveWorkspace();
    bool scored = false;
    ECHOKV_ASSIGN_OR_RETURN(w1_, internal::SnapKvSelectLayers(config_, input_, std::vector<int64_t>(layers_, b1),
                                                              &scored));
    if (scored) ++result_.report.scoring_passes;
    clock_.End("bootstrap");
    // T greedy steps on the frozen workspace (reported as "round1": LAQ's one round).
    ECHOKV_ASSIGN_OR_RETURN(view_, model::KvCache::Gather(*input_.context, w1_));
    token_ = internal::GreedyToken(input_.last_logits);
    q1_.assign(layers_, {});
    BeginDecode(1, config_.lookahead, Phase::kLaqFinal);
    return absl::OkStatus();
  }

  absl::Status LaqFinal() {
    // Last 8 context queries (causal) + the T lookahead queries over the full context,
    // pooled on the prefix 0..n-9, TopK_{B-8} plus the last 8 entries.
    const model::KvCache& ctx = *input_.context;
    const int64_t budget = config_.budget;
    double overlap = 0;
    int64_t count = 0;
    bool final_scored = false;
    if (input_.record_scores) result_.final_scores.assign(layers_, at::Tensor());
    for (int l = 0; l < layers_; ++l) {
      const int64_t n = ctx.size(l);
      at::Tensor kept;
      if (n <= budget) {
        kept = internal::KeepAll(groups_, n);
      } else {
        const int64_t w = std::min(kLaqWindow, budget);
        const int64_t prefix = n - w;
        const int64_t k = budget - w;
        if (k == 0) {
          kept = internal::Range(groups_, prefix, n);
        } else {
          at::Tensor head = internal::FutureHeadScores(ctx, l, Stack(q1_[l]));  // [H, n]
          // Fewer than 8 context queries (grown sessions): use the available ones.
          internal::WindowQueries last = internal::LastQueries(input_, l, kLaqWindow);
          if (last.size() > 0) head = head + internal::CausalHeadScores(ctx, l, last);
          at::Tensor pooled = internal::PooledPrefixGroupScores(head, prefix, config_.snapkv_kernel, groups_);
          if (input_.record_scores) result_.final_scores[l] = pooled.to(at::kCPU, at::kFloat);
          kept = internal::TopKPrefixPlusTail(pooled, prefix, k, n);
          internal::RecordRetainedMass(kernels::SumHeadsPerGroup(head, groups_), kept, l, layers_, &result_.report);
          final_scored = true;
        }
      }
      overlap += internal::OverlapSum(w1_[l], kept, &count);
      result_.indices.push_back(kept);
    }
    if (final_scored) ++result_.report.scoring_passes;
    result_.report.overlap_w1_final = count > 0 ? overlap / count : -1;
    clock_.End("final");
    return Finish();
  }

  // ---- EchoKV (§3, §8.8-§8.9) ----

  absl::Status EchoBootstrap() {
    const model::KvCache& ctx = *input_.context;
    const int64_t b1 = config_.EffectiveWorkspace();
    // Stage 1 (§3 step 2): W1 = TopK_B1 of the proposals' scores, or SnapKV's (§8.8).
    if (config_.bootstrap == Bootstrap::kProposals) {
      // Proposal positions L ... L+T-1 (§3 step 2).
      std::vector<int64_t> future(config_.lookahead);
      for (int t = 0; t < config_.lookahead; ++t) future[t] = ctx.next_position() + t;
      w1_.clear();
      for (int l = 0; l < layers_; ++l) {
        const at::Tensor keys = ctx.keys(l);
        at::Tensor anchor = input_.anchor_queries[l].to(keys.device(), at::kFloat);
        at::Tensor proposals = kernels::RotateToPositions(anchor, future, input_.rope_inv_freq);
        at::Tensor group = kernels::SumHeadsPerGroup(internal::FutureHeadScores(ctx, l, proposals), groups_);
        w1_.push_back(kernels::TopKIndices(group, b1));
      }
      ++result_.report.scoring_passes;
    } else {
      bool scored = false;
      ECHOKV_ASSIGN_OR_RETURN(
          w1_, internal::SnapKvSelectLayers(config_, input_, std::vector<int64_t>(layers_, b1), &scored));
      if (scored) ++result_.report.scoring_passes;
    }
    clock_.End("bootstrap");
    // Round 1 (§3 step 3) on W1.
    ECHOKV_ASSIGN_OR_RETURN(view_, model::KvCache::Gather(ctx, w1_));
    token_ = internal::GreedyToken(input_.last_logits);
    q1_.assign(layers_, {});
    q2_.assign(layers_, {});
    BeginDecode(1, config_.lookahead / 2, config_.repair ? Phase::kEchoRepair : Phase::kEchoRound2OnW1);
    return absl::OkStatus();
  }

  absl::Status EchoRepair() {
    // Repair (§3 step 4): W2 = TopK_B1 of Q1's scores over the full context.
    const model::KvCache& ctx = *input_.context;
    const int64_t b1 = config_.EffectiveWorkspace();
    w2_.clear();
    for (int l = 0; l < layers_; ++l) {
      at::Tensor group = kernels::SumHeadsPerGroup(internal::FutureHeadScores(ctx, l, Stack(q1_[l])), groups_);
      w2_.push_back(kernels::TopKIndices(group, b1));
    }
    ++result_.report.scoring_passes;
    clock_.End("repair");
    // Round 2 (§3 step 5) on W2 plus round 1's lookahead KV exactly as computed (§8.9).
    ECHOKV_ASSIGN_OR_RETURN(model::KvCache view2, model::KvCache::Gather(ctx, w2_));
    ECHOKV_RETURN_IF_ERROR(view2.AppendTail(view_, config_.lookahead / 2));
    view_ = std::move(view2);
    BeginDecode(2, config_.lookahead / 2, Phase::kEchoFinal);
    return absl::OkStatus();
  }

  absl::Status EchoFinal() {
    // Final (§3 step 6): TopK_{B-w} of [Q1;Q2]'s scores on 0..n-w-1, plus the last w.
    const model::KvCache& ctx = *input_.context;
    const int64_t budget = config_.budget;
    const int64_t w = config_.stage2_window;
    if (w2_.empty()) w2_ = w1_;
    double o12 = 0, o1f = 0, o2f = 0;
    int64_t c12 = 0, c1f = 0, c2f = 0;
    if (input_.record_scores) result_.final_scores.assign(layers_, at::Tensor());
    for (int l = 0; l < layers_; ++l) {
      const int64_t n = ctx.size(l);
      at::Tensor kept;
      if (n <= budget) {
        kept = internal::KeepAll(groups_, n);
      } else {
        at::Tensor q = at::cat({Stack(q1_[l]), Stack(q2_[l])}, 1);  // [H, T, d]
        at::Tensor group = kernels::SumHeadsPerGroup(internal::FutureHeadScores(ctx, l, q), groups_);
        if (input_.record_scores) result_.final_scores[l] = group.narrow(1, 0, n - w).to(at::kCPU, at::kFloat);
        int64_t k = budget - w;
        // §9: the fewest entries whose share of [Q1;Q2]'s mass reaches target_mass.
        if (config_.target_mass.has_value()) k = internal::MassTargetCount(group, group, n - w, k, *config_.target_mass);
        kept = internal::TopKPrefixPlusTail(group, n - w, k, n);
        internal::RecordRetainedMass(group, kept, l, layers_, &result_.report);
      }
      o12 += internal::OverlapSum(w1_[l], w2_[l], &c12);
      o1f += internal::OverlapSum(w1_[l], kept, &c1f);
      o2f += internal::OverlapSum(w2_[l], kept, &c2f);
      result_.indices.push_back(kept);
    }
    ++result_.report.scoring_passes;
    result_.report.overlap_w1_w2 = c12 > 0 ? o12 / c12 : -1;
    result_.report.overlap_w1_final = c1f > 0 ? o1f / c1f : -1;
    result_.report.overlap_w2_final = c2f > 0 ? o2f / c2f : -1;
    clock_.End("final");
    return Finish();
  }

  CompressionConfig config_;
  CompressionInput input_;            // owned copy; input_.context is not owned
  CompressionResult result_;          // filled phase by phase
  internal::PhaseClock clock_;        // reports phases into result_.report
  Phase phase_ = Phase::kDone;
  Phase after_decode_ = Phase::kDone; // where the decode steps lead
  int layers_ = 0;
  int64_t groups_ = 0;
  std::vector<at::Tensor> w1_, w2_;   // workspaces per layer [G, <=B1]
  model::KvCache view_;               // the lookahead workspace (W1 or W2 + lookahead KV)
  int token_ = 0;                     // the next token to decode
  int round_ = 0;                     // 1 or 2
  int steps_done_ = 0;                // steps of the current round done
  int steps_total_ = 0;               // steps of the current round
  std::vector<int64_t> view_sizes_before_;  // view entries per layer before the pending step
  QueryLog q1_, q2_;                  // lookahead queries of rounds 1 and 2
  bool taken_ = false;                // TakeResult ran
};

namespace {
// No exception leaves the library: LibTorch errors become a Status naming the policy.
template <typename Fn>
absl::Status Guarded(const CompressionConfig& config, Fn fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("compression (", PolicyName(config.policy), "): ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("compression (", PolicyName(config.policy), "): ", e.what()));
  }
}
}  // namespace

CompressionTask::CompressionTask(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompressionTask::~CompressionTask() = default;

absl::StatusOr<std::unique_ptr<CompressionTask>> CompressionTask::Start(const CompressionConfig& config,
                                                                        CompressionInput input) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<CompressionTask> task;
  ECHOKV_RETURN_IF_ERROR(Guarded(config, [&]() -> absl::Status {
  bool over_budget = false;
  if (input.context != nullptr) {
    for (int l = 0; l < input.context->num_layers(); ++l) {
      over_budget = over_budget || input.context->size(l) > config.budget;
    }
  }
  ECHOKV_RETURN_IF_ERROR(CheckInput(config, input, over_budget));
  input.decoder = nullptr;
  auto impl = std::make_unique<Impl>(config, std::move(input));
  ECHOKV_RETURN_IF_ERROR(impl->Init());
  task.reset(new CompressionTask(std::move(impl)));
  return absl::OkStatus();
  }));
  return task;
}

std::optional<CompressionTask::DecodeRequest> CompressionTask::pending_decode() const {
  return impl_->pending_decode();
}


absl::Status CompressionTask::SupplyDecode(LookaheadDecoder::Step step) {
  return Guarded(impl_->config(), [&] { return impl_->SupplyDecode(std::move(step)); });
}

absl::Status CompressionTask::Advance() {
  return Guarded(impl_->config(), [&] { return impl_->Advance(); });
}

bool CompressionTask::done() const { return impl_->done(); }
std::string CompressionTask::phase() const { return impl_->phase(); }
absl::StatusOr<CompressionResult> CompressionTask::TakeResult() { return impl_->TakeResult(); }

}  // namespace echokv::compression
