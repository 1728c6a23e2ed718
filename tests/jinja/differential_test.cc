// Differential tests against Jinja2 itself (Debian's python3-jinja2 in transformers'
// environment, tests/jinja/jinja2_reference.py): hand-written snippets covering each
// construct, filter, test and method (tests/jinja/differential_snippets.txt, cases
// separated by a line "===="), and a seeded fuzzer of random templates from a
// grammar rendered with random conversations. Each case must give the same string,
// or an error on both sides (the same message for raise_exception).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/jinja/jinja_testing.h"
#include "tests/testing/test_data.h"

namespace echokv::jinja::testing {
namespace {

using ordered_json = nlohmann::ordered_json;

TEST(Differential, SnippetsMatchJinja2) {
  const std::string text = ::echokv::testing::ReadFileOrDie(ECHOKV_JINJA_SNIPPETS);
  std::vector<RefCase> cases;
  ordered_json vars = ordered_json::parse(R"({
      "d": {"items": 1, "a": [1, 2]}, "s": "Hello World", "n": null, "xs": [3, 1, 2],
      "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null}]})");
  int i = 0;
  for (absl::string_view snippet : absl::StrSplit(text, "\n====\n")) {
    if (snippet.empty()) continue;
    // Printing a bound method shows a memory address in Python: not comparable.
    if (snippet.find("{{ d.items }}") != absl::string_view::npos) continue;
    cases.push_back({absl::StrCat("snippet#", i++), std::string(snippet), vars});
  }
  ASSERT_GE(cases.size(), 100u);
  std::vector<RefResult> want = RunJinja2(cases);
  ASSERT_EQ(want.size(), cases.size());
  // The snippets must exercise success and failure paths alike.
  int ok = 0;
  for (const RefResult& r : want) ok += r.ok ? 1 : 0;
  EXPECT_GT(ok, 80);
  EXPECT_EQ(ExpectMatchesJinja2(cases, want), 0);
}

TEST(Differential, FuzzedTemplatesMatchJinja2) {
  // Fixed in CI; ECHOKV_JINJA_FUZZ_SEED / ECHOKV_JINJA_FUZZ_TEMPLATES explore further.
  const char* seed_env = std::getenv("ECHOKV_JINJA_FUZZ_SEED");
  const char* count_env = std::getenv("ECHOKV_JINJA_FUZZ_TEMPLATES");
  const uint64_t kSeed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 20261201;
  const int kTemplates = count_env != nullptr ? std::atoi(count_env) : 1000;
  constexpr int kContextsPerTemplate = 2;
  Rng rng(kSeed);
  std::vector<RefCase> cases;
  for (int t = 0; t < kTemplates; ++t) {
    const std::string source = RandomTemplate(rng);
    for (int c = 0; c < kContextsPerTemplate; ++c) {
      cases.push_back({absl::StrCat("seed ", kSeed, " template ", t, " context ", c), source, RandomVars(rng)});
    }
  }
  std::vector<RefResult> want = RunJinja2(cases);
  ASSERT_EQ(want.size(), cases.size());
  int ok = 0, raised = 0;
  for (const RefResult& r : want) {
    ok += r.ok ? 1 : 0;
    raised += r.raised ? 1 : 0;
  }
  // A fuzzer whose templates all fail would test nothing: most must render.
  EXPECT_GT(ok, static_cast<int>(cases.size()) / 2);
  std::printf("fuzz: %zu cases, %d rendered by Jinja2, %d raise_exception, %zu other errors\n", cases.size(), ok,
              raised, cases.size() - ok - raised);
  std::map<std::string, int> kinds;
  for (const RefResult& r : want) {
    if (!r.ok && !r.raised) ++kinds[r.text.substr(0, std::min<size_t>(r.text.size(), 60))];
  }
  std::vector<std::pair<int, std::string>> top;
  for (const auto& [k, n] : kinds) top.emplace_back(n, k);
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < top.size() && i < 12; ++i) std::printf("  %5d  %s\n", top[i].first, top[i].second.c_str());
  // ECHOKV_JINJA_FUZZ_EXAMPLES=1 prints one template per error kind (to tune the grammar).
  if (const char* ex = std::getenv("ECHOKV_JINJA_FUZZ_EXAMPLES"); ex != nullptr && *ex == '1') {
    std::map<std::string, bool> shown;
    for (size_t i = 0; i < want.size(); ++i) {
      if (want[i].ok || want[i].raised) continue;
      const std::string k = want[i].text.substr(0, std::min<size_t>(want[i].text.size(), 60));
      if (shown[k]) continue;
      shown[k] = true;
      std::printf("=== %s\n%s\n", want[i].text.c_str(), cases[i].source.c_str());
    }
  }
  EXPECT_EQ(ExpectMatchesJinja2(cases, want), 0);
}

}  // namespace
}  // namespace echokv::jinja::testing
