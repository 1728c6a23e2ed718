#include "tests/jinja/jinja_testing.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "jinja/template.h"
#include "jinja/value.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_data.h"

namespace echokv::jinja::testing {

using ordered_json = nlohmann::ordered_json;

std::vector<RefResult> RunJinja2(const std::vector<RefCase>& cases) {
  ordered_json request;
  request["cases"] = ordered_json::array();
  for (const RefCase& c : cases) {
    request["cases"].push_back({{"template", c.source}, {"vars", c.vars}, {"now", c.now}});
  }
  const std::string dir = ::echokv::testing::MakeTempDir("echokv_jinja2_");
  const std::string in = dir + "/request.json";
  ::echokv::testing::WriteFileOrDie(in, request.dump());
  const ::echokv::testing::CommandResult r = ::echokv::testing::RunCommand(
      std::string("/usr/bin/python3 ") + ECHOKV_JINJA2_REFERENCE + " < " + in);
  if (r.exit_code != 0) {
    ADD_FAILURE() << "the Jinja2 reference did not run (needs /usr/bin/python3 and Debian's "
                     "python3-jinja2, installed by scripts/setup.sh): exit "
                  << r.exit_code << "\n" << r.err;
    return {};
  }
  const ordered_json reply = ordered_json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.contains("results") || reply["results"].size() != cases.size()) {
    ADD_FAILURE() << "the Jinja2 reference returned an unreadable reply: " << r.out.substr(0, 500);
    return {};
  }
  std::vector<RefResult> out;
  for (const ordered_json& j : reply["results"]) {
    RefResult res;
    res.ok = j.at("ok").get<bool>();
    res.raised = !res.ok && j.at("raised").get<bool>();
    res.text = j.at(res.ok ? "out" : "error").get<std::string>();
    out.push_back(std::move(res));
  }
  return out;
}

int ExpectMatchesJinja2(const std::vector<RefCase>& cases, const std::vector<RefResult>& want,
                        int max_reports) {
  if (want.size() != cases.size()) return static_cast<int>(cases.size());
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const RefCase& c = cases[i];
    absl::StatusOr<CivilTime> now = ParseCivilTime(c.now);
    RenderOptions options;
    options.now = [t = *now]() { return t; };
    std::string got;
    bool ok = false, raised = false;
    absl::StatusOr<std::unique_ptr<Template>> t = Template::Create(c.source);
    if (!t.ok()) {
      got = std::string(t.status().message());
    } else {
      absl::StatusOr<Value> vars = Value::FromOrderedJson(c.vars);
      if (!vars.ok()) {
        ADD_FAILURE() << c.name << ": bad vars: " << vars.status();
        ++mismatches;
        continue;
      }
      absl::StatusOr<std::string> out = (*t)->Render(*vars, options);
      ok = out.ok();
      raised = IsRaisedByTemplate(out.status());
      got = ok ? *out : std::string(out.status().message());
    }
    const RefResult& w = want[i];
    bool same;
    if (w.ok) {
      same = ok && got == w.text;
    } else if (w.raised) {
      same = raised && got == w.text;
    } else {
      same = !ok && !raised;
    }
    if (!same) {
      ++mismatches;
      // ECHOKV_JINJA_DUMP=file.jsonl collects the differing cases for a closer look.
      if (const char* dump = std::getenv("ECHOKV_JINJA_DUMP"); dump != nullptr && *dump != 0) {
        if (FILE* f = std::fopen(dump, "a")) {
          const std::string line =
              ordered_json({{"name", c.name}, {"template", c.source}, {"vars", c.vars}, {"now", c.now}}).dump() + "\n";
          std::fwrite(line.data(), 1, line.size(), f);
          std::fclose(f);
        }
      }
      if (mismatches <= max_reports) {
        ADD_FAILURE() << "case " << c.name << " differs from Jinja2\n--- template ---\n"
                      << c.source << "\n--- vars ---\n" << c.vars.dump() << "\n--- Jinja2 ("
                      << (w.ok ? "ok" : w.raised ? "raise_exception" : "error") << ") ---\n"
                      << w.text << "\n--- jinja/ (" << (ok ? "ok" : raised ? "raise_exception" : "error")
                      << ") ---\n" << got;
      }
    }
  }
  return mismatches;
}

