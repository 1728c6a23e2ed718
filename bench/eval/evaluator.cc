#include "bench/eval/evaluator.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compression/policy.h"
#include "compression/transformer_decoder.h"
#include "kernels/rope.h"
#include "kernels/score.h"
#include "model/sampler.h"
#include "server/engine/session_data.h"
#include "server/engine/turn_job.h"

namespace echokv::eval {
namespace {

using compression::PolicyKind;
using internal::Table1Trace;
// Per layer, per KV group: sorted ascending positions.
using IndexSets = std::vector<std::vector<std::vector<int64_t>>>;
// Per decode step k (0-based = step k+1), per layer: queries [H, d] float32.
using QueryTrace = std::vector<std::vector<at::Tensor>>;

std::vector<float> ToVector(const at::Tensor& logits) {
  at::Tensor c = logits.to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

int Greedy(const at::Tensor& logits) {
  const std::vector<float> v = ToVector(logits);
  return model::Argmax(v);
}

// [G, n] int64 -> per group sorted vectors.
std::vector<std::vector<int64_t>> Rows(const at::Tensor& idx) {
  at::Tensor c = idx.to(at::kCPU, at::kLong).contiguous();
  std::vector<std::vector<int64_t>> out(c.size(0));
  const int64_t n = c.size(1);
  for (int64_t g = 0; g < c.size(0); ++g) {
    const int64_t* p = c.data_ptr<int64_t>() + g * n;
    out[g].assign(p, p + n);
    std::sort(out[g].begin(), out[g].end());
  }
  return out;
}

// Eq. 3 group scores [G, L] of one layer's decode-step queries (positions >= L: every
// context key visible, docs/ALGORITHM.md §8.1). queries: [H, m, d].
at::Tensor GroupScores(const model::KvCache& ctx, int layer, const at::Tensor& queries) {
  const at::Tensor keys = ctx.keys(layer);
  kernels::ScoreOptions so;
  at::Tensor head = kernels::AttentionScores(queries.to(keys.device(), at::kFloat), keys, so);
  return kernels::SumHeadsPerGroup(head, ctx.num_kv_heads());
}

// Mean over layers and groups of SetOverlap(a[l][g], b[l][g]).
double MeanOverlap(const IndexSets& a, const IndexSets& b) {
  double s = 0;
  int64_t n = 0;
  for (size_t l = 0; l < b.size(); ++l) {
    for (size_t g = 0; g < b[l].size(); ++g) {
      s += SetOverlap(a[l][g], b[l][g]);
      ++n;
    }
  }
  return n > 0 ? s / n : 1.0;
}

// TopK_B of each step's single-query scores: per step k, per layer/group.
std::vector<IndexSets> StepTopK(const model::KvCache& ctx, const QueryTrace& trace, int64_t budget) {
  std::vector<IndexSets> out;
  for (const auto& step : trace) {
    IndexSets sets;
    for (int l = 0; l < ctx.num_layers(); ++l) {
      at::Tensor q = step[l].to(at::kFloat).unsqueeze(1);  // [H, 1, d]
      sets.push_back(Rows(kernels::TopKIndices(GroupScores(ctx, l, q), budget)));
    }
    out.push_back(std::move(sets));
  }
  return out;
}

int64_t PositionsNeededImpl(const EvalOptions& opt, const EvalCase& c) {
  const int64_t L = static_cast<int64_t>(c.prompt_ids.size());
  const int64_t answer_fed = std::max<int64_t>(0, static_cast<int64_t>(c.answer_ids.size()) - 1);
  return L + std::max<int64_t>(opt.DecodeSteps(), answer_fed);
}

absl::Status CheckFitsImpl(const model::ModelConfig& cfg, const EvalOptions& opt, const EvalCase& c) {
  const int64_t max_pos = cfg.max_position_embeddings;
  if (max_pos <= 0) return opt.turns > 0 ? SplitTurns(c, opt.turns, opt.question_tokens).status() : absl::OkStatus();
  const int64_t L = static_cast<int64_t>(c.prompt_ids.size());
  const int64_t steps = opt.DecodeSteps();
  if (L + steps > max_pos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "case ", c.id, " (line ", c.line, "): prompt_ids holds ", L, " tokens; with ", steps,
        " decode steps (max of steps, lookahead, oracle_steps) it needs ", L + steps,
        " positions, which exceeds the model's max_position_embeddings (", max_pos, ")"));
  }
  const int64_t answer = static_cast<int64_t>(c.answer_ids.size());
  if (answer > 0 && L + answer - 1 > max_pos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "case ", c.id, " (line ", c.line, "): prompt_ids holds ", L, " tokens; answer_ids (", answer,
        " tokens, the last one never fed back) needs ", L + answer - 1,
        " positions, which exceeds the model's max_position_embeddings (", max_pos, ")"));
  }
  if (opt.turns > 0) ECHOKV_RETURN_IF_ERROR(SplitTurns(c, opt.turns, opt.question_tokens).status());
  return absl::OkStatus();
}

