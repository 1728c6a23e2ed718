// Unit tests of the Jinja engine with hand-checked expectations: Python value
// formatting and json.dumps (the cases the differential tests cannot isolate),
// error positions, raise_exception, the injected clock, whitespace rules, limits and
// concurrent rendering. Behaviour against Jinja2 itself is in differential_test.cc.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jinja/chat.h"
#include "jinja/template.h"
#include "jinja/value.h"
#include "tests/testing/status_matchers.h"

namespace echokv::jinja {
namespace {

using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;

// Renders `source` with `vars` (JSON text); "ERROR: <message>" on failure.
std::string R(const std::string& source, const std::string& vars = "{}", RenderOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Create(source);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  absl::StatusOr<Value> v = Value::FromJsonText(vars);
  if (!v.ok()) return "BAD VARS";
  absl::StatusOr<std::string> out = (*t)->Render(*v, options);
  return out.ok() ? *out : "ERROR: " + std::string(out.status().message());
}

TEST(Value, FloatReprIsPythons) {
  EXPECT_EQ(FloatRepr(1.0), "1.0");
  EXPECT_EQ(FloatRepr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FloatRepr(1e16), "1e+16");
  EXPECT_EQ(FloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(FloatRepr(0.0001), "0.0001");
  EXPECT_EQ(FloatRepr(0.00001), "1e-05");
  EXPECT_EQ(FloatRepr(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(FloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(FloatRepr(-0.0), "-0.0");
  EXPECT_EQ(FloatRepr(1.0 / 0.0), "inf");
}

TEST(Value, StrAndReprArePythons) {
  absl::StatusOr<Value> v = Value::FromJsonText(R"([1, "a'b", "x\"y", "q'\"", null, true, 1.5, {"k": [], "é": "\n\u0001\u00a0"}])");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->Str(), R"([1, "a'b", 'x"y', 'q\'"', None, True, 1.5, {'k': [], 'é': '\n\x01\xa0'}])");
  EXPECT_EQ(Value::MakeTuple({Value(1)}).Repr(), "(1,)");
  EXPECT_EQ(Value::Undefined("x").Str(), "");
  EXPECT_EQ(Value::None().Str(), "None");
}

TEST(Value, JsonKeepsKeyOrderAndRejectsBadInput) {
  absl::StatusOr<Value> v = Value::FromJsonText(R"({"z": 1, "a": {"y": 2, "b": 3}})");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->Str(), "{'z': 1, 'a': {'y': 2, 'b': 3}}");
  EXPECT_THAT(Value::FromJsonText("{nope"), StatusIs(absl::StatusCode::kInvalidArgument, "invalid JSON"));
  EXPECT_THAT(Value::FromJsonText("18446744073709551615"),
              StatusIs(absl::StatusCode::kInvalidArgument, "beyond 64 bits"));
}

TEST(Value, ToJsonFollowsJsonDumps) {
  absl::StatusOr<Value> v = Value::FromJsonText(R"({"b": [1, 2.0, "é\t\"", null, {}], "a": []})");
  ASSERT_TRUE(v.ok());
  JsonOptions o;
  EXPECT_EQ(*ToJson(*v, o), R"({"b": [1, 2.0, "é\t\"", null, {}], "a": []})");
  o.indent = "  ";
  EXPECT_EQ(*ToJson(*v, o), "{\n  \"b\": [\n    1,\n    2.0,\n    \"é\\t\\\"\",\n    null,\n    {}\n  ],\n  \"a\": []\n}");
  o = JsonOptions{};
  o.sort_keys = true;
  o.ensure_ascii = true;
  o.separators = std::make_pair(std::string(","), std::string(":"));
  EXPECT_EQ(*ToJson(*v, o), R"({"a":[],"b":[1,2.0,"\u00e9\t\"",null,{}]})");
  EXPECT_EQ(*ToJson(Value("🙂"), o), R"("\ud83d\ude42")");
  EXPECT_THAT(ToJson(Value(), JsonOptions{}), StatusIs(absl::StatusCode::kInvalidArgument, "not JSON serializable"));
}