namespace {

const std::vector<std::string>& Contents() {
  static const std::vector<std::string>* const kContents = new std::vector<std::string>{
      "Hello! Who are you?",
      "Name three prime numbers.",
      "2, 3 and 5.",
      "",
      " ",
      "  padded  ",
      "\n leading and trailing \n",
      "multi\nline\n\ncontent",
      "tabs\tand\r\nCRLF",
      "Unicode: héllo wörld — 中文 — 🙂 — Ελληνικά ΣΑΣ",
      "literal braces {x} {{ not a tag }} {% nor this %} {# nor this #}",
      "quotes ' and \" and \\ backslash",
      "special <|im_end|> </s> [INST] text",
      "What is the weather in Paris?",
      "{\"temperature\": 21.5, \"unit\": \"celsius\"}",
      "ß and ﬁ and İ",
  };
  return *kContents;
}

ordered_json RandomContent(Rng& rng) {
  if (rng.Chance(4)) return nullptr;
  return rng.Pick(Contents());
}

std::string ToolCallId(Rng& rng) {
  if (rng.Chance(15)) return rng.Chance(50) ? "call_1" : "";
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id;
  for (int i = 0; i < 9; ++i) id.push_back(kAlnum[rng.Below(sizeof(kAlnum) - 1)]);
  return id;
}

ordered_json ToolCall(Rng& rng, std::string* id) {
  ordered_json args = ordered_json::object();
  args["city"] = rng.Pick(std::vector<std::string>{"Paris", "東京", "São Paulo", ""});
  if (rng.Chance(50)) args["days"] = static_cast<int>(rng.Below(7));
  if (rng.Chance(30)) args["units"] = ordered_json::array({"c", 1.5, true, nullptr});
  ordered_json call;
  *id = ToolCallId(rng);
  if (rng.Chance(85)) call["id"] = *id;
  call["type"] = "function";
  ordered_json fn;
  fn["name"] = rng.Pick(std::vector<std::string>{"get_weather", "search", "calc"});
  fn["arguments"] = rng.Chance(75) ? args : ordered_json(args.dump());
  if (rng.Chance(10)) {
    call["name"] = fn["name"];
    call["arguments"] = fn["arguments"];
  } else {
    call["function"] = fn;
  }
  return call;
}

// one JSON-schema parameter
ordered_json RandomParam(Rng& rng, int depth) {
  ordered_json p = ordered_json::object();
  const int kind = static_cast<int>(rng.Below(depth > 1 ? 5 : 7));
  switch (kind) {
    case 0: p["type"] = "string"; break;
    case 1: p["type"] = "integer"; break;
    case 2: p["type"] = "number"; break;
    case 3: p["type"] = "boolean"; break;
    case 4: p["type"] = ordered_json::array({"string", "null"}); break;
    case 5:
      p["type"] = "array";
      p["items"] = RandomParam(rng, depth + 1);
      break;
    default:
      p["type"] = "object";
      p["properties"] = {{"inner", RandomParam(rng, depth + 1)}};
      if (rng.Chance(50)) p["additionalProperties"] = RandomParam(rng, depth + 1);
      break;
  }
  if (rng.Chance(80)) p["description"] = rng.Pick(std::vector<std::string>{"The city", "  padded  ", "Unicode ü 中", "A value"});
  if (kind == 0 && rng.Chance(30)) p["enum"] = ordered_json::array({"c", "f"});
  return p;
}

}  // namespace