using Emit = std::function<void(const std::string&, int, const std::string&, double)>;

// The policy column of a row measured with `dtype`'s compact cache: "echokv" (float32),
// "echokv@int8".
std::string DtypeRowName(const std::string& name, kernels::KvDtype dtype) {
  return dtype == kernels::KvDtype::kFloat32 ? name : absl::StrCat(name, "@", kernels::KvDtypeName(dtype));
}

// What every measurement compares against: the one-shot prefill of the whole prompt and
// the full cache's greedy continuation.
struct Reference {
  model::KvCache context;                     // the full cache of the prompt
  model::ForwardResult pre;                   // its prefill (all queries, anchors)
  std::vector<int> x;                         // x_0 ... x_S of the full cache
  std::vector<std::vector<float>> full_logits;  // step s's logits (index s-1)
  std::map<int, IndexSets> oracle_union;      // budget -> ∪_k I*_k
};

// Every metric of one compact cache. kept: per layer and group, sorted positions;
// first_token: the policy's own first generated token (x_0 for one-shot compression,
// which shares the uncompressed prefill).
absl::Status Measure(const model::Transformer& m, const EvalOptions& opt, const EvalCase& c, const Reference& ref,
                     const std::string& name, int b, model::KvCache compact, const IndexSets& kept, int first_token,
                     const Emit& emit) {
  const std::vector<int>& x = ref.x;
  // Task exact match: free-running greedy output of |answer| tokens.
  if (!c.answer_ids.empty()) {
    model::KvCache gen = compact.Clone();
    std::vector<int> out = {first_token};
    while (out.size() < c.answer_ids.size()) {
      ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(out.back(), &gen));
      out.push_back(Greedy(r.logits));
    }
    emit(name, b, kMetricExactMatch, ExactMatch(out, c.answer_ids) ? 1.0 : 0.0);
  }

  // Teacher-forced steps on the full cache's continuation.
  double kl_sum = 0, top1_sum = 0;
  bool matching = first_token == x[0];
  int match = matching ? 1 : 0;  // x'_0 vs x_0: equal for one-shot (the uncompressed prefill)
  for (int s = 1; s <= opt.steps; ++s) {
    ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(x[s - 1], &compact));
    const std::vector<float> lp = ToVector(r.logits);
    ECHOKV_ASSIGN_OR_RETURN(double kl, KlFromLogits(ref.full_logits[s - 1], lp));
    kl_sum += kl;
    const bool agree = model::Argmax(lp) == x[s];
    top1_sum += agree ? 1 : 0;
    // While every earlier token agreed, the teacher-forced step is the free-running
    // step, so the first disagreement ends the greedy match.
    if (s < opt.steps && matching) {
      if (agree) {
        ++match;
      } else {
        matching = false;
      }
    }
  }
  emit(name, b, kMetricKl, kl_sum / opt.steps);
  emit(name, b, kMetricTop1, top1_sum / opt.steps);
  emit(name, b, kMetricMatchLength, match);

  if (!c.evidence_spans.empty()) {
    ECHOKV_ASSIGN_OR_RETURN(double ret, EvidenceRetention(kept, c.evidence_spans));
    emit(name, b, kMetricEvidence, ret);
  }
  emit(name, b, kMetricOracleOverlap, MeanOverlap(kept, ref.oracle_union.at(b)));
  return absl::OkStatus();
}