TEST(Template, TrimAndLstripBlocksAsTransformersSetsThem) {
  EXPECT_EQ(R("  {% if true %}\n  x\n  {% endif %}\nend\n"), "  x\nend");
  EXPECT_EQ(R("a\n{{ 'b' }}\nc"), "a\nb\nc");  // no trimming after }}
  EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(R("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(R("x\r\ny\rz"), "x\ny\nz");
  EXPECT_EQ(R("{# c #}\n{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Template, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(R("line one\n  {{ foo( }}"), "ERROR: template line 2 column 11: unexpected '}', expected ')'");
  EXPECT_THAT(R("{% if x %}\nno end"), HasSubstr("Jinja was looking for the following tags: 'elif' or 'else' or 'endif'"));
  EXPECT_THAT(R("{% include 'x' %}"), HasSubstr("'include' tag is not supported"));
  EXPECT_THAT(R("{% for x in y recursive %}{% endfor %}"), HasSubstr("recursive for loops are not supported"));
  EXPECT_THAT(R("{% break %}"), HasSubstr("'break' outside loop"));
  EXPECT_THAT(R("{{ 'unterminated }}"), HasSubstr("unexpected char"));
}

TEST(Template, RuntimeErrorsNameTheInnermostExpression) {
  EXPECT_EQ(R("ok\n  {{ 1 + x.y }}"), "ERROR: template line 2 column 10: 'x' is undefined");
  EXPECT_EQ(R("{{ 'a' + 1 }}"), "ERROR: template line 1 column 4: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(R("{% for m in 5 %}{% endfor %}"), "ERROR: template line 1 column 13: 'int' object is not iterable");
  EXPECT_EQ(R("{{ [1]|nosuch }}"), "ERROR: template line 1 column 8: No filter named 'nosuch'.");
}

TEST(Template, RaiseExceptionIsItsOwnError) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Create("x{{ raise_exception('Roles must alternate ' ~ n) }}");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = (*t)->Render(Value::MakeDict({{"n", Value(3)}}));
  EXPECT_THAT(out, StatusIs(absl::StatusCode::kInvalidArgument, "Roles must alternate 3"));
  EXPECT_EQ(out.status().message(), "Roles must alternate 3");
  EXPECT_TRUE(IsRaisedByTemplate(out.status()));
  EXPECT_FALSE(IsRaisedByTemplate(Template::Create("{{ 1 + 'a' }}").value()->Render(Value::MakeDict(Dict())).status()));
}

TEST(Template, StrftimeNowUsesTheInjectedClock) {
  RenderOptions o;
  o.now = []() { return CivilTime{2026, 12, 1, 9, 30, 5, 42}; };
  EXPECT_EQ(R("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%dT%H:%M:%S.%f%z%Z %A %j %I%p') }}", "{}", o),
            "01 Dec 2026|2026-12-01T09:30:05.000042 Tuesday 335 09AM");
  absl::StatusOr<CivilTime> t = ParseCivilTime("2024-02-29T23:59:59");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->day, 29);
  EXPECT_FALSE(ParseCivilTime("2023-02-29T00:00:00").ok());
  EXPECT_FALSE(ParseCivilTime("2026-12-01").ok());
}

TEST(Template, ScopingFollowsJinja) {
  // A for body gets a fresh scope per iteration; namespaces carry state out.
  EXPECT_EQ(R("{% set y = 0 %}{% for x in [1,2] %}{{ y }}{% set y = x %}{{ y }}{% endfor %}{{ y }}"), "01020");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"), "6");
  // Macros see their defining scope live.
  EXPECT_EQ(R("{% macro m() %}{{ z }}{% endmacro %}{% set z = 1 %}{{ m() }}{% set z = 2 %}{{ m() }}"), "12");
}

TEST(Template, GeneratorsAreOneShot) {
  EXPECT_EQ(R("{% set g = [1,2,3]|select('odd') %}{{ g|list }}{{ g|list }}"), "[1, 3][]");
  EXPECT_THAT(R("{{ [1]|select|length }}"), HasSubstr("has no len()"));
}

TEST(Template, LimitsAreErrorsNotCrashes) {
  EXPECT_THAT(R("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), HasSubstr("maximum recursion depth"));
  EXPECT_THAT(R("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"), HasSubstr("nested too deeply"));
  std::string long_sum = "{{ 1";
  for (int i = 0; i < 2000; ++i) long_sum += " + 1";
  EXPECT_THAT(R(long_sum + " }}"), HasSubstr("tag too long"));
  EXPECT_THAT(R("{{ range(200000)|length }}"), HasSubstr("Range too big"));
  EXPECT_THAT(R("{{ 2 ** 70 }}"), HasSubstr("beyond 64 bits"));
  // Huge exponents and repeats answer at once (they looped once per unit before).
  EXPECT_EQ(R("{{ 1 ** 9000000000000 }} {{ (-1) ** 9000000000001 }} {{ 0 ** 9000000000000 }} {{ 0 ** 0 }}"),
            "1 -1 0 1");
  EXPECT_EQ(R("[{{ '' * 9000000000000 }}][{{ ([] * 9000000000000)|length }}][{{ 'ab' * -3 }}]"), "[][0][]");
  EXPECT_THAT(R("{{ 'ab' * 9000000000000 }}"), HasSubstr("exceeds the template limit"));
  EXPECT_THAT(R("{{ [1, 2] * 9000000000 }}"), HasSubstr("exceeds the template limit"));
  EXPECT_EQ(R("{{ 'ab' * 3 }}{{ ([0] * 4)|length }}"), "ababab4");
  EXPECT_THAT(Template::Create("\xff").status(), StatusIs(absl::StatusCode::kInvalidArgument, "invalid UTF-8"));
}

TEST(Template, RendersConcurrently) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Create(
      "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content|upper %}{% endfor %}{{ ns.s }}");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<Value> vars = Value::FromJsonText(R"({"messages": [{"content": "a"}, {"content": "é"}]})");
  ASSERT_TRUE(vars.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> outs(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i]() {
      for (int k = 0; k < 200; ++k) outs[i] = (*t)->Render(*vars).value_or("ERROR");
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& o : outs) EXPECT_EQ(o, "AÉ");
}

TEST(Chat, InputIsValidatedByField) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Create("{{ messages|length }}{{ tools is defined }}");
  ASSERT_TRUE(t.ok());
  ChatInput in;
  in.messages = Value::FromJsonText(R"([{"role": "user", "content": null}])").value();
  EXPECT_EQ(RenderChat(**t, in).value(), "1False");
  in.tools = Value::None();
  EXPECT_EQ(RenderChat(**t, in).value(), "1False");
  in.tools = Value::MakeList({});
  EXPECT_EQ(RenderChat(**t, in).value(), "1True");
  in.tools = Value("x");
  EXPECT_THAT(RenderChat(**t, in), StatusIs(absl::StatusCode::kInvalidArgument, "tools: expected a list"));
  in.tools.reset();
  in.messages = Value::FromJsonText(R"([{"role": "user"}, {"content": "x"}])").value();
  EXPECT_THAT(RenderChat(**t, in), StatusIs(absl::StatusCode::kInvalidArgument, "messages[1].role: missing"));
  in.messages = Value::FromJsonText(R"({"role": "user"})").value();
  EXPECT_THAT(RenderChat(**t, in), StatusIs(absl::StatusCode::kInvalidArgument, "messages: expected a list"));
}

}  // namespace
}  // namespace echokv::jinja
