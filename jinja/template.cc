#include "jinja/template.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "jinja/ast.h"
#include "jinja/interpreter.h"
#include "jinja/object.h"
#include "jinja/unicode.h"

namespace echokv::jinja {
namespace {

constexpr char kRaisedPayload[] = "type.echokv.dev/jinja.raise_exception";

// Jinja's lexer: every \r\n, \r and \n becomes \n, and one trailing newline is
// dropped (keep_trailing_newline=False).
std::string NormalizeSource(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string Position(const std::string& source, size_t offset) {
  if (offset == internal::TemplateError::kUnknown || offset > source.size()) return "template";
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  const size_t column = internal::CodePointCount(absl::string_view(source).substr(line_start, offset - line_start)) + 1;
  return absl::StrCat("template line ", line, " column ", column);
}

absl::Status ToStatus(const internal::TemplateError& e, const std::string& source) {
  if (e.raised) {
    absl::Status s = absl::InvalidArgumentError(e.message);
    s.SetPayload(kRaisedPayload, absl::Cord(Position(source, e.offset)));
    return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(Position(source, e.offset), ": ", e.message));
}

bool Digits(absl::string_view s, size_t pos, size_t n, int* out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

}  // namespace

absl::StatusOr<CivilTime> ParseCivilTime(absl::string_view text) {
  CivilTime t;
  const auto bad = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat("bad date-time '", text, "' (expected YYYY-MM-DDTHH:MM:SS)"));
  };
  if (text.size() < 19 || text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != ' ') ||
      text[13] != ':' || text[16] != ':') {
    return bad();
  }
  if (!Digits(text, 0, 4, &t.year) || !Digits(text, 5, 2, &t.month) || !Digits(text, 8, 2, &t.day) ||
      !Digits(text, 11, 2, &t.hour) || !Digits(text, 14, 2, &t.minute) || !Digits(text, 17, 2, &t.second)) {
    return bad();
  }
  if (text.size() > 19) {
    if (text[19] != '.' || text.size() == 20 || text.size() > 26) return bad();
    int frac = 0;
    if (!Digits(text, 20, text.size() - 20, &frac)) return bad();
    for (size_t k = text.size() - 20; k < 6; ++k) frac *= 10;
    t.microsecond = frac;
  }
  static const int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (t.year % 4 == 0 && t.year % 100 != 0) || t.year % 400 == 0;
  if (t.year < 1 || t.month < 1 || t.month > 12 || t.day < 1 || t.day > kDays[t.month - 1] ||
      (t.month == 2 && t.day == 29 && !leap) || t.hour > 23 || t.minute > 59 || t.second > 59) {
    return absl::InvalidArgumentError(absl::StrCat("impossible date-time '", text, "'"));
  }
  return t;
}

Template::~Template() = default;

absl::StatusOr<std::unique_ptr<Template>> Template::Create(absl::string_view source, bool trim_blocks,
                                                           bool lstrip_blocks) {
  size_t bad = 0;
  if (!internal::IsValidUtf8(source, &bad)) {
    return absl::InvalidArgumentError(absl::StrCat("template: invalid UTF-8 at byte ", bad));
  }
  std::unique_ptr<Template> t(new Template());
  t->source_ = NormalizeSource(source);
  try {
    std::vector<internal::Token> tokens = internal::Tokenize(t->source_, trim_blocks, lstrip_blocks);
    t->body_ = std::make_unique<internal::Body>(internal::Parse(std::move(tokens)));
  } catch (const internal::TemplateError& e) {
    return ToStatus(e, t->source_);
  }
  return t;
}

absl::StatusOr<std::string> Template::Render(const Value& variables, const RenderOptions& options) const {
  if (variables.kind() != Value::Kind::kDict) {
    return absl::InvalidArgumentError("template variables must be a dict");
  }
  auto globals = std::make_shared<internal::Scope>(nullptr);
  internal::Interpreter::AddGlobals(globals.get());
  auto scope = std::make_shared<internal::Scope>(globals);
  for (const auto& kv : variables.dict_value().items()) {
    if (!kv.first.is_string()) return absl::InvalidArgumentError("template variable names must be strings");
    scope->Set(kv.first.string_value(), kv.second);
  }
  std::string out;
  try {
    internal::Interpreter interp(options);
    interp.Render(*body_, scope, &out);
  } catch (const internal::TemplateError& e) {
    scope->Clear();
    return ToStatus(e, source_);
  }
  scope->Clear();
  return out;
}

bool IsRaisedByTemplate(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kRaisedPayload).has_value();
}

}  // namespace echokv::jinja