// Feeds `tokens` as turns of `sizes` tokens through server::TurnJob (kCreate, then
// kAppend) the way the engine steps a job, and returns the session after the last one.
absl::StatusOr<std::shared_ptr<server::SessionData>> RunTurns(const model::Transformer& m,
                                                              const compression::CompressionConfig& config,
                                                              server::MemoryMode mode, const std::vector<int>& tokens,
                                                              const std::vector<int>& sizes, int prefill_chunk) {
  std::shared_ptr<server::SessionData> session;
  size_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    server::TurnSpec spec;
    spec.kind = i == 0 ? server::TurnKind::kCreate : server::TurnKind::kAppend;
    spec.tokens.assign(tokens.begin() + offset, tokens.begin() + offset + sizes[i]);
    offset += sizes[i];
    spec.config = config;
    spec.memory = mode;
    spec.base = session;
    spec.prefill_chunk = prefill_chunk;
    ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<server::TurnJob> job, server::TurnJob::Start(&m, std::move(spec)));
    while (!job->done()) {
      switch (job->next()) {
        case server::JobView::Next::kPrefill:
          ECHOKV_RETURN_IF_ERROR(job->Prefill(job->prefill_remaining()));
          break;
        case server::JobView::Next::kDecode: {
          const auto req = job->pending_decode();
          ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(req->token, req->view, /*return_queries=*/true));
          compression::LookaheadDecoder::Step step;
          step.logits = r.logits;
          step.queries = r.queries;
          ECHOKV_RETURN_IF_ERROR(job->SupplyDecode(std::move(step)));
          break;
        }
        case server::JobView::Next::kPhase:
          ECHOKV_RETURN_IF_ERROR(job->RunPhase());
          break;
        case server::JobView::Next::kWaiting:
          return absl::InternalError("a turn job that is not done waits");
      }
    }
    session = job->TakeSessionData();
    job->Committed();
  }
  return session;
}

