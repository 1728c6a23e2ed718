// The fidelity evaluator behind `echokv-eval`: runs every (policy, budget) on one case
// and measures it against the uncompressed model (the full cache), per case:
//   kl, top1            next-token KL(p_full ‖ p_policy) and top-1 agreement, averaged
//                       over `steps` teacher-forced decode steps on the full cache's
//                       greedy continuation
//   match_len           leading tokens of the policy's free-running greedy output that
//                       equal the full cache's (1 ... steps)
//   exact_match         greedy output of |answer| tokens == answer (cases with an answer)
//   evidence_retention  share of evidence tokens kept, mean over layers and KV groups
//   oracle_overlap      |I ∩ ∪_k I*_k| / |∪_k I*_k|: I*_k = TopK_B of the Eq. 3 scores of
//                       the full cache's true step-k queries, k = 1 ... oracle_steps
// and the paper's Table 1 (policies "table1_frozen" / "table1_refreshed", metrics
// "overlap_k1" ... "overlap_kT"): |TopK_B(score(q̂_k)) ∩ I*_k| / |I*_k| with q̂_k the
// step-k lookahead query on EchoKV's bootstrap workspace W1 (frozen for T steps), or
// with W1 rebuilt at k = T/2 from the round-1 queries (EchoKV's repair).
//
//   EvalOptions opt; opt.budgets = {32, 64, 128}; opt.workspace = 128;
//   ECHOKV_ASSIGN_OR_RETURN(auto ev, Evaluator::Create(model.get(), opt));
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<MetricRow> rows, ev->EvaluateCase(eval_case));
//   std::vector<SummaryCell> table = Summarize(rows, {});
#ifndef ECHOKV_BENCH_EVAL_EVALUATOR_H_
#define ECHOKV_BENCH_EVAL_EVALUATOR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/eval/dataset.h"
#include "bench/eval/metrics.h"
#include "compression/config.h"
#include "model/transformer.h"
#include "server/engine/session_store.h"

namespace echokv::eval {

// Metric names of MetricRow::metric.
inline constexpr char kMetricKl[] = "kl";
inline constexpr char kMetricTop1[] = "top1";
inline constexpr char kMetricMatchLength[] = "match_len";
inline constexpr char kMetricExactMatch[] = "exact_match";
inline constexpr char kMetricEvidence[] = "evidence_retention";
inline constexpr char kMetricOracleOverlap[] = "oracle_overlap";
// Table 1 rows (MetricRow::policy) and its metric prefix ("overlap_k3").
inline constexpr char kTable1Frozen[] = "table1_frozen";
inline constexpr char kTable1Refreshed[] = "table1_refreshed";
inline constexpr char kTable1MetricPrefix[] = "overlap_k";
// Table 1 rows also report how many leading lookahead tokens x̂_1..x̂_T equal the full
// cache's greedy tokens (0 ... T): once they differ, q̂_k and q*_k follow different text.
inline constexpr char kMetricLookaheadMatch[] = "lookahead_match";

struct EvalOptions {
  std::vector<compression::PolicyKind> policies = {
      compression::PolicyKind::kEchoKv, compression::PolicyKind::kLaq,
      compression::PolicyKind::kSnapKv, compression::PolicyKind::kPyramidKv,
      compression::PolicyKind::kH2o,    compression::PolicyKind::kStreamingLlm,
      compression::PolicyKind::kFull};
  std::vector<int> budgets = {32, 64, 128};  // B per layer and KV group
  int steps = 32;                  // teacher-forced / free-running steps, 1 ... 4096
  int lookahead = 8;               // T of laq, echokv and Table 1 (even, 2 ... 64)
  std::optional<int> workspace;    // echokv's B1 (and Table 1's W1); default 1024
  std::optional<int> laq_workspace;  // LAQ's B1; default = budget
  int stage2_window = 0;           // echokv's w
  int oracle_steps = 8;            // K of oracle_overlap's union, 1 ... 64
  bool table1 = true;              // compute the Table 1 rows (one-shot only)

  // The agent flow (docs/RESULTS.md "Agent flow"). 0: the one-shot compression only.
  // K >= 1: every case is also fed as the turns SplitTurns(case, K, question_tokens)
  // gives (kCreate, then kAppend) through server::TurnJob — the code a server session
  // runs — once per memory mode, and the session's hot tier after the last turn is
  // measured like a one-shot compact cache, in rows whose policy is TurnRowName().
  // The reference (full cache, oracle sets) is the one-shot prefill of the whole prompt.
  // The session's first token is the argmax of its own last logits: when it differs
  // from the full cache's, match_len is 0 and the exact-match run starts from it.
  int turns = 0;
  std::vector<server::MemoryMode> memory_modes = {server::MemoryMode::kTiered, server::MemoryMode::kEvict};
  bool one_shot = true;            // with turns > 0: also the one-shot rows (and Table 1)
  std::optional<int> question_tokens;  // SplitTurns' q (default: after the evidence, or 8)
  int prefill_chunk = 256;         // TurnSpec::prefill_chunk (the server's default, and the
                                   // one-shot prefill's ForwardOptions::chunk_size)
  // Storages of the compact cache (issue 31): each non-full policy and budget is measured
  // once per dtype; an int8 row's policy column gets "@int8" ("echokv@int8",
  // "echokv/tiered@int8"). The full cache stays float32 (the reference).
  std::vector<kernels::KvDtype> cache_dtypes = {kernels::KvDtype::kFloat32};

