#include "bench/eval/dataset.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace echokv::eval {
namespace {

using Json = nlohmann::json;

absl::Status LineError(int line, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": field \"", field, "\": ", what));
}

// An array of ints in [0, vocab_size), non-empty.
absl::StatusOr<std::vector<int>> ParseIds(const Json& v, int line, absl::string_view field,
                                          int vocab_size) {
  if (!v.is_array()) return LineError(line, field, "must be an array of token ids");
  if (v.empty()) return LineError(line, field, "must not be empty");
  std::vector<int> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer()) {
      return LineError(line, field, absl::StrCat("element ", i, " is not an integer"));
    }
    const int64_t id = v[i].get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return LineError(line, field,
                       absl::StrCat("element ", i, " = ", id, " is out of range [0, ", vocab_size, ")"));
    }
    ids.push_back(static_cast<int>(id));
  }
  return ids;
}

absl::StatusOr<std::vector<int>> Encode(const model::Tokenizer* tokenizer, const std::string& text,
                                        int line, absl::string_view field) {
  if (tokenizer == nullptr) return LineError(line, field, "text given but no tokenizer is loaded");
  auto ids = tokenizer->Encode(text);
  if (!ids.ok()) return LineError(line, field, ids.status().message());
  return *std::move(ids);
}

}  // namespace

absl::StatusOr<EvalCase> ParseCase(absl::string_view line_text, int line,
                                   const model::Tokenizer* tokenizer, int vocab_size) {
  Json j = Json::parse(line_text.begin(), line_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("line ", line, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat("line ", line, ": not a JSON object"));
  EvalCase c;
  c.line = line;

  auto id = j.find("id");
  if (id == j.end()) return LineError(line, "id", "missing");
  if (id->is_string()) {
    c.id = id->get<std::string>();
  } else if (id->is_number_integer()) {
    c.id = std::to_string(id->get<int64_t>());
  } else {
    return LineError(line, "id", "must be a string");
  }
  if (c.id.empty()) return LineError(line, "id", "must not be empty");

  auto prompt = j.find("prompt");
  auto prompt_ids = j.find("prompt_ids");
  std::string prompt_text;
  if ((prompt == j.end()) == (prompt_ids == j.end())) {
    return LineError(line, "prompt", "exactly one of \"prompt\" and \"prompt_ids\" is required");
  }
  if (prompt_ids != j.end()) {
    ECHOKV_ASSIGN_OR_RETURN(c.prompt_ids, ParseIds(*prompt_ids, line, "prompt_ids", vocab_size));
  } else {
    if (!prompt->is_string()) return LineError(line, "prompt", "must be a string");
    prompt_text = prompt->get<std::string>();
    if (prompt_text.empty()) return LineError(line, "prompt", "must not be empty");
    ECHOKV_ASSIGN_OR_RETURN(c.prompt_ids, Encode(tokenizer, prompt_text, line, "prompt"));
    if (c.prompt_ids.empty()) return LineError(line, "prompt", "encodes to no tokens");
    for (int t : c.prompt_ids) {
      if (t < 0 || t >= vocab_size) return LineError(line, "prompt", "encodes to an id outside the model's vocabulary");
    }
  }

  auto answer = j.find("answer");
  auto answer_ids = j.find("answer_ids");
  if (answer != j.end() && answer_ids != j.end()) {
    return LineError(line, "answer", "give \"answer\" or \"answer_ids\", not both");
  }
  if (answer_ids != j.end()) {
    ECHOKV_ASSIGN_OR_RETURN(c.answer_ids, ParseIds(*answer_ids, line, "answer_ids", vocab_size));
  } else if (answer != j.end()) {
    if (!answer->is_string()) return LineError(line, "answer", "must be a string");
    const std::string a = answer->get<std::string>();
    if (a.empty()) return LineError(line, "answer", "must not be empty");
    if (tokenizer == nullptr) return LineError(line, "answer", "text given but no tokenizer is loaded");
    // Tokenize with the prompt so the answer's ids are those that would follow it.
    std::string base = prompt_text;
    if (prompt_ids != j.end()) {
      auto decoded = tokenizer->Decode(c.prompt_ids);
      if (!decoded.ok()) return LineError(line, "prompt_ids", decoded.status().message());
      base = *decoded;
    }
    ECHOKV_ASSIGN_OR_RETURN(std::vector<int> joint, Encode(tokenizer, base + a, line, "answer"));
    if (joint.size() <= c.prompt_ids.size() ||
        !std::equal(c.prompt_ids.begin(), c.prompt_ids.end(), joint.begin())) {
      return LineError(line, "answer",
                       "tokenizing prompt + answer changes the prompt's tokens; give \"answer_ids\"");
    }
    c.answer_ids.assign(joint.begin() + c.prompt_ids.size(), joint.end());
    for (int t : c.answer_ids) {
      if (t >= vocab_size) return LineError(line, "answer", "encodes to an id outside the model's vocabulary");
    }
  }

  auto spans = j.find("evidence_spans");
  if (spans != j.end()) {
    if (!spans->is_array()) return LineError(line, "evidence_spans", "must be an array of [start, end] pairs");
    const int64_t n = static_cast<int64_t>(c.prompt_ids.size());
    for (size_t i = 0; i < spans->size(); ++i) {
      const Json& s = (*spans)[i];
      if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) {
        return LineError(line, "evidence_spans", absl::StrCat("element ", i, " is not an [start, end] integer pair"));
      }
      const int64_t a = s[0].get<int64_t>(), b = s[1].get<int64_t>();
      if (a < 0 || b > n || a >= b) {
        return LineError(line, "evidence_spans",
                         absl::StrCat("element ", i, " = [", a, ", ", b, ") is out of range for ", n,
                                      " prompt tokens (need 0 <= start < end <= ", n, ")"));
      }
      c.evidence_spans.emplace_back(a, b);
    }
  }

  auto turns = j.find("turns");
  if (turns != j.end()) {
    if (!turns->is_array() || turns->empty()) {
      return LineError(line, "turns", "must be a non-empty array of token counts");
    }
    int64_t sum = 0;
    for (size_t i = 0; i < turns->size(); ++i) {
      const Json& t = (*turns)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 1) {
        return LineError(line, "turns", absl::StrCat("element ", i, " is not a positive integer"));
      }
      sum += t.get<int64_t>();
      if (sum > static_cast<int64_t>(c.prompt_ids.size())) break;
      c.turns.push_back(static_cast<int>(t.get<int64_t>()));
    }
    if (sum != static_cast<int64_t>(c.prompt_ids.size())) {
      return LineError(line, "turns",
                       absl::StrCat("the token counts must add up to the prompt's ", c.prompt_ids.size(),
                                    " tokens (they add up to ", sum, sum > static_cast<int64_t>(c.prompt_ids.size()) ? " or more" : "", ")"));
    }
  }
  return c;
}