ordered_json RandomMessages(Rng& rng) {
  ordered_json msgs = ordered_json::array();
  const int shape = static_cast<int>(rng.Below(10));
  const auto add = [&](const std::string& role, ordered_json content) {
    ordered_json m;
    m["role"] = role;
    m["content"] = std::move(content);
    msgs.push_back(std::move(m));
  };
  if (rng.Chance(45)) add("system", rng.Chance(90) ? ordered_json(rng.Pick(Contents())) : RandomContent(rng));
  if (shape <= 6) {
    // Alternating turns, sometimes with a tool round trip.
    const int turns = 1 + static_cast<int>(rng.Below(4));
    for (int t = 0; t < turns; ++t) {
      add("user", t == 0 || rng.Chance(95) ? ordered_json(rng.Pick(Contents())) : RandomContent(rng));
      const bool last = t + 1 == turns;
      if (last && rng.Chance(50)) break;
      if (rng.Chance(30)) {
        std::string id;
        ordered_json m;
        m["role"] = "assistant";
        m["content"] = rng.Chance(50) ? ordered_json(nullptr) : ordered_json(rng.Chance(50) ? "" : "Let me check.");
        m["tool_calls"] = ordered_json::array({ToolCall(rng, &id)});
        if (rng.Chance(10)) {
          std::string id2;
          m["tool_calls"].push_back(ToolCall(rng, &id2));
        }
        msgs.push_back(m);
        ordered_json r;
        r["role"] = "tool";
        r["content"] = rng.Chance(85) ? ordered_json(rng.Pick(std::vector<std::string>{
                                            "{\"temperature\": 21.5}", "22 degrees", "", "Ünïcödé 🙂"}))
                                      : ordered_json({{"content", "nested"}});
        if (rng.Chance(90)) r["tool_call_id"] = id;
        if (rng.Chance(30)) r["name"] = "get_weather";
        msgs.push_back(r);
        if (last && rng.Chance(50)) break;
      }
      add("assistant", rng.Chance(95) ? ordered_json(rng.Pick(Contents())) : RandomContent(rng));
    }
  } else {
    // Any roles in any order (alternation and role checks of the templates).
    const int n = static_cast<int>(rng.Below(5));
    for (int i = 0; i < n; ++i) {
      add(rng.Pick(std::vector<std::string>{"user", "assistant", "system", "tool", "ipython", "developer"}),
          RandomContent(rng));
    }
  }
  return msgs;
}

ordered_json RandomTools(Rng& rng) {
  ordered_json tools = ordered_json::array();
  const int n = 1 + static_cast<int>(rng.Below(3));
  for (int i = 0; i < n; ++i) {
    ordered_json fn;
    fn["name"] = rng.Pick(std::vector<std::string>{"get_weather", "search_web", "run_python", "calc"});
    if (rng.Chance(85)) fn["description"] = rng.Pick(std::vector<std::string>{"Current weather in a city", "Search the web.", "Ünïcödé description", " padded "});
    ordered_json params;
    params["type"] = "object";
    params["properties"] = ordered_json::object();
    const int np = static_cast<int>(rng.Below(4));
    for (int k = 0; k < np; ++k) params["properties"][rng.Pick(std::vector<std::string>{"city", "query", "n", "options", "flag"})] = RandomParam(rng, 0);
    if (rng.Chance(60) && np > 0) params["required"] = ordered_json::array({params["properties"].begin().key()});
    fn["parameters"] = params;
    if (rng.Chance(15)) fn["return"] = {{"type", "string"}, {"description", "The answer"}};
    tools.push_back(rng.Chance(90) ? ordered_json({{"type", "function"}, {"function", fn}}) : fn);
  }
  return tools;
}

namespace {

// The random template grammar.
class TemplateGen {
 public:
  explicit TemplateGen(Rng& rng) : rng_(rng) {}

  std::string Template() {
    std::string out;
    if (rng_.Chance(40)) out += "{%- set ns = namespace(count=0, text='') %}\n";
    has_ns_ = out.find("namespace") != std::string::npos;
    if (rng_.Chance(30)) {
      in_macro_ = 1;
      out += Open() + " macro mac(a, b='dflt') " + Close() + Block(2) + Open() + " endmacro " + Close() + Ws();
      in_macro_ = 0;
      has_macro_ = true;
    }
    if (rng_.Chance(15)) {
      // call blocks, caller() with arguments, varargs / kwargs
      out += "{% macro wrap(p) %}[{{ caller(p ~ '!') }}|{{ varargs|length }}|{{ kwargs|dictsort }}]{% endmacro %}";
      out += Ws() + "{% call(x) wrap(" + Str(1) + (rng_.Chance(50) ? ", 1, 2" : "") + (rng_.Chance(50) ? ", k=3" : "") +
             ") %}<" + (rng_.Chance(50) ? "{{ x }}" : "{{ x|upper }}") + ">{% endcall %}" + Ws();
    }
    if (rng_.Chance(15)) {
      out += "{% set p, q = " + Str(1) + ", " + Num(1) + " %}{{ p }}{{ q }}" + Ws();
    }
    if (rng_.Chance(15)) {
      out += "{% with w = " + Str(1) + " %}{{ w }}{% set inner = 1 %}{% endwith %}{{ w }}{{ inner }}" + Ws();
    }
    out += Block(3);
    return out;
  }

