// The evaluator's case file: JSONL, one case per line,
//   {"id": "...", "prompt": "..." | "prompt_ids": [...],
//    "answer": "..." | "answer_ids": [...]            (optional),
//    "evidence_spans": [[start, end], ...]            (optional, token spans of the
//                                                     prompt ids, end exclusive),
//    "turns": [n_1, ..., n_K]                         (optional, the agent flow of
//                                                     `echokv-eval --turns`: the prompt
//                                                     ids fed as K turns of n_i tokens,
//                                                     the last one the question; each
//                                                     n_i >= 1, sum = |prompt ids|)}
// Other keys are ignored (e.g. a human-readable "text"). Blank lines are skipped. Every
// error names the line number and the field.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto tok, model::LoadTokenizer(model_dir));
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<EvalCase> cases, ReadDataset("set.jsonl", tok.get()));
//   for (const EvalCase& c : cases) Use(c.prompt_ids, c.answer_ids, c.evidence_spans);
#ifndef ECHOKV_BENCH_EVAL_DATASET_H_
#define ECHOKV_BENCH_EVAL_DATASET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer.h"

namespace echokv::eval {

struct EvalCase {
  std::string id;
  std::vector<int> prompt_ids;   // the context (BOS included when the text was encoded)
  std::vector<int> answer_ids;   // empty = no task answer
  // Half-open token spans [start, end) of prompt_ids; 0 <= start < end <= |prompt_ids|.
  std::vector<std::pair<int64_t, int64_t>> evidence_spans;
  // Token counts of the case's own turns (empty = split by SplitTurns); sum = |prompt_ids|.
  std::vector<int> turns;
  int line = 0;                  // 1-based line of the file it came from
};

// Parses one line. `tokenizer` encodes "prompt" / "answer" text (may be null when the
// line holds ids only; text then is an error). Ids must lie in [0, vocab_size).
// A text answer is tokenized together with the prompt (Encode(prompt + answer)) and
// must leave the prompt's ids unchanged, so " Mia" after "...was" yields the ids the
// model would produce.
absl::StatusOr<EvalCase> ParseCase(absl::string_view line, int line_number,
                                   const model::Tokenizer* tokenizer, int vocab_size);

// Parses every non-blank line of `text`; ids must be unique ("id" duplicate -> error).
absl::StatusOr<std::vector<EvalCase>> ParseDataset(absl::string_view text,
                                                   const model::Tokenizer* tokenizer,
                                                   int vocab_size);

// Reads and parses a JSONL file (NotFound when it cannot be opened).
absl::StatusOr<std::vector<EvalCase>> ReadDataset(const std::string& path,
                                                  const model::Tokenizer* tokenizer,
                                                  int vocab_size);

// One JSON line (no newline) for `c`: "id", "prompt_ids", optional "answer_ids",
// "evidence_spans" and "turns", plus any extra string fields given (e.g. {"text", ...}).
std::string CaseToJsonLine(const EvalCase& c,
                           const std::vector<std::pair<std::string, std::string>>& extra = {});

// The agent flow's turns of a case (token counts, in order; the last is the question):
//  - the case's own `turns` when it lists them (`k` is then ignored);
//  - k = 1: the whole prompt as one turn (the one-shot compression, exactly);
//  - otherwise the last q prompt tokens are the final (question) turn and the L - q
//    before them are split into k - 1 parts whose sizes differ by at most one, the
//    larger ones first. q = `question_tokens` when given, else the tokens after the last
//    evidence span when the case has spans and any follow them, else 8.
// InvalidArgument naming the case when k < 1, q < 1, or L - q < k - 1 (a turn would be
// empty).
absl::StatusOr<std::vector<int>> SplitTurns(const EvalCase& c, int k, std::optional<int> question_tokens);

}  // namespace echokv::eval

#endif  // ECHOKV_BENCH_EVAL_DATASET_H_
