// A Jinja2 template engine for chat templates, torch-free and without Python: it
// renders Hugging Face chat templates byte for byte as Jinja2 3.1 does in the
// environment transformers' apply_chat_template builds (sandboxed, trim_blocks and
// lstrip_blocks on, the loopcontrols extension, `tojson` = json.dumps with
// ensure_ascii=False / indent / separators / sort_keys, and the globals
// raise_exception(msg) and strftime_now(fmt) with an injectable clock).
//
//   ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<Template> t, Template::Create(source));
//   Value vars = Value::MakeDict({{"messages", messages}, {"add_generation_prompt", true}});
//   absl::StatusOr<std::string> text = t->Render(vars);
//   if (IsRaisedByTemplate(text.status())) ...   // raise_exception(msg): message == msg
//
// Coverage: if/elif/else, for (loop.*, else, `if` filter, break/continue), set (incl.
// namespace attributes and {% set %}...{% endset %}), macro / call / caller, filter
// blocks, with, whitespace control, raw, comments; literals, attribute / item / slice
// access, calls with *args / **kwargs, `in`, `is` tests, `~`, Python arithmetic,
// comparison and logic; the filters, tests, str / dict / list methods chat templates
// use (see builtins.cc for the list). Not supported (clear errors): include, import,
// extends, block, recursive loops, and values beyond 64-bit integers.
//
// Errors: a template that does not parse -> InvalidArgument "template line L column C:
// ..." from Create; a failure while rendering -> InvalidArgument naming the line and
// column of the innermost expression; raise_exception(msg) -> InvalidArgument whose
// message is exactly msg (IsRaisedByTemplate tells it apart).
#ifndef ECHOKV_JINJA_TEMPLATE_H_
#define ECHOKV_JINJA_TEMPLATE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "jinja/value.h"

namespace echokv::jinja {

namespace internal {
struct Stmt;
}  // namespace internal

// A naive local date and time, as Python's datetime.now() returns.
struct CivilTime {
  int year = 1970;
  int month = 1;  // 1..12
  int day = 1;    // 1..31
  int hour = 0;
  int minute = 0;
  int second = 0;
  int microsecond = 0;
};

// Parses "YYYY-MM-DDTHH:MM:SS" (a space instead of T, and ".ffffff" are accepted).
// InvalidArgument for anything else or an impossible date.
absl::StatusOr<CivilTime> ParseCivilTime(absl::string_view text);

struct RenderOptions {
  // strftime_now's "now". Unset: the system clock in local time.
  std::function<CivilTime()> now;
};

class Template {
 public:
  // `trim_blocks` / `lstrip_blocks` default to what transformers sets; a single
  // trailing newline of `source` is dropped as Jinja's keep_trailing_newline=False does.
  static absl::StatusOr<std::unique_ptr<Template>> Create(absl::string_view source,
                                                          bool trim_blocks = true,
                                                          bool lstrip_blocks = true);
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // Renders with `variables` (a dict of template globals; names not in it are
  // undefined). Thread-safe: a Template is immutable after Create.
  absl::StatusOr<std::string> Render(const Value& variables, const RenderOptions& options = {}) const;

 private:
  Template() = default;
  std::string source_;  // newline-normalised source (for error positions)
  std::unique_ptr<std::vector<std::unique_ptr<internal::Stmt>>> body_;  // the parsed template
};

// True when `status` is the template's own raise_exception(msg).
bool IsRaisedByTemplate(const absl::Status& status);

}  // namespace echokv::jinja

#endif  // ECHOKV_JINJA_TEMPLATE_H_