 private:
  std::string Ws() {
    static const std::vector<std::string> kWs = {"", "", "", "\n", "\n", "  ", "\n  ", " \n", "\n\n", "\t"};
    return rng_.Pick(kWs);
  }
  std::string Open() { return rng_.Pick(std::vector<std::string>{"{%", "{%", "{%", "{%-", "{%+"}); }
  std::string Close() { return rng_.Pick(std::vector<std::string>{"%}", "%}", "%}", "-%}", "+%}"}); }
  std::string VOpen() { return rng_.Pick(std::vector<std::string>{"{{", "{{", "{{-", "{{ "}); }
  std::string VClose() { return rng_.Pick(std::vector<std::string>{"}}", "}}", "-}}", " }}"}); }

  std::string Data() {
    static const std::vector<std::string> kData = {"x", "Hello", " ", "\n", "  text  ", "a\nb",
                                                   "<|im_start|>", "[INST]", "{ not tag }", "}}", "%}",
                                                   "#}", "é中🙂", "\t", "-", "+"};
    return rng_.Pick(kData);
  }

  std::string Block(int depth) {
    std::string out;
    const int n = 1 + static_cast<int>(rng_.Below(4));
    for (int i = 0; i < n; ++i) out += Ws() + Statement(depth) + Ws();
    return out;
  }

  std::string Statement(int depth) {
    const int k = static_cast<int>(rng_.Below(depth > 0 ? 14 : 5));
    switch (k) {
      case 0:
      case 1:
        return Data();
      case 2:
      case 3:
        return VOpen() + " " + Printable(2) + " " + VClose();
      case 4:
        return "{#" + rng_.Pick(std::vector<std::string>{" c ", "- c -", " multi\nline "}) + "#}";
      case 5:
      case 6: {
        std::string s = Open() + " if " + Bool(2) + " " + Close() + Block(depth - 1);
        if (rng_.Chance(40)) s += Open() + " elif " + Bool(2) + " " + Close() + Block(depth - 1);
        if (rng_.Chance(50)) s += Open() + " else " + Close() + Block(depth - 1);
        return s + Open() + " endif " + Close();
      }
      case 7:
      case 8:
        return For(depth);
      case 9: {
        const std::string name = rng_.Pick(std::vector<std::string>{"x", "y", "z"});
        std::string e = Str(2);
        defined_.push_back(name);
        return Open() + " set " + name + " = " + e + " " + Close();
      }
      case 10:
        if (has_ns_) {
          return rng_.Chance(50) ? Open() + " set ns.count = " + Num(2) + " " + Close()
                                 : Open() + " set ns.text = " + Str(2) + " " + Close();
        }
        return Data();
      case 11:
        if (in_loop_ > 0 && rng_.Chance(50)) {
          return Open() + " if " + Bool(1) + " " + Close() + Open() +
                 rng_.Pick(std::vector<std::string>{" break ", " continue "}) + Close() + Open() + " endif " + Close();
        }
        return Open() + " set y " + Close() + Block(depth - 1) + Open() + " endset " + Close();
      case 12:
        if (rng_.Chance(30)) {
          return Open() + " filter " + rng_.Pick(std::vector<std::string>{"upper", "trim", "title", "indent(2)"}) + " " +
                 Close() + Block(depth - 1) + Open() + " endfilter " + Close();
        }
        if (rng_.Chance(50)) return "{% raw %}{{ raw }}{% endraw %}";
        if (rng_.Chance(60)) return Open() + " if " + Bool(1) + " " + Close() + VOpen() + " raise_exception('bad: ' ~ " + Str(1) + ") " + VClose() + Open() + " endif " + Close();
        return VOpen() + " raise_exception('bad: ' ~ " + Str(1) + ") " + VClose();
      default:
        if (has_macro_ && in_macro_ == 0) return VOpen() + " mac(" + Expr(1, Type::kAny) + (rng_.Chance(50) ? ", b=" + Str(1) : "") + ") " + VClose();
        return VOpen() + " " + Printable(1) + " " + VClose();
    }
  }