absl::StatusOr<std::vector<EvalCase>> ParseDataset(absl::string_view text,
                                                   const model::Tokenizer* tokenizer, int vocab_size) {
  std::vector<EvalCase> cases;
  std::set<std::string> ids;
  int line = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == absl::string_view::npos) end = text.size();
    ++line;
    absl::string_view l = absl::StripAsciiWhitespace(text.substr(start, end - start));
    if (!l.empty()) {
      ECHOKV_ASSIGN_OR_RETURN(EvalCase c, ParseCase(l, line, tokenizer, vocab_size));
      if (!ids.insert(c.id).second) return LineError(line, "id", absl::StrCat("duplicate id \"", c.id, "\""));
      cases.push_back(std::move(c));
    }
    start = end + 1;
  }
  if (cases.empty()) return absl::InvalidArgumentError("dataset: no cases");
  return cases;
}

absl::StatusOr<std::vector<EvalCase>> ReadDataset(const std::string& path,
                                                  const model::Tokenizer* tokenizer, int vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("data: cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto cases = ParseDataset(ss.str(), tokenizer, vocab_size);
  if (!cases.ok()) {
    return absl::Status(cases.status().code(), absl::StrCat(path, ": ", cases.status().message()));
  }
  return cases;
}

std::string CaseToJsonLine(const EvalCase& c,
                           const std::vector<std::pair<std::string, std::string>>& extra) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["id"] = c.id;
  j["prompt_ids"] = c.prompt_ids;
  if (!c.answer_ids.empty()) j["answer_ids"] = c.answer_ids;
  if (!c.evidence_spans.empty()) {
    nlohmann::ordered_json spans = nlohmann::ordered_json::array();
    for (const auto& s : c.evidence_spans) spans.push_back({s.first, s.second});
    j["evidence_spans"] = spans;
  }
  if (!c.turns.empty()) j["turns"] = c.turns;
  for (const auto& [k, v] : extra) j[k] = v;
  return j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::StatusOr<std::vector<int>> SplitTurns(const EvalCase& c, int k, std::optional<int> question_tokens) {
  if (!c.turns.empty()) return c.turns;
  const int64_t L = static_cast<int64_t>(c.prompt_ids.size());
  if (k < 1) return absl::InvalidArgumentError(absl::StrCat("turns: ", k, " must be >= 1"));
  if (k == 1) return std::vector<int>{static_cast<int>(L)};
  int64_t q = 8;
  if (question_tokens.has_value()) {
    q = *question_tokens;
    if (q < 1) return absl::InvalidArgumentError(absl::StrCat("question_tokens: ", q, " must be >= 1"));
  } else if (!c.evidence_spans.empty()) {
    int64_t last_end = 0;
    for (const auto& s : c.evidence_spans) last_end = std::max(last_end, s.second);
    if (last_end < L) q = L - last_end;
  }
  const int64_t history = L - q;
  if (history < k - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "case ", c.id, " (line ", c.line, "): prompt_ids holds ", L, " tokens; with a question turn of ", q,
        " tokens the ", history, " tokens before it cannot make ", k - 1, " non-empty turns (turns = ", k, ")"));
  }
  std::vector<int> sizes;
  const int64_t parts = k - 1;
  for (int64_t i = 0; i < parts; ++i) {
    sizes.push_back(static_cast<int>(history / parts + (i < history % parts ? 1 : 0)));
  }
  sizes.push_back(static_cast<int>(q));
  return sizes;
}

}  // namespace echokv::eval
