// echokv-eval: fidelity of every eviction policy against the full cache on a JSONL case
// set (see bench/eval/evaluator.h for the metrics and bench/eval/dataset.h for the
// format). Writes results.csv, summary.md, plots.gp and one PNG per metric (gnuplot)
// into --out; prints progress (cases done / total, ETA) on stderr: one redrawn line on
// a terminal, separate lines at most every --progress_interval seconds elsewhere.
// A case that does not fit the model's positions (prompt + decode steps) is skipped with
// one warning line and counted in summary.md; --strict makes it an error instead.
//
//   echokv-eval --model /work/shared/models/stories260K --data bench/data/stories_eval.jsonl
//       --policies echokv,laq,snapkv,pyramidkv,h2o,streamingllm,full --budgets 32,64,128
//       --steps 32 --lookahead 8 --workspace 128 --out /tmp/eval
//
// The agent flow: --turns K feeds each case as K turns (the last one the question; see
// SplitTurns in bench/eval/dataset.h) through the server's turn jobs, once per memory
// mode of --memory, and reports the same metrics with rows "POLICY/MODE";
// --memory oneshot,tiered,evict adds the one-shot rows (and Table 1) to the same run.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/blas_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/eval/dataset.h"
#include "bench/eval/evaluator.h"
#include "bench/eval/progress.h"
#include "common/logging.h"
#include "compression/config.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "server/engine/session_store.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (required)");
ABSL_FLAG(std::string, data, "", "JSONL case file (required)");
ABSL_FLAG(std::string, policies, "echokv,laq,snapkv,pyramidkv,h2o,streamingllm,full",
          "policies, comma-separated");
ABSL_FLAG(std::string, budgets, "32,64,128", "budgets B per layer and KV group, comma-separated");
ABSL_FLAG(int, steps, 32, "teacher-forced / free-running decode steps per case");
ABSL_FLAG(int, lookahead, 8, "lookahead steps T (laq, echokv, Table 1)");
ABSL_FLAG(int, workspace, 0, "echokv workspace B1 (0 = its default 1024)");
ABSL_FLAG(int, laq_workspace, 0, "LAQ workspace B1 (0 = its default, the budget)");
ABSL_FLAG(int, stage2_window, 0, "echokv stage-2 window w");
ABSL_FLAG(int, oracle_steps, 8, "true decode steps K whose top-B union oracle_overlap uses");
ABSL_FLAG(bool, table1, true, "compute the Table 1 (frozen vs refreshed) overlaps");
ABSL_FLAG(int, turns, 0,
          "agent flow: feed each case as K turns (the last = the question part) through the server's turn "
          "jobs; 0 = the one-shot compression only");
ABSL_FLAG(std::string, memory, "tiered,evict",
          "with --turns: memory modes, comma-separated (tiered, evict; oneshot adds the one-shot rows)");
ABSL_FLAG(int, question_tokens, 0,
          "with --turns: tokens of the final (question) turn (0 = after the last evidence span, else 8)");
ABSL_FLAG(int, prefill_chunk, 256, "with --turns: tokens per prefill call of a turn (the server's default)");
ABSL_FLAG(std::string, cache_dtypes, "float32",
          "storages of the compact cache, comma-separated: float32, int8 (issue 31; int8 rows: policy@int8)");
ABSL_FLAG(int, limit, 0, "evaluate only the first N cases (0 = all)");
ABSL_FLAG(int, threads, 0, "LibTorch threads (0 = $ECHOKV_THREADS or all cores)");
ABSL_FLAG(int, resamples, 2000, "bootstrap resamples for the 95% intervals");
ABSL_FLAG(int, seed, 0, "bootstrap RNG seed");
ABSL_FLAG(std::string, out, "eval_out", "output directory");
ABSL_FLAG(bool, plots, true, "draw PNG plots with gnuplot");
ABSL_FLAG(bool, strict, false,
          "fail the run on a case that does not fit the model's positions (default: skip it with a warning)");
ABSL_FLAG(double, progress_interval, 5.0,
          "when stderr is not a terminal: seconds between progress lines (first and last case always print)");

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "echokv-eval: error: %s\n", msg.c_str());
  return 1;
}

absl::StatusOr<std::vector<int>> ParseInts(const std::string& s, const char* field) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": \"", p, "\" is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