  // Non-empty policies and budgets, bounds above, and every per-policy config valid;
  // the message names the field.
  absl::Status Validate() const;
  // The compression config of (policy, budget) under these options.
  compression::CompressionConfig ConfigFor(compression::PolicyKind policy, int budget) const;
  // Decode positions a case needs after its prompt: max(steps, lookahead, oracle_steps).
  int DecodeSteps() const;
};

// The policy column of an agent-flow row: "echokv/tiered", "snapkv/evict".
std::string TurnRowName(compression::PolicyKind policy, server::MemoryMode mode);

// One measurement: a row of results.csv.
struct MetricRow {
  std::string case_id;
  std::string policy;   // PolicyName(...) or kTable1Frozen / kTable1Refreshed
  int budget = 0;
  std::string metric;
  double value = 0;
};

class Evaluator {
 public:
  // `model` is not owned and must outlive the evaluator. Options are validated.
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const model::Transformer* model,
                                                           const EvalOptions& options);

  // Every metric of every (policy, budget) for one case, plus the Table 1 rows.
  // The case must fit the model's positions (CheckFits; its error otherwise).
  // Deterministic.
  absl::StatusOr<std::vector<MetricRow>> EvaluateCase(const EvalCase& eval_case) const;

  // Positions the case feeds to the model: the prompt (0 .. L-1), then the tokens the
  // decode loops feed back. The full-cache reference feeds x_0 .. x_{S-1} for
  // S = DecodeSteps() (it samples x_S and never feeds it); the exact-match run feeds
  // all but the last of its |answer| tokens. So L + max(S, |answer| - 1).
  int64_t PositionsNeeded(const EvalCase& eval_case) const;

  // OK when PositionsNeeded() <= the model's max_position_embeddings (or the model
  // declares none); InvalidArgument naming the case, its line and the fields otherwise.
  // That is: L + S <= max_pos and L + |answer| <= max_pos + 1, the bound of a
  // generator whose last token is not fed back (llama2.c's run.c, echokv-generate).
  // With turns > 0 the case must also split into them (SplitTurns' error otherwise).
  absl::Status CheckFits(const EvalCase& eval_case) const;

  const EvalOptions& options() const { return options_; }

 private:
  Evaluator(const model::Transformer* model, const EvalOptions& options)
      : model_(model), options_(options) {}
  const model::Transformer* model_;  // not owned
  EvalOptions options_;              // validated
};

// Mean and bootstrap interval of every (policy, budget, metric) over the cases that
// have it, in first-seen order of policy, then budget ascending, then metric.
struct SummaryCell {
  std::string policy;
  int budget = 0;
  std::string metric;
  MeanInterval stats;
};
std::vector<SummaryCell> Summarize(const std::vector<MetricRow>& rows, const BootstrapOptions& options);

// results.csv: header "case_id,policy,budget,metric,value", one row per MetricRow.
std::string ResultsCsv(const std::vector<MetricRow>& rows);

// summary.md: a table per metric (rows = policies, columns = budgets, "mean [lo, hi]"),
// the Table 1 replication per budget (k = 1, 3, 6, 8 when T = 8), and case counts.
// `header` is written first (the command line, model, date).
std::string SummaryMarkdown(const std::vector<SummaryCell>& cells, const EvalOptions& options,
                            const std::string& header);

// Gnuplot input for the metric-vs-budget plots: writes `<metric>.dat` data blocks
// (returned as (file name, contents)) and a script that draws `<metric>.png`, one line
// per policy with the bootstrap interval as error bars, into the current directory.
struct PlotFiles {
  std::vector<std::pair<std::string, std::string>> data;  // file name, contents
  std::string script;                                      // plots.gp
  std::vector<std::string> pngs;                           // the images it draws
};
PlotFiles MakePlots(const std::vector<SummaryCell>& cells);

namespace internal {

// The Table 1 lookahead on one context for workspace capacity B1 (docs/ALGORITHM.md §3
// steps 2-5 with the kernels EchoKV uses; exposed so tests can compare it with the
// EchoKV policy's own run): frozen = T greedy steps on W1; refreshed = T/2 steps on
// W1, then W2 = TopK_B1 of the round-1 queries over the full context, then T/2 steps
// on W2 plus round 1's lookahead KV.
struct Table1Trace {
  // Per step k = 1..T (index k-1), per layer: the step's post-RoPE queries [H, d] float32.
  std::vector<std::vector<at::Tensor>> frozen, refreshed;
  std::vector<int> frozen_tokens, refreshed_tokens;  // x_1 ... x_T chosen on the way
};
// context: the prefilled cache (L entries, next_position L); anchors: per layer [H, d]
// pre-RoPE queries of the last context token; first_token: argmax of the prefill logits.
absl::StatusOr<Table1Trace> RunTable1(const model::Transformer& model, const model::KvCache& context,
                                      const std::vector<at::Tensor>& anchors, int first_token,
                                      int lookahead, int64_t workspace);

}  // namespace internal

}  // namespace echokv::eval

#endif  // ECHOKV_BENCH_EVAL_EVALUATOR_H_