absl::StatusOr<std::vector<MetricRow>> EvaluateImpl(const model::Transformer& m, const EvalOptions& opt,
                                                    const EvalCase& c) {
  const model::ModelConfig& cfg = m.config();
  const int64_t L = static_cast<int64_t>(c.prompt_ids.size());
  if (L == 0) return absl::InvalidArgumentError(absl::StrCat("case ", c.id, ": prompt_ids is empty"));
  ECHOKV_RETURN_IF_ERROR(CheckFitsImpl(cfg, opt, c));
  for (int t : c.prompt_ids) {
    if (t < 0 || t >= cfg.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("case ", c.id, ": prompt id ", t, " out of vocabulary"));
    }
  }
  std::vector<MetricRow> rows;
  const Emit emit = [&](const std::string& policy, int budget, const std::string& metric, double v) {
    rows.push_back(MetricRow{c.id, policy, budget, metric, v});
  };

  // One prefill that carries what every policy needs (anchor queries for echokv, all
  // context queries for h2o; the others take the last N of them).
  Reference ref;
  ref.context = m.NewCache();
  model::KvCache& context = ref.context;
  model::ForwardOptions fo;
  fo.return_anchor_queries = true;
  fo.keep_last_queries = -1;
  ECHOKV_ASSIGN_OR_RETURN(ref.pre, m.Forward(c.prompt_ids, &context, fo));
  const model::ForwardResult& pre = ref.pre;

  // Reference: greedy decode on the full cache. x[0] from the prefill; step s decodes
  // x[s-1] at position L+s-1 and yields logits full_logits[s-1] and queries q*_s.
  const int n_ref = opt.DecodeSteps();
  std::vector<int>& x = ref.x;
  x = {Greedy(pre.logits)};
  QueryTrace qstar;
  {
    model::KvCache full = context.Clone();
    for (int s = 1; s <= n_ref; ++s) {
      ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(x.back(), &full, true));
      ref.full_logits.push_back(ToVector(r.logits));
      qstar.push_back(r.queries);
      x.push_back(model::Argmax(ref.full_logits.back()));
    }
  }
  const bool table1 = opt.table1 && opt.one_shot;
  const int K = std::max(opt.oracle_steps, table1 ? opt.lookahead : 0);
  QueryTrace qstar_k(qstar.begin(), qstar.begin() + K);

  // Oracle sets per budget: I*_k and the union over k = 1..oracle_steps.
  std::map<int, std::vector<IndexSets>> oracle;  // budget -> per step
  for (int b : opt.budgets) {
    oracle[b] = StepTopK(context, qstar_k, b);
    IndexSets u(context.num_layers(), std::vector<std::vector<int64_t>>(context.num_kv_heads()));
    for (int k = 0; k < opt.oracle_steps; ++k) {
      for (size_t l = 0; l < u.size(); ++l) {
        for (size_t g = 0; g < u[l].size(); ++g) {
          std::vector<int64_t> merged;
          std::set_union(u[l][g].begin(), u[l][g].end(), oracle[b][k][l][g].begin(),
                         oracle[b][k][l][g].end(), std::back_inserter(merged));
          u[l][g] = std::move(merged);
        }
      }
    }
    ref.oracle_union[b] = std::move(u);
  }

  // Table 1, one lookahead per distinct B1 (W1 does not depend on B).
  if (table1) {
    std::map<int64_t, Table1Trace> traces;
    for (int b : opt.budgets) {
      const int64_t b1 = opt.ConfigFor(PolicyKind::kEchoKv, b).EffectiveWorkspace();
      if (!traces.count(b1)) {
        ECHOKV_ASSIGN_OR_RETURN(traces[b1], internal::RunTable1(m, context, pre.anchor_queries, x[0],
                                                      opt.lookahead, b1));
      }
      const Table1Trace& t = traces[b1];
      const std::vector<IndexSets> frozen = StepTopK(context, t.frozen, b);
      const std::vector<IndexSets> refreshed = StepTopK(context, t.refreshed, b);
      // How many leading lookahead tokens equal the full cache's greedy x_1..x_T.
      const std::vector<int> truth(x.begin() + 1, x.begin() + 1 + opt.lookahead);
      emit(kTable1Frozen, b, kMetricLookaheadMatch, MatchLength(truth, t.frozen_tokens, opt.lookahead));
      emit(kTable1Refreshed, b, kMetricLookaheadMatch, MatchLength(truth, t.refreshed_tokens, opt.lookahead));
      for (int k = 0; k < opt.lookahead; ++k) {
        const std::string metric = absl::StrCat(kTable1MetricPrefix, k + 1);
        emit(kTable1Frozen, b, metric, MeanOverlap(frozen[k], oracle[b][k]));
        emit(kTable1Refreshed, b, metric, MeanOverlap(refreshed[k], oracle[b][k]));
      }
    }
  }

  // Every (policy, budget), one-shot.
  if (opt.one_shot) {
    compression::CompressionInput in;
    in.context = &context;
    in.anchor_queries = pre.anchor_queries;
    in.last_queries = pre.queries;
    in.last_query_positions = pre.query_positions;
    in.last_logits = pre.logits;
    in.rope_inv_freq = m.RopeInvFreq();
    for (PolicyKind policy : opt.policies) {
      const std::string name(compression::PolicyName(policy));
      for (int b : opt.budgets) {
        compression::TransformerDecoder decoder(&m);
        in.decoder = &decoder;
        auto result = compression::Compress(opt.ConfigFor(policy, b), in);
        if (!result.ok()) {
          return absl::Status(result.status().code(), absl::StrCat("case ", c.id, ", ", name, " B=", b, ": ",
                                                                   result.status().message()));
        }
        ECHOKV_ASSIGN_OR_RETURN(model::KvCache compact, model::KvCache::Gather(context, result->indices));
        // Kept entries are context entry indices; for a fresh context those are positions.
        IndexSets kept;
        for (const at::Tensor& idx : result->indices) kept.push_back(Rows(idx));
        for (kernels::KvDtype dtype : opt.cache_dtypes) {
          if (policy == PolicyKind::kFull && dtype != kernels::KvDtype::kFloat32) continue;
          ECHOKV_ASSIGN_OR_RETURN(model::KvCache stored, compact.ToStorage(dtype));
          ECHOKV_RETURN_IF_ERROR(Measure(m, opt, c, ref, DtypeRowName(name, dtype), b, stored.Clone(), kept, x[0],
                                         emit));
        }
      }
    }
  }

  // Every (memory mode, policy, budget) as a session fed turn by turn.
  if (opt.turns > 0) {
    ECHOKV_ASSIGN_OR_RETURN(const std::vector<int> sizes, SplitTurns(c, opt.turns, opt.question_tokens));
    for (server::MemoryMode mode : opt.memory_modes) {
      for (PolicyKind policy : opt.policies) {
        for (kernels::KvDtype dtype : opt.cache_dtypes) {
        if (policy == PolicyKind::kFull && dtype != kernels::KvDtype::kFloat32) continue;
        const std::string name = DtypeRowName(TurnRowName(policy, mode), dtype);
        for (int b : opt.budgets) {
          compression::CompressionConfig cfg = opt.ConfigFor(policy, b);
          cfg.cache_dtype = dtype;
          auto session = RunTurns(m, cfg, mode, c.prompt_ids, sizes, opt.prefill_chunk);
          if (!session.ok()) {
            return absl::Status(session.status().code(), absl::StrCat("case ", c.id, ", ", name, " B=", b, ": ",
                                                                      session.status().message()));
          }
          const server::SessionData& data = **session;
          if (data.hot.next_position() != L) {
            return absl::InternalError(absl::StrCat("case ", c.id, ", ", name, ": the session holds ",
                                                    data.hot.next_position(), " positions, the prompt ", L));
          }
          // The hot tier's cells record the true position of every entry.
          IndexSets kept(data.hot.num_layers());
          for (int l = 0; l < data.hot.num_layers(); ++l) {
            for (int g = 0; g < data.hot.num_kv_heads(); ++g) {
              std::vector<int64_t> p = data.hot.cells().positions(l, g);
              std::sort(p.begin(), p.end());
              kept[l].push_back(std::move(p));
            }
          }
          ECHOKV_RETURN_IF_ERROR(
              Measure(m, opt, c, ref, name, b, data.hot.Clone(), kept, Greedy(data.last_logits), emit));
        }
        }
      }
    }
  }
  return rows;
}

}  // namespace

