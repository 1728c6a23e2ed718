// Test support for the Jinja engine: the independent oracle (Debian's python3-jinja2,
// run through tests/jinja/jinja2_reference.py in the environment transformers
// builds), a comparison that reports the first mismatches readably, and seeded
// generators of conversations and of random templates.
//
//   std::vector<RefCase> cases = {{"t1", "{{ messages|length }}", vars}};
//   std::vector<RefResult> want = RunJinja2(cases);          // one python3 process
//   ExpectMatchesJinja2(cases, want);                         // renders with jinja/
#ifndef ECHOKV_TESTS_JINJA_JINJA_TESTING_H_
#define ECHOKV_TESTS_JINJA_JINJA_TESTING_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace echokv::jinja::testing {

struct RefCase {
  std::string name;
  std::string source;            // the template
  nlohmann::ordered_json vars;   // template variables (an object)
  std::string now = "2026-12-01T09:30:00";
};

struct RefResult {
  bool ok = false;
  bool raised = false;  // raise_exception(msg)
  std::string text;     // the render, or the error message
};

// Renders every case with Jinja2 (/usr/bin/python3 + python3-jinja2). Fails the
// current test (and returns an empty vector) when the reference cannot run.
std::vector<RefResult> RunJinja2(const std::vector<RefCase>& cases);

// Renders every case with jinja::Template and expects, per case, the same string as
// Jinja2, or an error where Jinja2 failed (raise_exception with the same message
// where Jinja2's template raised). Prints the first `max_reports` mismatches.
// Returns the number of mismatches.
int ExpectMatchesJinja2(const std::vector<RefCase>& cases, const std::vector<RefResult>& want,
                        int max_reports = 10);

// Deterministic small random numbers (std::mt19937_64, modulo: the same on every
// platform and standard library).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : gen_() % n; }
  bool Chance(int percent) { return static_cast<int>(Below(100)) < percent; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Below(v.size())];
  }

 private:
  std::mt19937_64 gen_;  // the stream
};

// A random OpenAI-style conversation: system / user / assistant / tool messages in
// plausible or deliberately broken orders, contents with Unicode, literal braces,
// template syntax, whitespace edges, empty strings and nulls, assistant tool calls
// (arguments as objects or JSON strings, ids of 9 characters or not) and tool
// results.
nlohmann::ordered_json RandomMessages(Rng& rng);
// A random list of tool definitions (function schemas with nested / array /
// enum / optional parameters), sometimes without descriptions.
nlohmann::ordered_json RandomTools(Rng& rng);

// A random template from a grammar of Jinja statements and expressions (all of the
// syntax chat templates use, whitespace control included), syntactically valid by
// construction; rendering it may still fail, on both sides.
std::string RandomTemplate(Rng& rng);
// Variables for RandomTemplate: messages, tools (sometimes absent), special tokens,
// add_generation_prompt and a few scalars.
nlohmann::ordered_json RandomVars(Rng& rng);

}  // namespace echokv::jinja::testing

#endif  // ECHOKV_TESTS_JINJA_JINJA_TESTING_H_