  std::string For(int depth) {
    std::string it = rng_.Chance(50) ? P({"messages", "messages", "messages[1:]", "messages|reverse",
                                           "messages|selectattr('role', 'equalto', 'user')", "tools", "[]"})
                                     : Iterable();
    std::string target = "m";
    if (rng_.Chance(15)) {
      it = P({"{'k': 1, 'j': 2}|items", "{'k': 1}.items()", "[[1, 2], [3, 4]]", "[[1, 2, 3]]", "messages[0]|dictsort"});
      target = "k, v";
    }
    std::string s = Open() + " for " + target + " in " + it;
    if (rng_.Chance(15)) s += std::string(" if ") + (target == "m" ? "m is defined and " : "") + Bool(1);
    s += " " + Close();
    ++in_loop_;
    loop_vars_.push_back(target);
    s += Block(depth - 1);
    loop_vars_.pop_back();
    --in_loop_;
    if (rng_.Chance(20)) s += Open() + " else " + Close() + Block(depth - 1);
    return s + Open() + " endfor " + Close();
  }

  // Expressions are generated by the type they should have, so that most templates
  // render; about one choice in twelve ignores the type on purpose (errors must match
  // too).
  enum class Type { kAny, kNum, kStr, kBool, kList, kDict };

  std::string Printable(int depth) { return Expr(depth, Type::kAny); }

  std::string P(const std::vector<std::string>& v) { return rng_.Pick(v); }
  bool InLoopOver(const char* target) const {
    for (const auto& v : loop_vars_) {
      if (v == target) return true;
    }
    return false;
  }

  std::string Expr(int depth, Type want) {
    if (want == Type::kAny) {
      want = rng_.Pick(std::vector<Type>{Type::kNum, Type::kStr, Type::kStr, Type::kBool, Type::kList, Type::kDict});
    }
    if (rng_.Chance(8)) want = rng_.Pick(std::vector<Type>{Type::kNum, Type::kStr, Type::kBool, Type::kList, Type::kDict});
    if (rng_.Chance(4)) return P({"undefined_name", "none", "tools", "flag", "n", "messages[7]"});
    switch (want) {
      case Type::kNum: return Num(depth);
      case Type::kStr: return Str(depth);
      case Type::kBool: return Bool(depth);
      case Type::kList: return List(depth);
      default: return DictExpr(depth);
    }
  }

  std::string Paren(const std::string& e) { return "(" + e + ")"; }

  std::string Num(int depth) {
    // (no literal near 1e16: ints beyond 64 bits are not modelled)
    std::vector<std::string> leaves = {"0", "1", "2", "3", "-1", "10", "0.5", "1.0", "2.25", "-1.5", "1e-05",
                                       "3.14159", "123456.5", "100.0", "n", "f", "messages|length", "s|length"};
    if (in_loop_ > 0) leaves.insert(leaves.end(), {"loop.index", "loop.index0", "loop.length", "loop.revindex"});
    if (has_ns_) leaves.push_back("ns.count");
    if (depth <= 0) return P(leaves);
    switch (rng_.Below(9)) {
      case 0:
        // (** only with small integer exponents: Python's complex results are not modelled)
        if (rng_.Chance(15)) return Paren(Num(depth - 1) + " ** " + P({"0", "1", "2", "3", "-1"}));
        return Paren(Num(depth - 1) + P({" + ", " - ", " * ", " // ", " % ", " / "}) + Num(depth - 1));
      case 1:
        return Paren("-" + Num(depth - 1));
      case 2:
        return Paren(Expr(depth - 1, Type::kAny)) + P({"|int", "|float", "|length", "|count"});
      case 3:
        return Paren(Num(depth - 1)) + P({"|round", "|round(1)", "|round(2, 'floor')", "|abs", "|int", "|float"});
      case 4:
        return Paren(List(depth - 1)) + P({"|sum", "|length", "|min", "|max"});
      case 5:
        return Paren(Str(depth - 1)) + P({".count('a')", ".find('l')", "|wordcount", "|length"});
      case 6:
        return Paren(Num(depth - 1) + " if " + Bool(depth - 1) + " else " + Num(depth - 1));
      default:
        return P(leaves);
    }
  }

  std::string StrLit() {
    return P({"'a'", "\"b c\"", "'é'", "'\\n'", "'{x}'", "' '", "''", "'Hello World'", "\"it's\"", "'user'",
              "'system'", "'assistant'", "'\\u00e9\\x41'", "'  pad  '", "'%s!'", "'{} and {}'", "'a\\tb'"});
  }