absl::Status EvalOptions::Validate() const {
  if (policies.empty()) return absl::InvalidArgumentError("policies: at least one is required");
  if (budgets.empty()) return absl::InvalidArgumentError("budgets: at least one is required");
  if (steps < 1 || steps > 4096) return absl::InvalidArgumentError(absl::StrCat("steps: ", steps, " is outside 1 ... 4096"));
  if (oracle_steps < 1 || oracle_steps > 64) {
    return absl::InvalidArgumentError(absl::StrCat("oracle_steps: ", oracle_steps, " is outside 1 ... 64"));
  }
  for (PolicyKind p : policies) {
    for (int b : budgets) {
      absl::Status s = ConfigFor(p, b).Validate();
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(compression::PolicyName(p), " at budget ", b, ": ", s.message()));
      }
    }
  }
  if (turns < 0 || turns > 4096) return absl::InvalidArgumentError(absl::StrCat("turns: ", turns, " is outside 0 ... 4096"));
  if (turns > 0 && memory_modes.empty()) return absl::InvalidArgumentError("memory_modes: at least one is required with turns");
  if (turns == 0 && !one_shot) return absl::InvalidArgumentError("one_shot: nothing to evaluate without turns");
  if (question_tokens.has_value() && *question_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("question_tokens: ", *question_tokens, " must be >= 1"));
  }
  if (prefill_chunk < 1) return absl::InvalidArgumentError(absl::StrCat("prefill_chunk: ", prefill_chunk, " must be >= 1"));
  if (table1) {
    for (int b : budgets) {
      absl::Status s = ConfigFor(PolicyKind::kEchoKv, b).Validate();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("table1 at budget ", b, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

compression::CompressionConfig EvalOptions::ConfigFor(PolicyKind policy, int budget) const {
  compression::CompressionConfig c;
  c.policy = policy;
  c.budget = budget;
  c.lookahead = lookahead;
  if (policy == PolicyKind::kEchoKv) {
    c.workspace = workspace;
    c.stage2_window = stage2_window;
  }
  if (policy == PolicyKind::kLaq) c.workspace = laq_workspace;
  return c;
}

int EvalOptions::DecodeSteps() const { return std::max({steps, lookahead, oracle_steps}); }

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const model::Transformer* model,
                                                             const EvalOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("model: must not be null");
  ECHOKV_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Evaluator>(new Evaluator(model, options));
}

int64_t Evaluator::PositionsNeeded(const EvalCase& eval_case) const {
  return PositionsNeededImpl(options_, eval_case);
}

absl::Status Evaluator::CheckFits(const EvalCase& eval_case) const {
  return CheckFitsImpl(model_->config(), options_, eval_case);
}

std::string TurnRowName(PolicyKind policy, server::MemoryMode mode) {
  return absl::StrCat(compression::PolicyName(policy), "/", server::MemoryModeName(mode));
}

absl::StatusOr<std::vector<MetricRow>> Evaluator::EvaluateCase(const EvalCase& eval_case) const {
  try {
    return EvaluateImpl(*model_, options_, eval_case);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("case ", eval_case.id, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("case ", eval_case.id, ": ", e.what()));
  }
}

std::vector<SummaryCell> Summarize(const std::vector<MetricRow>& rows, const BootstrapOptions& options) {
  std::vector<std::string> policy_order, metric_order;
  std::map<std::tuple<std::string, int, std::string>, std::vector<double>> groups;
  for (const MetricRow& r : rows) {
    if (std::find(policy_order.begin(), policy_order.end(), r.policy) == policy_order.end()) {
      policy_order.push_back(r.policy);
    }
    if (std::find(metric_order.begin(), metric_order.end(), r.metric) == metric_order.end()) {
      metric_order.push_back(r.metric);
    }
    groups[{r.policy, r.budget, r.metric}].push_back(r.value);
  }
  std::set<int> budgets;
  for (const MetricRow& r : rows) budgets.insert(r.budget);
  std::vector<SummaryCell> out;
  for (const std::string& p : policy_order) {
    for (int b : budgets) {
      for (const std::string& mname : metric_order) {
        auto it = groups.find({p, b, mname});
        if (it == groups.end()) continue;
        out.push_back(SummaryCell{p, b, mname, BootstrapMeanInterval(it->second, options)});
      }
    }
  }
  return out;
}

std::string ResultsCsv(const std::vector<MetricRow>& rows) {
  std::string out = "case_id,policy,budget,metric,value\n";
  for (const MetricRow& r : rows) {
    std::string id = r.case_id;
    if (id.find_first_of(",\"\n") != std::string::npos) {
      std::string q = "\"";
      for (char ch : id) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      id = q + "\"";
    }
    absl::StrAppend(&out, id, ",", r.policy, ",", r.budget, ",", r.metric, ",",
                    absl::StrFormat("%.9g", r.value), "\n");
  }
  return out;
}

namespace {

const SummaryCell* Find(const std::vector<SummaryCell>& cells, const std::string& policy, int budget,
                        const std::string& metric) {
  for (const SummaryCell& c : cells) {
    if (c.policy == policy && c.budget == budget && c.metric == metric) return &c;
  }
  return nullptr;
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string Cell(const SummaryCell* c, bool with_ci, const char* fmt) {
  if (c == nullptr) return "–";
  const std::string m = Fmt(fmt, c->stats.mean);
  if (!with_ci) return m;
  return absl::StrCat(m, " [", Fmt(fmt, c->stats.lo), ", ", Fmt(fmt, c->stats.hi), "]");
}

struct MetricInfo {
  const char* name;
  const char* title;
  const char* fmt;
};
constexpr MetricInfo kMetrics[] = {
    {kMetricKl, "Next-token KL(p_full ‖ p_policy), nats, mean over teacher-forced steps (lower is better)", "%.4f"},
    {kMetricTop1, "Top-1 agreement with the full cache over teacher-forced steps", "%.3f"},
    {kMetricMatchLength, "Greedy match length (tokens until the first difference from the full cache, capped at steps)", "%.2f"},
    {kMetricExactMatch, "Task exact match (cases with an answer)", "%.3f"},
    {kMetricEvidence, "Evidence retention (share of evidence tokens kept, mean over layers and KV groups)", "%.3f"},
    {kMetricOracleOverlap, "Oracle overlap: |I ∩ ∪_k I*_k| / |∪_k I*_k| over the first oracle_steps true queries", "%.3f"},
};

std::vector<int> BudgetsOf(const std::vector<SummaryCell>& cells) {
  std::set<int> b;
  for (const SummaryCell& c : cells) b.insert(c.budget);
  return std::vector<int>(b.begin(), b.end());
}

std::vector<std::string> PoliciesOf(const std::vector<SummaryCell>& cells) {
  std::vector<std::string> p;
  for (const SummaryCell& c : cells) {
    if (c.policy == kTable1Frozen || c.policy == kTable1Refreshed) continue;
    if (std::find(p.begin(), p.end(), c.policy) == p.end()) p.push_back(c.policy);
  }
  return p;
}

}  // namespace

std::string SummaryMarkdown(const std::vector<SummaryCell>& cells, const EvalOptions& options,
                            const std::string& header) {
  std::string out = header;
  const std::vector<int> budgets = BudgetsOf(cells);
  const std::vector<std::string> policies = PoliciesOf(cells);
  for (const MetricInfo& mi : kMetrics) {
    bool any = false;
    for (const SummaryCell& c : cells) any = any || c.metric == mi.name;
    if (!any) continue;
    absl::StrAppend(&out, "\n### ", mi.title, "\n\nmean [95% bootstrap interval] over cases");
    int count = 0;
    for (const SummaryCell& c : cells) {
      if (c.metric == mi.name) count = std::max(count, c.stats.count);
    }
    absl::StrAppend(&out, " (n = ", count, ")\n\n| policy |");
    for (int b : budgets) absl::StrAppend(&out, " B = ", b, " |");
    absl::StrAppend(&out, "\n| --- |");
    for (size_t i = 0; i < budgets.size(); ++i) absl::StrAppend(&out, " --- |");
    absl::StrAppend(&out, "\n");
    for (const std::string& p : policies) {
      absl::StrAppend(&out, "| ", p, " |");
      for (int b : budgets) absl::StrAppend(&out, " ", Cell(Find(cells, p, b, mi.name), true, mi.fmt), " |");
      absl::StrAppend(&out, "\n");
    }
  }
  // Table 1.
  std::vector<int> ks;
  for (int k : {1, 3, 6, 8}) {
    if (k <= options.lookahead) ks.push_back(k);
  }
  if (options.lookahead != 8) {
    ks.clear();
    for (int k = 1; k <= options.lookahead; ++k) ks.push_back(k);
  }
  bool any_t1 = false;
  for (const SummaryCell& c : cells) any_t1 = any_t1 || c.policy == kTable1Frozen;
  if (any_t1) {
    absl::StrAppend(&out, "\n### Table 1 replication: KV overlap with the true step-k query's top-B (T = ",
                    options.lookahead, ")\n");
    for (int b : budgets) {
      const SummaryCell* any_cell = Find(cells, kTable1Frozen, b, absl::StrCat(kTable1MetricPrefix, 1));
      if (any_cell == nullptr) continue;
      absl::StrAppend(&out, "\nB = ", b, " (n = ", any_cell->stats.count, ")\n\n| workspace strategy |");
      for (int k : ks) absl::StrAppend(&out, " k = ", k, " |");
      absl::StrAppend(&out, " leading lookahead tokens = full's (of ", options.lookahead, ") |");
      absl::StrAppend(&out, "\n| --- |");
      for (size_t i = 0; i <= ks.size(); ++i) absl::StrAppend(&out, " --- |");
      absl::StrAppend(&out, "\n");
      for (const auto& [policy, title] : {std::pair<const char*, const char*>{kTable1Frozen, "Frozen (T steps on W1)"},
                                          {kTable1Refreshed, "Refreshed at k = T/2"}}) {
        absl::StrAppend(&out, "| ", title, " |");
        for (int k : ks) {
          absl::StrAppend(&out, " ", Cell(Find(cells, policy, b, absl::StrCat(kTable1MetricPrefix, k)), true, "%.3f"),
                          " |");
        }
        absl::StrAppend(&out, " ", Cell(Find(cells, policy, b, kMetricLookaheadMatch), true, "%.2f"), " |");
        absl::StrAppend(&out, "\n");
      }
    }
  }
  return out;
}

PlotFiles MakePlots(const std::vector<SummaryCell>& cells) {
  PlotFiles files;
  const std::vector<int> budgets = BudgetsOf(cells);
  const std::vector<std::string> policies = PoliciesOf(cells);
  files.script =
      "# Drawn by echokv-eval: metric vs budget, one line per policy, bootstrap 95% intervals.\n"
      "set terminal pngcairo size 800,520 noenhanced\nset key outside right top\nset grid\n"
      "set xlabel 'budget B (entries per layer and KV group)'\nset logscale x 2\n";
  absl::StrAppend(&files.script, "set xrange [", budgets.empty() ? 1 : budgets.front() * 0.8, ":",
                  budgets.empty() ? 2 : budgets.back() * 1.25, "]\nset xtics (");
  for (size_t i = 0; i < budgets.size(); ++i) absl::StrAppend(&files.script, i ? ", " : "", budgets[i]);
  absl::StrAppend(&files.script, ")\n");
  for (const MetricInfo& mi : kMetrics) {
    std::string data;
    int blocks = 0;
    std::vector<std::string> titles;
    for (const std::string& p : policies) {
      std::string block;
      for (size_t i = 0; i < budgets.size(); ++i) {
        const SummaryCell* c = Find(cells, p, budgets[i], mi.name);
        if (c == nullptr) continue;
        // Small horizontal offsets keep overlapping error bars readable.
        const double x = budgets[i] * (1.0 + 0.02 * (static_cast<double>(titles.size()) - 3.0));
        absl::StrAppend(&block, absl::StrFormat("%.4f %.9g %.9g %.9g\n", x, c->stats.mean, c->stats.lo, c->stats.hi));
      }
      if (block.empty()) continue;
      absl::StrAppend(&data, "# ", p, "\n", block, "\n\n");
      titles.push_back(p);
      ++blocks;
    }
    if (blocks == 0) continue;
    const std::string dat = absl::StrCat(mi.name, ".dat");
    const std::string png = absl::StrCat(mi.name, ".png");
    files.data.emplace_back(dat, data);
    files.pngs.push_back(png);
    absl::StrAppend(&files.script, "set output '", png, "'\nset title '", mi.name, "'\nset ylabel '", mi.name,
                    "'\nplot ");
    for (int i = 0; i < blocks; ++i) {
      absl::StrAppend(&files.script, i ? ", \\\n     " : "", "'", dat, "' index ", i,
                      " using 1:2:3:4 with yerrorlines lw 2 title '", titles[i], "'");
    }
    absl::StrAppend(&files.script, "\n");
  }
  return files;
}

namespace internal {

absl::StatusOr<Table1Trace> RunTable1(const model::Transformer& m, const model::KvCache& ctx,
                                      const std::vector<at::Tensor>& anchors, int first_token,
                                      int lookahead, int64_t b1) {
  const int layers = ctx.num_layers();
  const int half = lookahead / 2;
  const at::Tensor inv = m.RopeInvFreq();
  std::vector<int64_t> future(lookahead);
  for (int t = 0; t < lookahead; ++t) future[t] = ctx.next_position() + t;
  std::vector<at::Tensor> w1;
  for (int l = 0; l < layers; ++l) {
    at::Tensor anchor = anchors[l].to(ctx.keys(l).device(), at::kFloat);
    at::Tensor proposals = kernels::RotateToPositions(anchor, future, inv);  // [H, T, d]
    w1.push_back(kernels::TopKIndices(GroupScores(ctx, l, proposals), b1));
  }
  Table1Trace out;
  ECHOKV_ASSIGN_OR_RETURN(model::KvCache view, model::KvCache::Gather(ctx, w1));
  // Round 1, shared by both rows.
  QueryTrace round1;
  int token = first_token;
  for (int k = 0; k < half; ++k) {
    ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(token, &view, true));
    round1.push_back(r.queries);
    token = Greedy(r.logits);
    out.frozen_tokens.push_back(token);
  }
  out.refreshed_tokens = out.frozen_tokens;
  const int after_round1 = token;

  // W2 from the round-1 queries over the full context, plus round 1's lookahead KV.
  std::vector<at::Tensor> w2;
  for (int l = 0; l < layers; ++l) {
    std::vector<at::Tensor> qs;
    for (const auto& step : round1) qs.push_back(step[l].to(at::kFloat));
    w2.push_back(kernels::TopKIndices(GroupScores(ctx, l, at::stack(qs, 1)), b1));
  }
  ECHOKV_ASSIGN_OR_RETURN(model::KvCache view2, model::KvCache::Gather(ctx, w2));
  ECHOKV_RETURN_IF_ERROR(view2.AppendTail(view, half));

  // Frozen: round 2 on W1.
  out.frozen = round1;
  token = after_round1;
  for (int k = half; k < lookahead; ++k) {
    ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(token, &view, true));
    out.frozen.push_back(r.queries);
    token = Greedy(r.logits);
    out.frozen_tokens.push_back(token);
  }
  // Refreshed: round 2 on W2.
  out.refreshed = round1;
  token = after_round1;
  for (int k = half; k < lookahead; ++k) {
    ECHOKV_ASSIGN_OR_RETURN(model::DecodeResult r, m.Decode(token, &view2, true));
    out.refreshed.push_back(r.queries);
    token = Greedy(r.logits);
    out.refreshed_tokens.push_back(token);
  }
  return out;
}

}  // namespace internal
}  // namespace echokv::eval