bool WriteFile(const std::filesystem::path& path, const std::string& contents) {
  std::ofstream f(path, std::ios::binary);
  f << contents;
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  absl::SetProgramUsageMessage("echokv-eval --model DIR --data FILE.jsonl [--policies ...] [--budgets ...] [--out DIR]");
  absl::ParseCommandLine(argc, argv);
  echokv::InitLogging(argv[0]);
  std::string command = "echokv-eval";
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command, " ", argv[i]);
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string data_path = absl::GetFlag(FLAGS_data);
  if (model_dir.empty()) return Fail("--model is required");
  if (data_path.empty()) return Fail("--data is required");

  echokv::eval::EvalOptions opt;
  opt.policies.clear();
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    auto kind = echokv::compression::ParsePolicyKind(p);
    if (!kind.ok()) return Fail(absl::StrCat("--policies: ", kind.status().message()));
    opt.policies.push_back(*kind);
  }
  auto budgets = ParseInts(absl::GetFlag(FLAGS_budgets), "--budgets");
  if (!budgets.ok()) return Fail(std::string(budgets.status().message()));
  opt.budgets = *budgets;
  opt.steps = absl::GetFlag(FLAGS_steps);
  opt.lookahead = absl::GetFlag(FLAGS_lookahead);
  if (absl::GetFlag(FLAGS_workspace) != 0) opt.workspace = absl::GetFlag(FLAGS_workspace);
  if (absl::GetFlag(FLAGS_laq_workspace) != 0) opt.laq_workspace = absl::GetFlag(FLAGS_laq_workspace);
  opt.stage2_window = absl::GetFlag(FLAGS_stage2_window);
  opt.oracle_steps = absl::GetFlag(FLAGS_oracle_steps);
  opt.table1 = absl::GetFlag(FLAGS_table1);
  opt.turns = absl::GetFlag(FLAGS_turns);
  if (opt.turns > 0) {
    opt.memory_modes.clear();
    opt.one_shot = false;
    for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_memory), ',', absl::SkipEmpty())) {
      if (m == "oneshot") {
        opt.one_shot = true;
        continue;
      }
      auto mode = echokv::server::ParseMemoryMode(m);
      if (!mode.ok()) return Fail(absl::StrCat("--memory: \"", m, "\" is not tiered, evict or oneshot"));
      opt.memory_modes.push_back(*mode);
    }
    if (opt.memory_modes.empty()) return Fail("--memory: give tiered and/or evict with --turns");
  }
  opt.cache_dtypes.clear();
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_cache_dtypes), ',', absl::SkipEmpty())) {
    echokv::kernels::KvDtype dtype;
    if (!echokv::kernels::ParseKvDtype(std::string(d), &dtype) || dtype == echokv::kernels::KvDtype::kBFloat16) {
      return Fail(absl::StrCat("--cache_dtypes: \"", d, "\" is not float32 or int8"));
    }
    opt.cache_dtypes.push_back(dtype);
  }
  if (opt.cache_dtypes.empty()) return Fail("--cache_dtypes: give float32 and/or int8");
  if (absl::GetFlag(FLAGS_question_tokens) != 0) opt.question_tokens = absl::GetFlag(FLAGS_question_tokens);
  opt.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (absl::Status s = opt.Validate(); !s.ok()) return Fail(s.ToString());

  echokv::model::DeviceOptions dev;
  dev.num_threads = absl::GetFlag(FLAGS_threads);
  auto model = echokv::model::Transformer::Load(model_dir, dev);
  if (!model.ok()) return Fail(model.status().ToString());
  auto tokenizer = echokv::model::LoadTokenizer(model_dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status().ToString());
  auto cases = echokv::eval::ReadDataset(data_path, tokenizer->get(), (*model)->config().vocab_size);
  if (!cases.ok()) return Fail(cases.status().ToString());
  if (absl::GetFlag(FLAGS_limit) > 0 && static_cast<size_t>(absl::GetFlag(FLAGS_limit)) < cases->size()) {
    cases->resize(absl::GetFlag(FLAGS_limit));
  }
  auto evaluator = echokv::eval::Evaluator::Create(model->get(), opt);
  if (!evaluator.ok()) return Fail(evaluator.status().ToString());

  const std::filesystem::path out_dir(absl::GetFlag(FLAGS_out));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail(absl::StrCat("--out: cannot create ", out_dir.string(), ": ", ec.message()));

  std::vector<echokv::eval::MetricRow> rows;
  std::vector<std::string> skipped;  // ids of cases that do not fit the model's positions
  const auto t0 = std::chrono::steady_clock::now();
  const size_t total = cases->size();
  const bool terminal = isatty(fileno(stderr)) == 1;
  echokv::eval::ProgressReporter progress(terminal, absl::GetFlag(FLAGS_progress_interval));
  for (size_t i = 0; i < total; ++i) {
    const echokv::eval::EvalCase& c = (*cases)[i];
    // One long case must not throw away the rest of a long run: skip it, say so once,
    // and count it in the summary (--strict keeps the old hard error).
    if (absl::Status fits = (*evaluator)->CheckFits(c); !fits.ok()) {
      if (absl::GetFlag(FLAGS_strict)) return Fail(absl::StrCat(fits.message(), " (--strict)"));
      std::fprintf(stderr, "%s[echokv-eval] warning: skipping %s\n", terminal ? "\r\033[K" : "",
                   std::string(fits.message()).c_str());
      skipped.push_back(c.id);
    } else {
      auto r = (*evaluator)->EvaluateCase(c);
      if (!r.ok()) return Fail(r.status().ToString());
      rows.insert(rows.end(), r->begin(), r->end());
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fputs(progress.Update(i + 1, total, elapsed).c_str(), stderr);
    std::fflush(stderr);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fputs(progress.Finish().c_str(), stderr);
  if (skipped.size() == total && total > 0) {
    return Fail(absl::StrCat("every case (", total, ") was skipped: none fits the model's ",
                             (*model)->config().max_position_embeddings, " positions"));
  }

  echokv::eval::BootstrapOptions bo;
  bo.resamples = absl::GetFlag(FLAGS_resamples);
  bo.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  const auto cells = echokv::eval::Summarize(rows, bo);

  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string header = absl::StrCat(
      "# echokv-eval summary\n\n```\n", command, "\n```\n\n- model: ", model_dir, "\n- data: ", data_path,
      " (", total, " cases, ", total - skipped.size(), " evaluated)\n- skipped: ", skipped.size(),
      skipped.empty() ? std::string()
                      : absl::StrCat(" (", absl::StrJoin(skipped, ", "), ": prompt + decode steps exceed the model's ",
                                     (*model)->config().max_position_embeddings, " positions)"),
      "\n- steps ", opt.steps, ", lookahead T ", opt.lookahead, ", echokv workspace B1 ",
      opt.ConfigFor(echokv::compression::PolicyKind::kEchoKv, opt.budgets.front()).EffectiveWorkspace(),
      ", oracle steps K ", opt.oracle_steps,
      opt.turns > 0 ? absl::StrCat("\n- agent flow: ", opt.turns, " turns per case (the last one the question, ",
                                   opt.question_tokens.has_value() ? absl::StrCat(*opt.question_tokens, " tokens")
                                                                   : std::string("after the last evidence span, else 8 tokens"),
                                   "), prefill chunk ", opt.prefill_chunk, ", rows POLICY/MODE; one-shot rows ",
                                   opt.one_shot ? "included" : "not run")
                    : std::string(),
      "\n- evaluation time ", absl::StrFormat("%.1f", seconds),
      " s, ", date, "\n");
  if (!WriteFile(out_dir / "results.csv", echokv::eval::ResultsCsv(rows)) ||
      !WriteFile(out_dir / "summary.md", echokv::eval::SummaryMarkdown(cells, opt, header))) {
    return Fail(absl::StrCat("cannot write into ", out_dir.string()));
  }
  if (absl::GetFlag(FLAGS_plots)) {
    const echokv::eval::PlotFiles plots = echokv::eval::MakePlots(cells);
    bool ok = WriteFile(out_dir / "plots.gp", plots.script);
    for (const auto& [name, contents] : plots.data) ok = ok && WriteFile(out_dir / name, contents);
    if (!ok) return Fail(absl::StrCat("cannot write plot files into ", out_dir.string()));
    const std::string cmd = absl::StrCat("cd '", out_dir.string(), "' && gnuplot plots.gp");
    if (std::system(cmd.c_str()) != 0) {
      ECHOKV_LOG(WARNING) << "gnuplot failed (is gnuplot installed?); plots.gp and the .dat files are in "
                          << out_dir.string();
    }
  }
  std::fprintf(stderr, "[echokv-eval] %zu cases in %.1f s (%zu skipped); wrote %s/{results.csv,summary.md,plots}\n",
               total, seconds, skipped.size(), out_dir.string().c_str());
  return 0;
}