  std::string Str(int depth) {
    std::vector<std::string> leaves = {StrLit(), StrLit(), "s", "bos_token", "eos_token", "messages[0].role",
                                       "messages[-1]['content']"};
    if (InLoopOver("m")) leaves.insert(leaves.end(), {"m.role", "m.content", "m['role']"});
    if (InLoopOver("k, v")) leaves.push_back("k");
    if (in_macro_ > 0) leaves.insert(leaves.end(), {"a", "b"});
    if (has_ns_) leaves.push_back("ns.text");
    for (const auto& d : defined_) leaves.push_back(d);
    if (depth <= 0) return P(leaves);
    switch (rng_.Below(12)) {
      case 0:
        return Paren(Str(depth - 1) + " ~ " + Expr(depth - 1, Type::kAny));
      case 1:
        return Paren(Str(depth - 1) + " + " + Str(depth - 1));
      case 2:
        return Paren(Expr(depth - 1, Type::kAny)) +
               P({"|string", "|tojson", "|tojson(indent=2)", "|tojson(sort_keys=true)", "|tojson(ensure_ascii=true)",
                  "|tojson(separators=(',', ':'))", "|wordcount"});
      case 3:
        return Paren(Str(depth - 1)) +
               P({"|upper", "|lower", "|trim", "|title", "|capitalize", "|replace('a', 'b')", "|center(9)",
                  "|indent(2)", "|indent(2, true)", "|truncate(8, true)", "|default('d', true)", "|trim('x')",
                  "|reverse", "|first", "|last"});
      case 4:
        return Paren(Str(depth - 1)) +
               P({"[1:]", "[::-1]", "[:2]", "[0]", "[-1]", ".strip()", ".upper()", ".lower()", ".title()",
                  ".capitalize()", ".replace('a', 'b')", ".lstrip()", ".rstrip('!')", ".split(' ')[0]",
                  ".zfill(5)", ".center(7, '*')", ".swapcase()"});
      case 5:
        return Paren(List(depth - 1)) + P({"|join(', ')", "|join", "|map('string')|join('-')", "|string"});
      case 6:
        return P({"'{} x'.format(", "'{0}{0}'.format(", "'%s!'|format(", "'<%s>' % ("}) + Expr(depth - 1, Type::kAny) + ")";
      case 7:
        return Paren(Str(depth - 1) + " if " + Bool(depth - 1) + " else " + Str(depth - 1));
      case 8:
        if (has_macro_ && in_macro_ == 0) return "mac(" + Expr(depth - 1, Type::kAny) + (rng_.Chance(50) ? ", b=" + Str(depth - 1) : "") + ")";
        return P(leaves);
      case 9:
        return "strftime_now(" + P({"'%d %b %Y'", "'%Y-%m-%d %H:%M'", "'%A %j'"}) + ")";
      default:
        return P(leaves);
    }
  }

  std::string Test() {
    return P({"defined", "undefined", "none", "string", "number", "mapping", "iterable", "sequence", "integer",
              "float", "boolean", "odd", "even", "divisibleby(2)", "divisibleby 3", "lower", "upper", "true", "false",
              "callable", "equalto('user')", "eq 1", "ne 'x'", "in ['user', 'system']", "gt 1", "sameas none"});
  }

  std::string Bool(int depth) {
    std::vector<std::string> leaves = {"true", "false", "add_generation_prompt", "flag", "tools is defined"};
    if (in_loop_ > 0) leaves.insert(leaves.end(), {"loop.first", "loop.last"});
    if (depth <= 0) return P(leaves);
    switch (rng_.Below(9)) {
      case 0:
        return Paren(Num(depth - 1) + P({" < ", " <= ", " > ", " >= ", " == ", " != "}) + Num(depth - 1));
      case 1:
        return Paren(Str(depth - 1) + P({" == ", " != ", " in ", " not in ", " < "}) + Str(depth - 1));
      case 2:
        return Paren(Expr(depth - 1, Type::kAny) + P({" in ", " not in "}) + List(depth - 1));
      case 3:
        return Paren(Expr(depth - 1, Type::kAny) + " is " + (rng_.Chance(25) ? "not " : "") + Test());
      case 4:
        return Paren("not " + Expr(depth - 1, Type::kAny));
      case 5:
        return Paren(Bool(depth - 1) + P({" and ", " or "}) + Expr(depth - 1, Type::kAny));
      case 6:
        return Paren(Str(depth - 1)) + P({".startswith('a')", ".endswith('!')", ".isdigit()", ".islower()", ".isupper()"});
      case 7:
        return Paren(Expr(depth - 1, Type::kAny) + " == " + Expr(depth - 1, Type::kAny));
      default:
        return P(leaves);
    }
  }

  std::string List(int depth) {
    std::vector<std::string> leaves = {"messages", "messages", "[1, 2]", "[]", "['a', 'b']", "[1, [2, 3]]", "(1, 'x')",
                                       "[3, 1, 2]", "['b', 'A', 'a']", "[none, 0, 'x']", "tools"};
    if (depth <= 0) return P(leaves);
    switch (rng_.Below(10)) {
      case 0:
        return "[" + Expr(depth - 1, Type::kAny) + ", " + Expr(depth - 1, Type::kAny) + "]";
      case 1:
        return Paren(List(depth - 1)) +
               P({"|selectattr('role', 'equalto', 'user')|list", "|rejectattr('content')|list",
                  "|map(attribute='role')|list", "|map('string')|list", "|select|list", "|reject('none')|list",
                  "|reverse|list", "|unique|list", "|batch(2)|list", "|slice(2)|list", "|list", "[1:]", "[::-1]",
                  "[:1]", "|sort|list", "|sort(reverse=true)", "|sort(attribute='role')"});
      case 2:
        return Paren(Str(depth - 1)) + P({".split()", ".split(' ')", ".splitlines()", "|list", ".partition(' ')"});
      case 3:
        return Paren(List(depth - 1) + " + " + List(depth - 1));
      case 4:
        return Paren(DictExpr(depth - 1)) + P({".items()|list", ".keys()|list", ".values()|list", "|items|list", "|dictsort", "|list"});
      case 5:
        return "range(" + P({"3", "0", "1, 4", "5, 0, -2", "n"}) + ")|list";
      case 6:
        return Paren(List(depth - 1) + " if " + Bool(depth - 1) + " else " + List(depth - 1));
      default:
        return P(leaves);
    }
  }

  std::string DictExpr(int depth) {
    std::vector<std::string> leaves = {"messages[0]", "{'k': 'v'}", "{}", "{'role': 'user', 'content': 'hi'}",
                                       "{'n': {'m': 1}}", "messages[-1]", "tools[0]", "{1: 'one', 2.5: none}"};
    if (InLoopOver("m")) leaves.insert(leaves.end(), {"m", "m", "m.tool_calls[0]"});
    if (depth <= 0) return P(leaves);
    switch (rng_.Below(5)) {
      case 0:
        return "{" + P({"'a'", "'role'", "1", "none"}) + ": " + Expr(depth - 1, Type::kAny) + ", " + StrLit() + ": " +
               Expr(depth - 1, Type::kAny) + "}";
      case 1:
        return "dict(x=" + Expr(depth - 1, Type::kAny) + ")";
      case 2:
        return Paren(DictExpr(depth - 1)) + P({".get('role')", ".get('x', 'dflt')", "['content']", ".content"});
      default:
        return P(leaves);
    }
  }

  std::string Iterable() {
    if (rng_.Chance(70)) return List(2);
    return rng_.Chance(50) ? Str(1) : DictExpr(1);
  }

  Rng& rng_;
  bool has_ns_ = false;
  bool has_macro_ = false;
  int in_loop_ = 0;  // loops around the point being generated
  int in_macro_ = 0;                    // generating the macro body
  std::vector<std::string> defined_;    // names set so far
  std::vector<std::string> loop_vars_;  // targets of the enclosing loops
};

}  // namespace

std::string RandomTemplate(Rng& rng) {
  TemplateGen gen(rng);
  std::string t = gen.Template();
  // loop.index0 outside a loop is undefined; that is part of the test.
  return t;
}

ordered_json RandomVars(Rng& rng) {
  ordered_json v = ordered_json::object();
  v["messages"] = RandomMessages(rng);
  if (rng.Chance(40)) v["tools"] = RandomTools(rng);
  v["add_generation_prompt"] = rng.Chance(50);
  v["bos_token"] = rng.Pick(std::vector<std::string>{"<s>", "<|begin_of_text|>", ""});
  v["eos_token"] = rng.Pick(std::vector<std::string>{"</s>", "<|im_end|>", "<|eot_id|>"});
  v["n"] = static_cast<int>(rng.Below(5)) - 1;
  v["f"] = rng.Pick(std::vector<double>{0.5, 2.0, -1.25, 1e-07, 123456789.125});
  v["s"] = rng.Pick(Contents());
  if (rng.Chance(70)) v["flag"] = rng.Chance(50);
  return v;
}

}  // namespace echokv::jinja::testing
