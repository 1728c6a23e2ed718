// Jinja's builtin filters, tests and globals, transformers' additions, and the str /
// dict / list methods templates call, each following its Python implementation
// (jinja2/filters.py, jinja2/tests.py, CPython's str methods).
//
// Filters: abs attr batch capitalize center count d default dictsort e escape first
//   float forceescape format indent int items join last length list lower map max min
//   reject rejectattr replace reverse round safe select selectattr slice sort string
//   sum title tojson trim truncate unique upper urlencode wordcount
// Tests: boolean callable defined divisibleby eq equalto escaped even false filter
//   float ge gt greaterthan in integer iterable le lower lessthan lt mapping ne none
//   number odd sameas sequence string test true undefined upper == != < <= > >=
// Globals: range dict namespace joiner raise_exception strftime_now
// Methods: str (strip/lstrip/rstrip split rsplit splitlines startswith endswith
//   replace find rfind index rindex count join format upper lower title capitalize
//   swapcase casefold center ljust rjust zfill removeprefix removesuffix partition
//   rpartition is*), dict (get keys values items copy), list/tuple (index count).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "jinja/interpreter.h"
#include "jinja/unicode.h"

namespace echokv::jinja::internal {
namespace {

using FilterFn = std::function<Value(Interpreter&, const Value&, CallArgs&)>;
using TestFn = std::function<bool(Interpreter&, const Value&, CallArgs&)>;

[[noreturn]] void TypeError(std::string m) { Fail(std::move(m)); }

bool IsIntLike(const Value& v) { return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool; }
double AsDouble(const Value& v) {
  return v.kind() == Value::Kind::kFloat ? v.float_value() : static_cast<double>(v.int_value());
}

int64_t NeedInt(const Value& v, const char* what) {
  if (IsIntLike(v)) return v.int_value();
  if (v.is_undefined()) FailUndefined(v);
  TypeError(absl::StrCat("'", v.TypeName(), "' object cannot be interpreted as an integer (", what, ")"));
}

const std::string& NeedStr(const Value& v, const char* what) {
  if (v.is_string()) return v.string_value();
  if (v.is_undefined()) FailUndefined(v);
  TypeError(absl::StrCat(what, " must be str, not ", v.TypeName()));
}

Value Generator(std::vector<Value> items, const char* name) {
  return Value::FromObject(Value::Kind::kGenerator,
                           std::make_shared<GeneratorObject>(std::move(items), name));
}

Value Callable(std::string repr, CallableObject::Fn fn) {
  return Value::FromObject(Value::Kind::kCallable,
                           std::make_shared<CallableObject>(std::move(repr), "builtin_function_or_method",
                                                            std::move(fn)));
}

Value IgnoreCase(const Value& v) { return v.is_string() ? Value(PyLower(v.string_value())) : v; }

// make_attrgetter: "a.b.0" looked up part by part with env.getitem.
std::vector<Value> AttributeParts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  const std::string& s = attribute.string_value();
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    const std::string part = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty();
    for (char c : part) digits &= c >= '0' && c <= '9';
    if (digits && part.size() < 18) {
      parts.emplace_back(static_cast<int64_t>(std::stoll(part)));
    } else {
      parts.emplace_back(part);
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::function<Value(const Value&)> AttrGetter(Interpreter& interp, const Value& attribute,
                                              bool ignore_case, const Value& fallback = Value()) {
  std::vector<Value> parts = AttributeParts(attribute);
  return [&interp, parts, ignore_case, fallback](const Value& item) {
    Value v = item;
    for (const Value& p : parts) {
      v = interp.GetItem(v, p);
      if (!fallback.is_undefined() && !fallback.is_none() && v.is_undefined()) v = fallback;
    }
    return ignore_case ? IgnoreCase(v) : v;
  };
}

// Python's sorted(items, key=key, reverse=reverse): stable in both directions.
std::vector<Value> Sorted(Interpreter& interp, std::vector<Value> items,
                          const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& v : items) keyed.emplace_back(key(v), std::move(v));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? interp.Compare(y.first, x.first, "<") < 0 : interp.Compare(x.first, y.first, "<") < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value Identity(const Value& v) { return v; }

// select / reject / selectattr / rejectattr.
Value SelectOrReject(Interpreter& interp, const Value& value, CallArgs& args, bool select,
                     bool lookup_attr, const char* name) {
  if (!value.Truthy()) return Generator({}, name);
  std::function<Value(const Value&)> trans = Identity;
  size_t off = 0;
  if (lookup_attr) {
    if (args.args.empty()) Fail("Missing parameter for attribute name");
    trans = AttrGetter(interp, args.args[0], false);
    off = 1;
  }
  std::function<bool(const Value&)> test;
  if (args.args.size() > off) {
    const std::string test_name = NeedStr(args.args[off], "test name");
    CallArgs rest;
    rest.args.assign(args.args.begin() + static_cast<std::ptrdiff_t>(off) + 1, args.args.end());
    rest.kwargs = args.kwargs;
    test = [&interp, test_name, rest](const Value& v) {
      CallArgs a = rest;
      return interp.CallTest(test_name, v, a);
    };
  } else {
    test = [](const Value& v) { return v.Truthy(); };
  }
  std::vector<Value> out;
  for (Value& item : interp.Iterate(value)) {
    if (test(trans(item)) == select) out.push_back(std::move(item));
  }
  return Generator(std::move(out), name);
}

// Python's str.strip family.
bool InChars(char32_t c, const std::u32string* chars) {
  if (chars == nullptr) return IsPySpace(c);
  return chars->find(c) != std::u32string::npos;
}

// --- numbers from strings (Python int() / float()) ---

std::string StripAscii(const std::string& s) {
  const std::u32string cps = Decode(s);
  size_t b = 0, e = cps.size();
  while (b < e && IsPySpace(cps[b])) ++b;
  while (e > b && IsPySpace(cps[e - 1])) --e;
  return Encode(cps.substr(b, e - b));
}

// int(s, base); nullopt when Python raises ValueError.
std::optional<int64_t> ParsePyInt(const std::string& text, int base) {
  std::string s = StripAscii(text);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if ((base == 0 || base == 16 || base == 8 || base == 2) && i + 1 < s.size() && s[i] == '0') {
    const char k = static_cast<char>(s[i + 1] | 0x20);
    if ((k == 'x' && (base == 16 || base == 0)) || (k == 'o' && (base == 8 || base == 0)) ||
        (k == 'b' && (base == 2 || base == 0))) {
      base = k == 'x' ? 16 : k == 'o' ? 8 : 2;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) {
    base = 10;
    // Leading zeros are not allowed for base 0 (except all zeros).
    if (i + 1 < s.size() && s[i] == '0') {
      for (size_t k = i; k < s.size(); ++k) {
        if (s[k] != '0' && s[k] != '_') return std::nullopt;
      }
    }
  }
  if (i >= s.size()) return std::nullopt;
  __int128 v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (!prev_digit || i + 1 >= s.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (d >= base) return std::nullopt;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) Fail("integer beyond 64 bits (not supported)");
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  v = neg ? -v : v;
  if (v > INT64_MAX) Fail("integer beyond 64 bits (not supported)");
  return static_cast<int64_t>(v);
}

// float(s); nullopt when Python raises ValueError.
std::optional<double> ParsePyFloat(const std::string& text) {
  std::string s = StripAscii(text);
  std::string t;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) t.push_back(s[i++]);
  std::string rest = s.substr(i);
  std::string lower;
  for (char c : rest) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "inf" || lower == "infinity" || lower == "nan") {
    double v = lower == "nan" ? std::nan("") : HUGE_VAL;
    return t == "-" ? -v : v;
  }
  // digits [. digits] [e [+-] digits], with single underscores between digits.
  bool any_digit = false, prev_digit = false;
  size_t k = 0;
  const auto digits = [&]() {
    bool got = false;
    while (k < rest.size()) {
      if (rest[k] >= '0' && rest[k] <= '9') {
        t.push_back(rest[k++]);
        got = prev_digit = true;
      } else if (rest[k] == '_' && prev_digit && k + 1 < rest.size() && rest[k + 1] >= '0' &&
                 rest[k + 1] <= '9') {
        ++k;
        prev_digit = false;
      } else {
        break;
      }
    }
    return got;
  };
  any_digit |= digits();
  if (k < rest.size() && rest[k] == '.') {
    t.push_back('.');
    ++k;
    prev_digit = false;
    any_digit |= digits();
  }
  if (!any_digit) return std::nullopt;
  if (k < rest.size() && (rest[k] == 'e' || rest[k] == 'E')) {
    t.push_back('e');
    ++k;
    if (k < rest.size() && (rest[k] == '+' || rest[k] == '-')) t.push_back(rest[k++]);
    prev_digit = false;
    if (!digits()) return std::nullopt;
  }
  if (k != rest.size()) return std::nullopt;
  return std::strtod(t.c_str(), nullptr);
}

// --- Python format specs (format(value, spec)) for str.format and %-formatting ---

struct Spec {
  char32_t fill = ' ';
  char align = 0;  // < > ^ =
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int width = -1;
  bool grouping = false;
  int precision = -1;
  char type = 0;
};

Spec ParseSpec(const std::string& spec_text) {
  Spec s;
  const std::u32string spec = Decode(spec_text);
  size_t i = 0;
  const auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    s.fill = spec[0];
    s.align = static_cast<char>(spec[1]);
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    s.align = static_cast<char>(spec[0]);
    i = 1;
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) s.sign = static_cast<char>(spec[i++]);
  if (i < spec.size() && spec[i] == '#') s.alt = true, ++i;
  if (i < spec.size() && spec[i] == '0') s.zero = true, ++i;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
    s.width = (s.width < 0 ? 0 : s.width * 10) + static_cast<int>(spec[i++] - '0');
  }
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) s.grouping = true, ++i;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    s.precision = 0;
    bool any = false;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
      s.precision = s.precision * 10 + static_cast<int>(spec[i++] - '0');
      any = true;
    }
    if (!any) Fail("Format specifier missing precision");
  }
  if (i < spec.size()) s.type = static_cast<char>(spec[i++]);
  if (i != spec.size()) Fail("Invalid format specifier");
  return s;
}

std::string Pad(const std::string& body, const Spec& s, char default_align) {
  const size_t len = CodePointCount(body);
  if (s.width < 0 || static_cast<size_t>(s.width) <= len) return body;
  const size_t pad = static_cast<size_t>(s.width) - len;
  std::string fill;
  AppendUtf8(s.fill, &fill);
  const auto rep = [&](size_t n) {
    std::string out;
    for (size_t k = 0; k < n; ++k) out += fill;
    return out;
  };
  const char align = s.align ? s.align : default_align;
  if (align == '<') return body + rep(pad);
  if (align == '>') return rep(pad) + body;
  if (align == '^') return rep(pad / 2) + body + rep(pad - pad / 2);
  // '=': after the sign
  size_t sign_len = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
  return body.substr(0, sign_len) + rep(pad) + body.substr(sign_len);
}

std::string Group(const std::string& digits) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[i]);
    if ((n - i - 1) % 3 == 0 && i + 1 < n) out.push_back(',');
  }
  return out;
}

std::string FormatValue(const Value& v, const std::string& spec_text) {
  if (spec_text.empty()) return v.Str();
  Spec s = ParseSpec(spec_text);
  if (s.zero && !s.align) {
    s.fill = '0';
    s.align = '=';
  }
  if (v.is_string() || (!v.is_number() && s.type == 0)) {
    if (!v.is_string()) {
      TypeError(absl::StrCat("unsupported format string passed to ", v.TypeName(), ".__format__"));
    }
    if (s.type != 0 && s.type != 's') {
      Fail(absl::StrCat("Unknown format code '", std::string(1, s.type), "' for object of type 'str'"));
    }
    std::string body = v.string_value();
    if (s.precision >= 0) body = Encode(Decode(body).substr(0, static_cast<size_t>(s.precision)));
    return Pad(body, s, '<');
  }
  const bool is_int = IsIntLike(v);
  char type = s.type;
  if (type == 0) type = is_int ? 'd' : 'r';
  std::string body;
  double d = AsDouble(v);
  const bool neg = is_int ? v.int_value() < 0 : std::signbit(d);
  if (type == 'd' || type == 'n' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c') {
    if (!is_int) {
      Fail(absl::StrCat("Unknown format code '", std::string(1, type), "' for object of type 'float'"));
    }
    const uint64_t mag = neg ? static_cast<uint64_t>(-(v.int_value() + 1)) + 1 : static_cast<uint64_t>(v.int_value());
    if (type == 'c') {
      AppendUtf8(static_cast<char32_t>(mag), &body);
      return Pad(body, s, '<');
    }
    if (type == 'd' || type == 'n') {
      body = std::to_string(mag);
      if (s.grouping) body = Group(body);
    } else {
      const int base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
      uint64_t m = mag;
      do {
        const int dgt = static_cast<int>(m % static_cast<uint64_t>(base));
        body.insert(body.begin(), static_cast<char>(dgt < 10 ? '0' + dgt : (type == 'X' ? 'A' : 'a') + dgt - 10));
        m /= static_cast<uint64_t>(base);
      } while (m != 0);
      if (s.alt) body = std::string("0") + (type == 'o' ? "o" : type == 'b' ? "b" : type == 'X' ? "X" : "x") + body;
    }
  } else {
    const double mag = std::fabs(d);
    const int prec = s.precision < 0 ? 6 : s.precision;
    char buf[512];
    if (type == 'r') {
      body = FloatRepr(mag);
      if (s.precision >= 0) {
        std::snprintf(buf, sizeof(buf), "%.*g", std::max(prec, 1), mag);
        body = buf;
      }
    } else if (type == 'f' || type == 'F' || type == '%') {
      std::snprintf(buf, sizeof(buf), "%.*f", prec, type == '%' ? mag * 100 : mag);
      body = buf;
      if (s.grouping) {
        const size_t dot = body.find('.');
        body = Group(body.substr(0, dot)) + (dot == std::string::npos ? "" : body.substr(dot));
      }
      if (type == '%') body += "%";
    } else if (type == 'e' || type == 'E') {
      std::snprintf(buf, sizeof(buf), type == 'e' ? "%.*e" : "%.*E", prec, mag);
      body = buf;
    } else if (type == 'g' || type == 'G') {
      std::snprintf(buf, sizeof(buf), s.alt ? (type == 'g' ? "%#.*g" : "%#.*G") : (type == 'g' ? "%.*g" : "%.*G"),
                    std::max(prec, 1), mag);
      body = buf;
    } else {
      Fail(absl::StrCat("Unknown format code '", std::string(1, type), "' for object of type '",
                        v.TypeName(), "'"));
    }
  }
  if (neg) {
    body = "-" + body;
  } else if (s.sign == '+') {
    body = "+" + body;
  } else if (s.sign == ' ') {
    body = " " + body;
  }
  return Pad(body, s, '>');
}

// --- methods ---

Value Method(const Value& self, const std::string& name,
             std::function<Value(Interpreter&, const Value&, CallArgs&)> fn) {
  return Callable(absl::StrCat("<built-in method ", name, " of ", self.TypeName(), " object>"),
                  [self, fn](Interpreter& interp, CallArgs& args) { return fn(interp, self, args); });
}

Value Unsafe(const Value& self, const std::string& name) {
  return Value::Undefined(
      absl::StrCat("access to attribute '", name, "' of '", self.TypeName(), "' object is unsafe."));
}

int64_t CpIndexToByte(const std::string& s, int64_t cp) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (n == cp) return static_cast<int64_t>(i);
      ++n;
    }
  }
  return static_cast<int64_t>(s.size());
}

int64_t ByteToCpIndex(const std::string& s, size_t byte) {
  return static_cast<int64_t>(CodePointCount(absl::string_view(s).substr(0, byte)));
}

// The [start, end) byte range of s[start:end] with Python's clamping.
std::pair<size_t, size_t> SubRange(const std::string& s, const ArgBinder& b, size_t first) {
  const int64_t n = static_cast<int64_t>(CodePointCount(s));
  const auto idx = [&](const Value& v, int64_t dflt) {
    if (v.is_undefined() || v.is_none()) return dflt;
    int64_t i = NeedInt(v, "slice index");
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  const int64_t a = idx(b.Get(first), 0);
  const int64_t e = idx(b.Get(first + 1), n);
  if (e < a) return {0, 0};
  return {static_cast<size_t>(CpIndexToByte(s, a)), static_cast<size_t>(CpIndexToByte(s, e))};
}

std::string PyCapitalize(const std::string& s) {
  const std::u32string in = Decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0) {
      AppendTitle(in[i], &out);
    } else {
      AppendLowerAt(in, i, &out);
    }
  }
  return Encode(out);
}

std::string PyTitleMethod(const std::string& s) {
  std::u32string out;
  bool prev_cased = false;
  const std::u32string in = Decode(s);
  for (size_t i = 0; i < in.size(); ++i) {
    if (prev_cased) {
      AppendLowerAt(in, i, &out);
    } else {
      AppendTitle(in[i], &out);
    }
    prev_cased = IsCased(in[i]);
  }
  return Encode(out);
}

template <typename Pred>
bool AllChars(const std::string& s, Pred pred) {
  const std::u32string cps = Decode(s);
  if (cps.empty()) return false;
  for (char32_t c : cps) {
    if (!pred(c)) return false;
  }
  return true;
}

bool PyIsLower(const std::string& s) {
  bool cased = false;
  for (char32_t c : Decode(s)) {
    if (IsUpperChar(c) || IsTitleChar(c)) return false;
    if (IsLowerChar(c)) cased = true;
  }
  return cased;
}

bool PyIsUpper(const std::string& s) {
  bool cased = false;
  for (char32_t c : Decode(s)) {
    if (IsLowerChar(c) || IsTitleChar(c)) return false;
    if (IsUpperChar(c)) cased = true;
  }
  return cased;
}

bool StartsOrEnds(Interpreter& interp, const Value& self, CallArgs& args, bool ends) {
  ArgBinder b(args, ends ? "endswith" : "startswith", {"prefix", "start", "end"});
  const std::string& s = self.string_value();
  const auto [lo, hi] = SubRange(s, b, 1);
  const std::string sub = s.substr(lo, hi - lo);
  const Value p = b.Get(0);
  std::vector<Value> prefixes;
  if (p.kind() == Value::Kind::kTuple) {
    prefixes = p.list_value();
  } else if (p.is_string()) {
    prefixes.push_back(p);
  } else {
    TypeError(absl::StrCat(ends ? "endswith" : "startswith",
                           " first arg must be str or a tuple of str, not ", p.TypeName()));
  }
  for (const Value& x : prefixes) {
    const std::string& t = NeedStr(x, "tuple item");
    if (t.size() > sub.size()) continue;
    if (ends ? sub.compare(sub.size() - t.size(), t.size(), t) == 0 : sub.compare(0, t.size(), t) == 0) {
      return true;
    }
  }
  (void)interp;
  return false;
}

std::optional<Value> StrMethod(const Value& self, const std::string& name) {
  using Fn = std::function<Value(Interpreter&, const Value&, CallArgs&)>;
  static const std::map<std::string, Fn>* const kMethods = new std::map<std::string, Fn>{
      {"upper", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "upper", {}); return Value(PyUpper(s.string_value())); }},
      {"lower", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "lower", {}); return Value(PyLower(s.string_value())); }},
      {"casefold", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "casefold", {}); return Value(PyLower(s.string_value())); }},
      {"title", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "title", {}); return Value(PyTitleMethod(s.string_value())); }},
      {"capitalize", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "capitalize", {}); return Value(PyCapitalize(s.string_value())); }},
      {"swapcase", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder(a, "swapcase", {});
         std::u32string out;
         const std::u32string in = Decode(s.string_value());
         for (size_t i = 0; i < in.size(); ++i) {
           if (IsUpperChar(in[i])) AppendLowerAt(in, i, &out); else if (IsLowerChar(in[i])) AppendUpper(in[i], &out); else out.push_back(in[i]);
         }
         return Value(Encode(out));
       }},
      {"strip", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder b(a, "strip", {"chars"}); return Value(PyStrip(s.string_value(), b.Get(0, Value::None()), true, true)); }},
      {"lstrip", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder b(a, "lstrip", {"chars"}); return Value(PyStrip(s.string_value(), b.Get(0, Value::None()), true, false)); }},
      {"rstrip", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder b(a, "rstrip", {"chars"}); return Value(PyStrip(s.string_value(), b.Get(0, Value::None()), false, true)); }},
      {"split", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "split", {"sep", "maxsplit"});
         std::vector<Value> out;
         for (auto& p : PySplit(s.string_value(), b.Get(0, Value::None()), NeedInt(b.Get(1, Value(-1)), "maxsplit"))) out.emplace_back(std::move(p));
         return Value::MakeList(std::move(out));
       }},
      {"rsplit", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "rsplit", {"sep", "maxsplit"});
         const int64_t maxsplit = NeedInt(b.Get(1, Value(-1)), "maxsplit");
         // rsplit == reversed split of the reversed string (sep reversed too).
         const Value sep = b.Get(0, Value::None());
         std::u32string rs = Decode(s.string_value());
         std::reverse(rs.begin(), rs.end());
         Value rsep = sep;
         if (sep.is_string()) {
           std::u32string t = Decode(sep.string_value());
           std::reverse(t.begin(), t.end());
           rsep = Value(Encode(t));
         }
         std::vector<std::string> parts = PySplit(Encode(rs), rsep, maxsplit);
         std::reverse(parts.begin(), parts.end());
         std::vector<Value> out;
         for (auto& p : parts) {
           std::u32string t = Decode(p);
           std::reverse(t.begin(), t.end());
           out.emplace_back(Encode(t));
         }
         return Value::MakeList(std::move(out));
       }},
      {"splitlines", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "splitlines", {"keepends"});
         std::vector<Value> out;
         for (auto& p : PySplitLines(s.string_value(), b.Get(0, Value(false)).Truthy())) out.emplace_back(std::move(p));
         return Value::MakeList(std::move(out));
       }},
      {"startswith", [](Interpreter& i, const Value& s, CallArgs& a) { return Value(StartsOrEnds(i, s, a, false)); }},
      {"endswith", [](Interpreter& i, const Value& s, CallArgs& a) { return Value(StartsOrEnds(i, s, a, true)); }},
      {"replace", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "replace", {"old", "new", "count"});
         return Value(PyReplace(s.string_value(), NeedStr(b.Get(0), "replace() argument 1"),
                                NeedStr(b.Get(1), "replace() argument 2"), NeedInt(b.Get(2, Value(-1)), "count")));
       }},
      {"find", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "find", {"sub", "start", "end"});
         const std::string& str = s.string_value();
         const auto [lo, hi] = SubRange(str, b, 1);
         const size_t p = str.substr(0, hi).find(NeedStr(b.Get(0), "must be str"), lo);
         return Value(p == std::string::npos ? int64_t{-1} : ByteToCpIndex(str, p));
       }},
      {"rfind", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "rfind", {"sub", "start", "end"});
         const std::string& str = s.string_value();
         const auto [lo, hi] = SubRange(str, b, 1);
         const std::string& sub = NeedStr(b.Get(0), "must be str");
         const size_t p = str.substr(0, hi).rfind(sub);
         return Value(p == std::string::npos || p < lo ? int64_t{-1} : ByteToCpIndex(str, p));
       }},
      {"index", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "index", {"sub", "start", "end"});
         const std::string& str = s.string_value();
         const auto [lo, hi] = SubRange(str, b, 1);
         const size_t p = str.substr(0, hi).find(NeedStr(b.Get(0), "must be str"), lo);
         if (p == std::string::npos) Fail("substring not found");
         return Value(ByteToCpIndex(str, p));
       }},
      {"rindex", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "rindex", {"sub", "start", "end"});
         const std::string& str = s.string_value();
         const auto [lo, hi] = SubRange(str, b, 1);
         const size_t p = str.substr(0, hi).rfind(NeedStr(b.Get(0), "must be str"));
         if (p == std::string::npos || p < lo) Fail("substring not found");
         return Value(ByteToCpIndex(str, p));
       }},
      {"count", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "count", {"sub", "start", "end"});
         const std::string& str = s.string_value();
         const auto [lo, hi] = SubRange(str, b, 1);
         const std::string hay = str.substr(lo, hi - lo);
         const std::string& sub = NeedStr(b.Get(0), "must be str");
         if (sub.empty()) return Value(static_cast<int64_t>(CodePointCount(hay)) + 1);
         int64_t n = 0;
         for (size_t p = hay.find(sub); p != std::string::npos; p = hay.find(sub, p + sub.size())) ++n;
         return Value(n);
       }},
      {"join", [](Interpreter& i, const Value& s, CallArgs& a) {
         ArgBinder b(a, "join", {"iterable"});
         std::string out;
         bool first = true;
         for (const Value& v : i.Iterate(b.Get(0))) {
           if (!v.is_string()) {
             TypeError(absl::StrCat("sequence item: expected str instance, ", v.TypeName(), " found"));
           }
           if (!first) out += s.string_value();
           first = false;
           out += v.string_value();
         }
         return Value(std::move(out));
       }},
      {"format", [](Interpreter& i, const Value& s, CallArgs& a) { return Value(PyStrFormat(i, s.string_value(), a)); }},
      {"center", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "center", {"width", "fillchar"});
         Spec sp;
         sp.width = static_cast<int>(NeedInt(b.Get(0), "width"));
         const std::string fill = b.Has(1) ? NeedStr(b.Get(1), "fillchar") : " ";
         sp.fill = Decode(fill).empty() ? U' ' : Decode(fill)[0];
         const std::string& str = s.string_value();
         const int64_t len = static_cast<int64_t>(CodePointCount(str));
         const int64_t marg = sp.width - len;
         if (marg <= 0) return s;
         const int64_t left = marg / 2 + (marg & sp.width & 1);
         std::string out;
         for (int64_t k = 0; k < left; ++k) AppendUtf8(sp.fill, &out);
         out += str;
         for (int64_t k = 0; k < marg - left; ++k) AppendUtf8(sp.fill, &out);
         return Value(out);
       }},
      {"ljust", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "ljust", {"width", "fillchar"});
         Spec sp;
         sp.width = static_cast<int>(NeedInt(b.Get(0), "width"));
         if (b.Has(1)) sp.fill = Decode(NeedStr(b.Get(1), "fillchar"))[0];
         sp.align = '<';
         return Value(Pad(s.string_value(), sp, '<'));
       }},
      {"rjust", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "rjust", {"width", "fillchar"});
         Spec sp;
         sp.width = static_cast<int>(NeedInt(b.Get(0), "width"));
         if (b.Has(1)) sp.fill = Decode(NeedStr(b.Get(1), "fillchar"))[0];
         sp.align = '>';
         return Value(Pad(s.string_value(), sp, '>'));
       }},
      {"zfill", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "zfill", {"width"});
         const int64_t width = NeedInt(b.Get(0), "width");
         const std::string& str = s.string_value();
         const int64_t len = static_cast<int64_t>(CodePointCount(str));
         if (len >= width) return s;
         const std::string zeros(static_cast<size_t>(width - len), '0');
         if (!str.empty() && (str[0] == '+' || str[0] == '-')) return Value(str.substr(0, 1) + zeros + str.substr(1));
         return Value(zeros + str);
       }},
      {"removeprefix", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "removeprefix", {"prefix"});
         const std::string& p = NeedStr(b.Get(0), "removeprefix() argument");
         const std::string& str = s.string_value();
         return str.compare(0, p.size(), p) == 0 ? Value(str.substr(p.size())) : s;
       }},
      {"removesuffix", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "removesuffix", {"suffix"});
         const std::string& p = NeedStr(b.Get(0), "removesuffix() argument");
         const std::string& str = s.string_value();
         return !p.empty() && str.size() >= p.size() && str.compare(str.size() - p.size(), p.size(), p) == 0
                    ? Value(str.substr(0, str.size() - p.size()))
                    : s;
       }},
      {"partition", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "partition", {"sep"});
         const std::string& sep = NeedStr(b.Get(0), "sep");
         if (sep.empty()) Fail("empty separator");
         const std::string& str = s.string_value();
         const size_t p = str.find(sep);
         if (p == std::string::npos) return Value::MakeTuple({s, Value(""), Value("")});
         return Value::MakeTuple({Value(str.substr(0, p)), Value(sep), Value(str.substr(p + sep.size()))});
       }},
      {"rpartition", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder b(a, "rpartition", {"sep"});
         const std::string& sep = NeedStr(b.Get(0), "sep");
         if (sep.empty()) Fail("empty separator");
         const std::string& str = s.string_value();
         const size_t p = str.rfind(sep);
         if (p == std::string::npos) return Value::MakeTuple({Value(""), Value(""), s});
         return Value::MakeTuple({Value(str.substr(0, p)), Value(sep), Value(str.substr(p + sep.size()))});
       }},
      {"isalpha", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "isalpha", {}); return Value(AllChars(s.string_value(), IsAlpha)); }},
      {"isdigit", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "isdigit", {}); return Value(AllChars(s.string_value(), IsDigit)); }},
      {"isdecimal", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "isdecimal", {}); return Value(AllChars(s.string_value(), IsDecimal)); }},
      {"isnumeric", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "isnumeric", {}); return Value(AllChars(s.string_value(), IsNumeric)); }},
      {"isalnum", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder(a, "isalnum", {});
         return Value(AllChars(s.string_value(), [](char32_t c) { return IsAlpha(c) || IsNumeric(c); }));
       }},
      {"isspace", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "isspace", {}); return Value(AllChars(s.string_value(), IsPySpace)); }},
      {"isascii", [](Interpreter&, const Value& s, CallArgs& a) {
         ArgBinder(a, "isascii", {});
         for (char c : s.string_value()) if (static_cast<unsigned char>(c) >= 0x80) return Value(false);
         return Value(true);
       }},
      {"islower", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "islower", {}); return Value(PyIsLower(s.string_value())); }},
      {"isupper", [](Interpreter&, const Value& s, CallArgs& a) { ArgBinder(a, "isupper", {}); return Value(PyIsUpper(s.string_value())); }},
  };
  auto it = kMethods->find(name);
  if (it == kMethods->end()) return std::nullopt;
  return Method(self, name, it->second);
}

std::optional<Value> DictMethod(const Value& self, const std::string& name) {
  if (name == "get") {
    return Method(self, name, [](Interpreter&, const Value& d, CallArgs& a) {
      ArgBinder b(a, "get", {"key", "default"});
      const Value* v = d.dict_value().Find(b.Get(0));
      return v != nullptr ? *v : b.Get(1, Value::None());
    });
  }
  if (name == "keys" || name == "values" || name == "items") {
    return Method(self, name, [name](Interpreter&, const Value& d, CallArgs& a) {
      ArgBinder(a, name, {});
      std::vector<Value> out;
      for (const auto& kv : d.dict_value().items()) {
        if (name == "keys") out.push_back(kv.first);
        if (name == "values") out.push_back(kv.second);
        if (name == "items") out.push_back(Value::MakeTuple({kv.first, kv.second}));
      }
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "copy") {
    return Method(self, name, [](Interpreter&, const Value& d, CallArgs& a) {
      ArgBinder(a, "copy", {});
      return d;
    });
  }
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear" ||
      name == "fromkeys") {
    return Unsafe(self, name);
  }
  return std::nullopt;
}

std::optional<Value> ListMethod(const Value& self, const std::string& name) {
  if (name == "index") {
    return Method(self, name, [](Interpreter&, const Value& l, CallArgs& a) {
      ArgBinder b(a, "index", {"value", "start", "stop"});
      const auto& items = l.list_value();
      for (size_t i = 0; i < items.size(); ++i) {
        if (PyEquals(items[i], b.Get(0))) return Value(static_cast<int64_t>(i));
      }
      Fail(absl::StrCat(b.Get(0).Repr(), " is not in list"));
    });
  }
  if (name == "count") {
    return Method(self, name, [](Interpreter&, const Value& l, CallArgs& a) {
      ArgBinder b(a, "count", {"value"});
      int64_t n = 0;
      for (const Value& v : l.list_value()) n += PyEquals(v, b.Get(0)) ? 1 : 0;
      return Value(n);
    });
  }
  if (self.kind() == Value::Kind::kList &&
      (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
       name == "reverse" || name == "sort" || name == "clear" || name == "copy")) {
    if (name == "copy") {
      return Method(self, name, [](Interpreter&, const Value& l, CallArgs& a) {
        ArgBinder(a, "copy", {});
        return l;
      });
    }
    return Unsafe(self, name);
  }
  return std::nullopt;
}

// --- filters ---

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Value RoundValue(const Value& value, const Value& precision_v, const std::string& method) {
  if (value.is_undefined()) FailUndefined(value);
  if (!value.is_number()) TypeError(absl::StrCat("type ", value.TypeName(), " doesn't define __round__ method"));
  const int64_t precision = NeedInt(precision_v, "precision");
  if (method == "common") {
    if (IsIntLike(value)) {
      if (precision >= 0) return Value(value.int_value());
      // round(int, -n): half to even on multiples of 10**n.
      int64_t p = 1;
      for (int64_t k = 0; k < -precision && p < INT64_MAX / 10; ++k) p *= 10;
      const int64_t x = value.int_value();
      int64_t q = x / p, r = x % p;
      if (r < 0) r += p, --q;
      if (2 * r > p || (2 * r == p && (q & 1))) ++q;
      return Value(q * p);
    }
    const double d = value.float_value();
    if (!std::isfinite(d)) return Value(d);
    if (precision > 300) return Value(d);
    if (precision < 0) {
      const double p = std::pow(10.0, static_cast<double>(-precision));
      const double y = d / p;
      double r = std::nearbyint(y);  // ties to even under the default rounding mode
      return Value(r * p);
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), d);
    return Value(std::strtod(buf, nullptr));
  }
  if (method != "ceil" && method != "floor") Fail("method must be common, ceil or floor");
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double x = AsDouble(value) * p;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

std::string Indent(const std::string& s_in, const Value& width, bool first, bool blank) {
  const std::string indention = width.is_string() ? width.string_value()
                                                  : std::string(static_cast<size_t>(std::max<int64_t>(0, NeedInt(width, "width"))), ' ');
  const std::string s = s_in + "\n";
  std::vector<std::string> lines = PySplitLines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        rv += lines[i].empty() ? lines[i] : indention + lines[i];
      }
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

std::string Truncate(const std::string& s, int64_t length, bool killwords, const std::string& end,
                     int64_t leeway) {
  const std::u32string cps = Decode(s);
  const int64_t end_len = static_cast<int64_t>(CodePointCount(end));
  if (length < end_len) Fail(absl::StrCat("expected length >= ", end_len, ", got ", length));
  if (leeway < 0) Fail(absl::StrCat("expected leeway >= 0, got ", leeway));
  if (static_cast<int64_t>(cps.size()) <= length + leeway) return s;
  const std::u32string head = cps.substr(0, static_cast<size_t>(length - end_len));
  if (killwords) return Encode(head) + end;
  const size_t sp = head.rfind(U' ');
  return Encode(sp == std::u32string::npos ? head : head.substr(0, sp)) + end;
}

const std::map<std::string, FilterFn>& Filters() {
  static const std::map<std::string, FilterFn>* const kFilters = new std::map<std::string, FilterFn>{
      {"abs", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder(a, "abs", {});
         if (v.is_undefined()) FailUndefined(v);
         if (v.kind() == Value::Kind::kFloat) return Value(std::fabs(v.float_value()));
         if (IsIntLike(v)) {
           if (v.int_value() == INT64_MIN) Fail("integer result beyond 64 bits (not supported)");
           return Value(v.int_value() < 0 ? -v.int_value() : v.int_value());
         }
         TypeError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
       }},
      {"attr", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "attr", {"name"});
         const std::string& name = NeedStr(b.Get(0), "attribute name");
         if (v.kind() == Value::Kind::kDict) {
           std::optional<Value> m = BuiltinMethod(v, name);
           return m ? *m : Value::Undefined(absl::StrCat("'dict object' has no attribute '", name, "'"));
         }
         return i.GetAttr(v, name);
       }},
      {"batch", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "batch", {"linecount", "fill_with"});
         const int64_t n = NeedInt(b.Get(0), "linecount");
         const Value fill = b.Get(1, Value::None());
         std::vector<Value> out, tmp;
         for (Value& item : i.Iterate(v)) {
           if (static_cast<int64_t>(tmp.size()) == n) {
             out.push_back(Value::MakeList(std::move(tmp)));
             tmp.clear();
           }
           tmp.push_back(std::move(item));
         }
         if (!tmp.empty()) {
           if (!fill.is_none() && static_cast<int64_t>(tmp.size()) < n) tmp.resize(static_cast<size_t>(n), fill);
           out.push_back(Value::MakeList(std::move(tmp)));
         }
         return Generator(std::move(out), "do_batch");
       }},
      {"capitalize", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "capitalize", {}); return Value(PyCapitalize(v.Str())); }},
      {"center", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "center", {"width"});
         const std::string s = v.Str();
         const int64_t width = NeedInt(b.Get(0, Value(80)), "width");
         const int64_t marg = width - static_cast<int64_t>(CodePointCount(s));
         if (marg <= 0) return Value(s);
         const int64_t left = marg / 2 + (marg & width & 1);
         return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(marg - left), ' '));
       }},
      {"count", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "count", {}); return Value(i.Length(v)); }},
      {"length", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "length", {}); return Value(i.Length(v)); }},
      {"default", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "default", {"default_value", "boolean"});
         if (v.is_undefined() || (b.Get(1, Value(false)).Truthy() && !v.Truthy())) return b.Get(0, Value(""));
         return v;
       }},
      {"dictsort", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "dictsort", {"case_sensitive", "by", "reverse"});
         const bool cs = b.Get(0, Value(false)).Truthy();
         const Value by = b.Get(1, Value("key"));
         int pos;
         if (by.is_string() && by.string_value() == "key") pos = 0;
         else if (by.is_string() && by.string_value() == "value") pos = 1;
         else Fail("You can only sort by either \"key\" or \"value\"");
         if (v.kind() != Value::Kind::kDict) {
           if (v.is_undefined()) FailUndefined(v);
           Fail(absl::StrCat("'", v.TypeName(), "' object has no attribute 'items'"));
         }
         std::vector<Value> items;
         for (const auto& kv : v.dict_value().items()) items.push_back(Value::MakeTuple({kv.first, kv.second}));
         return Value::MakeList(Sorted(i, std::move(items), [pos, cs](const Value& t) {
           const Value& x = t.list_value()[pos];
           return cs ? x : IgnoreCase(x);
         }, b.Get(2, Value(false)).Truthy()));
       }},
      {"escape", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "escape", {}); return Value(HtmlEscape(v.Str())); }},
      {"forceescape", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "forceescape", {}); return Value(HtmlEscape(v.Str())); }},
      {"first", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder(a, "first", {});
         if (v.kind() == Value::Kind::kGenerator) {
           Value out;
           if (static_cast<GeneratorObject*>(v.object())->Next(&out)) return out;
           return Value::Undefined("No first item, sequence was empty.");
         }
         std::vector<Value> items = i.Iterate(v);
         return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
       }},
      {"last", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder(a, "last", {});
         if (v.kind() == Value::Kind::kGenerator) TypeError("'generator' object is not reversible");
         std::vector<Value> items = i.Iterate(v);
         return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
       }},
      {"float", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "float", {"default"});
         if (v.is_undefined()) FailUndefined(v);
         if (v.is_number()) return Value(AsDouble(v));
         if (v.is_string()) {
           if (auto d = ParsePyFloat(v.string_value())) return Value(*d);
         }
         return b.Get(0, Value(0.0));
       }},
      {"int", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "int", {"default", "base"});
         if (v.is_undefined()) FailUndefined(v);
         if (IsIntLike(v)) return Value(v.int_value());
         if (v.kind() == Value::Kind::kFloat) {
           const double d = v.float_value();
           if (std::isnan(d)) return b.Get(0, Value(0));
           if (!std::isfinite(d) || std::fabs(d) > 9.2e18) Fail("cannot convert float to a 64-bit integer");
           return Value(static_cast<int64_t>(d));
         }
         if (v.is_string()) {
           const int64_t base = NeedInt(b.Get(1, Value(10)), "base");
           if (base != 0 && (base < 2 || base > 36)) Fail("int() base must be >= 2 and <= 36, or 0");
           if (auto i = ParsePyInt(v.string_value(), static_cast<int>(base))) return Value(*i);
           if (auto d = ParsePyFloat(v.string_value())) {
             if (std::isnan(*d)) return b.Get(0, Value(0));
             if (!std::isfinite(*d) || std::fabs(*d) > 9.2e18) Fail("cannot convert float to a 64-bit integer");
             return Value(static_cast<int64_t>(*d));
           }
         }
         return b.Get(0, Value(0));
       }},
      {"format", [](Interpreter&, const Value& v, CallArgs& a) {
         if (!a.args.empty() && !a.kwargs.empty()) Fail("can't handle positional and keyword arguments at the same time");
         if (!a.kwargs.empty()) {
           Dict d;
           for (auto& kv : a.kwargs) d.Set(Value(kv.first), kv.second);
           return Value(PyPercentFormat(v.Str(), Value::MakeDict(std::move(d))));
         }
         return Value(PyPercentFormat(v.Str(), Value::MakeTuple(a.args)));
       }},
      {"indent", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "indent", {"width", "first", "blank"});
         // Python does `s += "\n"` first: only a str survives it.
         if (v.is_undefined()) FailUndefined(v);
         if (!v.is_string()) {
           if (v.kind() == Value::Kind::kList) TypeError("'list' object has no attribute 'splitlines'");
           TypeError(absl::StrCat("unsupported operand type(s) for +=: '", v.TypeName(), "' and 'str'"));
         }
         return Value(Indent(v.string_value(), b.Get(0, Value(4)), b.Get(1, Value(false)).Truthy(), b.Get(2, Value(false)).Truthy()));
       }},
      {"items", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder(a, "items", {});
         if (v.is_undefined()) return Generator({}, "do_items");
         if (v.kind() != Value::Kind::kDict) TypeError("Can only get item pairs from a mapping.");
         std::vector<Value> out;
         for (const auto& kv : v.dict_value().items()) out.push_back(Value::MakeTuple({kv.first, kv.second}));
         return Generator(std::move(out), "do_items");
       }},
      {"join", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "join", {"d", "attribute"});
         const std::string sep = b.Get(0, Value("")).Str();
         std::vector<Value> items = i.Iterate(v);
         if (b.Has(1) && !b.Get(1).is_none()) {
           auto getter = AttrGetter(i, b.Get(1), false);
           for (Value& x : items) x = getter(x);
         }
         std::string out;
         for (size_t k = 0; k < items.size(); ++k) {
           if (k) out += sep;
           out += items[k].Str();
         }
         return Value(std::move(out));
       }},
      {"list", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "list", {}); return Value::MakeList(i.Iterate(v)); }},
      {"lower", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "lower", {}); return Value(PyLower(v.Str())); }},
      {"upper", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "upper", {}); return Value(PyUpper(v.Str())); }},
      {"map", [](Interpreter& i, const Value& v, CallArgs& a) {
         if (!v.Truthy()) return Generator({}, "sync_do_map");
         std::function<Value(const Value&)> fn;
         if (a.args.empty()) {
           Value attribute, fallback = Value::None();
           bool have_attr = false;
           for (auto& kv : a.kwargs) {
             if (kv.first == "attribute") attribute = kv.second, have_attr = true;
             else if (kv.first == "default") fallback = kv.second;
             else Fail(absl::StrCat("Unexpected keyword argument '", kv.first, "'"));
           }
           if (!have_attr) Fail("map requires a filter argument");
           fn = AttrGetter(i, attribute, false, fallback);
         } else {
           const std::string name = NeedStr(a.args[0], "filter name");
           CallArgs rest;
           rest.args.assign(a.args.begin() + 1, a.args.end());
           rest.kwargs = a.kwargs;
           fn = [&i, name, rest](const Value& x) {
             CallArgs c = rest;
             return i.CallFilter(name, x, c);
           };
         }
         std::vector<Value> out;
         for (const Value& x : i.Iterate(v)) out.push_back(fn(x));
         return Generator(std::move(out), "sync_do_map");
       }},
      {"max", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "max", {"case_sensitive", "attribute"});
         std::vector<Value> items = i.Iterate(v);
         if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
         auto key = AttrGetter(i, b.Get(1, Value::None()), !b.Get(0, Value(false)).Truthy());
         size_t best = 0;
         Value best_key = key(items[0]);
         for (size_t k = 1; k < items.size(); ++k) {
           Value kk = key(items[k]);
           if (i.Compare(kk, best_key, ">") > 0) best = k, best_key = kk;
         }
         return items[best];
       }},
      {"min", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "min", {"case_sensitive", "attribute"});
         std::vector<Value> items = i.Iterate(v);
         if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
         auto key = AttrGetter(i, b.Get(1, Value::None()), !b.Get(0, Value(false)).Truthy());
         size_t best = 0;
         Value best_key = key(items[0]);
         for (size_t k = 1; k < items.size(); ++k) {
           Value kk = key(items[k]);
           if (i.Compare(kk, best_key, "<") < 0) best = k, best_key = kk;
         }
         return items[best];
       }},
      {"reject", [](Interpreter& i, const Value& v, CallArgs& a) { return SelectOrReject(i, v, a, false, false, "select_or_reject"); }},
      {"rejectattr", [](Interpreter& i, const Value& v, CallArgs& a) { return SelectOrReject(i, v, a, false, true, "select_or_reject"); }},
      {"select", [](Interpreter& i, const Value& v, CallArgs& a) { return SelectOrReject(i, v, a, true, false, "select_or_reject"); }},
      {"selectattr", [](Interpreter& i, const Value& v, CallArgs& a) { return SelectOrReject(i, v, a, true, true, "select_or_reject"); }},
      {"replace", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "replace", {"old", "new", "count"});
         const Value count = b.Get(2, Value::None());
         return Value(PyReplace(v.Str(), b.Get(0).Str(), b.Get(1).Str(), count.is_none() ? -1 : NeedInt(count, "count")));
       }},
      {"reverse", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder(a, "reverse", {});
         if (v.is_string()) {
           std::u32string cps = Decode(v.string_value());
           std::reverse(cps.begin(), cps.end());
           return Value(Encode(cps));
         }
         const Value::Kind kind = v.kind();
         std::vector<Value> items = i.Iterate(v);
         std::reverse(items.begin(), items.end());
         if (kind == Value::Kind::kGenerator) return Value::MakeList(std::move(items));
         // Python's reversed() iterators, named as their repr shows them.
         const char* name = kind == Value::Kind::kList   ? "list_reverseiterator"
                            : kind == Value::Kind::kDict ? "dict_reversekeyiterator"
                                                         : "reversed";
         return Value::FromObject(Value::Kind::kGenerator,
                                  std::make_shared<GeneratorObject>(std::move(items), name, /*plain=*/true));
       }},
      {"round", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "round", {"precision", "method"});
         return RoundValue(v, b.Get(0, Value(0)), b.Get(1, Value("common")).Str());
       }},
      {"safe", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "safe", {}); return Value(v.Str()); }},
      {"slice", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "slice", {"slices", "fill_with"});
         std::vector<Value> seq = i.Iterate(v);
         const int64_t slices = NeedInt(b.Get(0), "slices");
         if (slices <= 0) Fail("integer division or modulo by zero");
         const Value fill = b.Get(1, Value::None());
         const int64_t length = static_cast<int64_t>(seq.size());
         const int64_t per = length / slices, extra = length % slices;
         int64_t offset = 0;
         std::vector<Value> out;
         for (int64_t n = 0; n < slices; ++n) {
           const int64_t start = offset + n * per;
           if (n < extra) ++offset;
           const int64_t end = offset + (n + 1) * per;
           std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
           if (!fill.is_none() && n >= extra) tmp.push_back(fill);
           out.push_back(Value::MakeList(std::move(tmp)));
         }
         return Generator(std::move(out), "sync_do_slice");
       }},
      {"sort", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "sort", {"reverse", "case_sensitive", "attribute"});
         const bool cs = b.Get(1, Value(false)).Truthy();
         const Value attribute = b.Get(2, Value::None());
         std::function<Value(const Value&)> key;
         if (attribute.is_string() && attribute.string_value().find(',') != std::string::npos) {
           std::vector<std::function<Value(const Value&)>> getters;
           size_t start = 0;
           const std::string& s = attribute.string_value();
           while (true) {
             const size_t comma = s.find(',', start);
             getters.push_back(AttrGetter(i, Value(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start)), !cs));
             if (comma == std::string::npos) break;
             start = comma + 1;
           }
           key = [getters](const Value& x) {
             std::vector<Value> k;
             for (const auto& g : getters) k.push_back(g(x));
             return Value::MakeList(std::move(k));
           };
         } else {
           auto g = AttrGetter(i, attribute, !cs);
           key = [g](const Value& x) { return Value::MakeList({g(x)}); };
         }
         return Value::MakeList(Sorted(i, i.Iterate(v), key, b.Get(0, Value(false)).Truthy()));
       }},
      {"string", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "string", {}); return Value(v.Str()); }},
      {"sum", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "sum", {"attribute", "start"});
         std::vector<Value> items = i.Iterate(v);
         if (b.Has(0) && !b.Get(0).is_none()) {
           auto g = AttrGetter(i, b.Get(0), false);
           for (Value& x : items) x = g(x);
         }
         Value total = b.Get(1, Value(0));
         for (const Value& x : items) total = i.Binary("+", total, x);
         return total;
       }},
      {"title", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder(a, "title", {});
         // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s) if item)
         const std::u32string cps = Decode(v.Str());
         const auto is_sep = [](char32_t c) {
           return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c);
         };
         std::u32string out;
         size_t k = 0;
         while (k < cps.size()) {
           size_t e = k;
           const bool sep = is_sep(cps[k]);
           while (e < cps.size() && is_sep(cps[e]) == sep) ++e;
           std::u32string item = cps.substr(k, e - k);
           AppendUpper(item[0], &out);
           out += Decode(PyLower(Encode(item.substr(1))));
           k = e;
         }
         return Value(Encode(out));
       }},
      {"tojson", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
         JsonOptions o;
         o.ensure_ascii = b.Get(0, Value(false)).Truthy();
         const Value indent = b.Get(1, Value::None());
         if (indent.is_string()) {
           o.indent = indent.string_value();
         } else if (IsIntLike(indent)) {
           o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.int_value())), ' ');
         } else if (!indent.is_none()) {
           TypeError(absl::StrCat("can't multiply sequence by non-int of type '", indent.TypeName(), "'"));
         }
         const Value seps = b.Get(2, Value::None());
         if (!seps.is_none()) {
           if (!seps.is_sequence() || seps.list_value().size() != 2 || !seps.list_value()[0].is_string() ||
               !seps.list_value()[1].is_string()) {
             Fail("tojson separators must be a pair of strings");
           }
           o.separators = std::make_pair(seps.list_value()[0].string_value(), seps.list_value()[1].string_value());
         }
         o.sort_keys = b.Get(3, Value(false)).Truthy();
         absl::StatusOr<std::string> j = ToJson(v, o);
         if (!j.ok()) Fail(std::string(j.status().message()));
         return Value(*std::move(j));
       }},
      {"trim", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder b(a, "trim", {"chars"});
         return Value(PyStrip(v.Str(), b.Get(0, Value::None()), true, true));
       }},
      {"truncate", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "truncate", {"length", "killwords", "end", "leeway"});
         const Value leeway_v = b.Get(3, Value::None());
         const int64_t length = NeedInt(b.Get(0, Value(255)), "length");
         const int64_t leeway = leeway_v.is_none() ? 5 : NeedInt(leeway_v, "leeway");
         const std::string end = b.Get(2, Value("...")).Str();
         if (!v.is_string()) {
           // Python measures any sized value; only a short one comes back unchanged.
           if (length < static_cast<int64_t>(CodePointCount(end))) Fail("expected length >= len(end)");
           if (i.Length(v) <= length + leeway) return v;
           TypeError(absl::StrCat("'", v.TypeName(), "' object has no attribute 'rsplit'"));
         }
         return Value(Truncate(v.string_value(), length, b.Get(1, Value(false)).Truthy(), end, leeway));
       }},
      {"unique", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "unique", {"case_sensitive", "attribute"});
         auto key = AttrGetter(i, b.Get(1, Value::None()), !b.Get(0, Value(false)).Truthy());
         std::vector<Value> seen, out;
         for (Value& x : i.Iterate(v)) {
           Value k = key(x);
           CheckHashable(k);
           bool dup = false;
           for (const Value& s : seen) dup = dup || PyEquals(s, k);
           if (!dup) {
             seen.push_back(k);
             out.push_back(std::move(x));
           }
         }
         return Generator(std::move(out), "do_unique");
       }},
      {"urlencode", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder(a, "urlencode", {});
         std::string out;
         for (unsigned char c : v.Str()) {
           if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || c == '/') {
             out.push_back(static_cast<char>(c));
           } else {
             char buf[4];
             std::snprintf(buf, sizeof(buf), "%%%02X", c);
             out += buf;
           }
         }
         return Value(out);
       }},
      {"wordcount", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder(a, "wordcount", {});
         int64_t n = 0;
         bool in_word = false;
         for (char32_t c : Decode(v.Str())) {
           const bool w = c == '_' || IsAlpha(c) || IsNumeric(c);
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  };
  return *kFilters;
}

bool IsSequenceType(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kDict:
    case Value::Kind::kUndefined:
      return true;
    default:
      return false;
  }
}

bool IsIterableType(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kDict:
    case Value::Kind::kUndefined:
    case Value::Kind::kGenerator:
      return true;
    case Value::Kind::kCallable:
      return dynamic_cast<LoopObject*>(v.object()) != nullptr;
    default:
      return false;
  }
}

bool SameAs(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kNone: return true;
    case Value::Kind::kBool: return a.bool_value() == b.bool_value();
    case Value::Kind::kInt: return a.int_value() == b.int_value() && a.int_value() >= -5 && a.int_value() <= 256;
    case Value::Kind::kString: return a.string_value() == b.string_value() && a.string_value().size() <= 1;
    case Value::Kind::kNamespace:
    case Value::Kind::kGenerator:
    case Value::Kind::kCallable:
      return a.object() == b.object();
    default:
      return false;
  }
}

Value Modulo(Interpreter& i, const Value& v, const Value& n) { return i.Binary("%", v, n); }

const std::map<std::string, TestFn>& Tests() {
  const auto cmp = [](const char* op) -> TestFn {
    const std::string o = op;
    return [o](Interpreter& i, const Value& v, CallArgs& a) {
      ArgBinder b(a, o, {"other"});
      const Value other = b.Get(0);
      if (o == "==") return PyEquals(v, other);
      if (o == "!=") return !PyEquals(v, other);
      const int c = i.Compare(v, other, o.c_str());
      return o == "<" ? c < 0 : o == "<=" ? c <= 0 : o == ">" ? c > 0 : c >= 0;
    };
  };
  static const std::map<std::string, TestFn>* const kTests = new std::map<std::string, TestFn>{
      {"defined", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "defined", {}); return !v.is_undefined(); }},
      {"undefined", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "undefined", {}); return v.is_undefined(); }},
      {"none", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "none", {}); return v.is_none(); }},
      {"boolean", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "boolean", {}); return v.kind() == Value::Kind::kBool; }},
      {"false", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "false", {}); return v.kind() == Value::Kind::kBool && !v.bool_value(); }},
      {"true", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "true", {}); return v.kind() == Value::Kind::kBool && v.bool_value(); }},
      {"integer", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "integer", {}); return v.kind() == Value::Kind::kInt; }},
      {"float", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "float", {}); return v.kind() == Value::Kind::kFloat; }},
      {"number", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "number", {}); return v.is_number(); }},
      {"string", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "string", {}); return v.is_string(); }},
      {"mapping", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "mapping", {}); return v.kind() == Value::Kind::kDict; }},
      {"sequence", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "sequence", {}); return IsSequenceType(v); }},
      {"iterable", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "iterable", {}); return IsIterableType(v); }},
      {"callable", [](Interpreter&, const Value& v, CallArgs& a) {
         ArgBinder(a, "callable", {});
         return v.kind() == Value::Kind::kCallable || v.is_undefined();
       }},
      {"escaped", [](Interpreter&, const Value&, CallArgs& a) { ArgBinder(a, "escaped", {}); return false; }},
      {"sameas", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder b(a, "sameas", {"other"}); return SameAs(v, b.Get(0)); }},
      {"odd", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "odd", {}); return PyEquals(Modulo(i, v, Value(2)), Value(1)); }},
      {"even", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "even", {}); return PyEquals(Modulo(i, v, Value(2)), Value(0)); }},
      {"divisibleby", [](Interpreter& i, const Value& v, CallArgs& a) {
         ArgBinder b(a, "divisibleby", {"num"});
         return PyEquals(Modulo(i, v, b.Get(0)), Value(0));
       }},
      {"lower", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "lower", {}); return PyIsLower(v.Str()); }},
      {"upper", [](Interpreter&, const Value& v, CallArgs& a) { ArgBinder(a, "upper", {}); return PyIsUpper(v.Str()); }},
      {"filter", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "filter", {}); return v.is_string() && i.HasFilter(v.string_value()); }},
      {"test", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder(a, "test", {}); return v.is_string() && i.HasTest(v.string_value()); }},
      {"in", [](Interpreter& i, const Value& v, CallArgs& a) { ArgBinder b(a, "in", {"seq"}); return i.Contains(b.Get(0), v); }},
      {"==", cmp("==")}, {"eq", cmp("==")}, {"equalto", cmp("==")},
      {"!=", cmp("!=")}, {"ne", cmp("!=")},
      {">", cmp(">")}, {"gt", cmp(">")}, {"greaterthan", cmp(">")},
      {">=", cmp(">=")}, {"ge", cmp(">=")},
      {"<", cmp("<")}, {"lt", cmp("<")}, {"lessthan", cmp("<")},
      {"<=", cmp("<=")}, {"le", cmp("<=")},
  };
  return *kTests;
}

}  // namespace

std::optional<Value> BuiltinMethod(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kString:
      return StrMethod(obj, name);
    case Value::Kind::kDict:
      return DictMethod(obj, name);
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return ListMethod(obj, name);
    case Value::Kind::kCallable:
      if (dynamic_cast<LoopObject*>(obj.object()) != nullptr) {
        if (name == "cycle") {
          return Method(obj, name, [](Interpreter&, const Value& self, CallArgs& a) {
            auto* loop = static_cast<LoopObject*>(self.object());
            if (a.args.empty()) TypeError("no items for cycling given");
            return a.args[static_cast<size_t>(loop->index0) % a.args.size()];
          });
        }
        if (name == "changed") {
          return Method(obj, name, [](Interpreter&, const Value& self, CallArgs& a) {
            auto* loop = static_cast<LoopObject*>(self.object());
            const auto same = [&]() {
              if (!loop->last_changed || loop->last_changed->size() != a.args.size()) return false;
              for (size_t k = 0; k < a.args.size(); ++k) {
                if (!PyEquals((*loop->last_changed)[k], a.args[k])) return false;
              }
              return true;
            };
            if (same()) return Value(false);
            loop->last_changed = a.args;
            return Value(true);
          });
        }
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string set;
  const std::u32string* cs = nullptr;
  if (!chars.is_none() && !chars.is_undefined()) {
    set = Decode(NeedStr(chars, "strip arg"));
    cs = &set;
  }
  const std::u32string cps = Decode(s);
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && InChars(cps[b], cs)) ++b;
  }
  if (right) {
    while (e > b && InChars(cps[e - 1], cs)) --e;
  }
  return Encode(cps.substr(b, e - b));
}

std::vector<std::string> PySplit(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string cps = Decode(s);
    size_t i = 0;
    int64_t splits = 0;
    while (true) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        size_t e = cps.size();
        while (e > i && IsPySpace(cps[e - 1])) --e;
        out.push_back(Encode(cps.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      out.push_back(Encode(cps.substr(i, j - i)));
      ++splits;
      i = j;
    }
    return out;
  }
  const std::string& d = NeedStr(sep, "sep");
  if (d.empty()) Fail("empty separator");
  size_t start = 0;
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    const size_t p = s.find(d, start);
    if (p == std::string::npos) break;
    out.push_back(s.substr(start, p - start));
    start = p + d.size();
    ++splits;
  }
  out.push_back(s.substr(start));
  return out;
}

std::vector<std::string> PySplitLines(const std::string& s, bool keepends) {
  const std::u32string cps = Decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (c == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
    out.push_back(Encode(cps.substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < cps.size()) out.push_back(Encode(cps.substr(start)));
  return out;
}

std::string PyReplace(const std::string& s, const std::string& old, const std::string& repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::u32string cps = Decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < cps.size()) AppendUtf8(cps[i], &out);
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + repl;
    start = p + old.size();
    ++n;
  }
  return out + s.substr(start);
}

std::string PyPercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  // CPython treats any non-tuple, non-str argument with __getitem__ (list, dict) as a
  // mapping: then surplus arguments are not an error.
  bool mapping_like = false;
  if (args.kind() == Value::Kind::kTuple) {
    positional = args.list_value();
  } else {
    positional.push_back(args);
    if (args.kind() == Value::Kind::kDict) mapping = &args.dict_value();
    mapping_like = args.kind() == Value::Kind::kDict || args.kind() == Value::Kind::kList ||
                   args.kind() == Value::Kind::kUndefined;
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  const auto take = [&]() -> Value {
    if (next >= positional.size()) TypeError("not enough arguments for format string");
    return positional[next++];
  };
  size_t i = 0;
  while (i < fmt.size()) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i++]);
      continue;
    }
    ++i;
    if (i >= fmt.size()) Fail("incomplete format");
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) Fail("incomplete format key");
      if (mapping == nullptr) {
        if (args.is_undefined()) FailUndefined(args);
        if (args.kind() == Value::Kind::kList) TypeError("list indices must be integers or slices, not str");
        TypeError("format requires a mapping");
      }
      const Value* v = mapping->Find(Value(fmt.substr(i + 1, close - i - 1)));
      if (v == nullptr) Fail(absl::StrCat("KeyError: '", fmt.substr(i + 1, close - i - 1), "'"));
      arg = *v;
      have_arg = used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i]) != nullptr) flags.push_back(fmt[i++]);
    int width = -1, precision = -1;
    if (i < fmt.size() && fmt[i] == '*') {
      width = static_cast<int>(NeedInt(take(), "* width"));
      ++i;
    } else {
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        width = (width < 0 ? 0 : width * 10) + (fmt[i++] - '0');
      }
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        precision = static_cast<int>(NeedInt(take(), "* precision"));
        ++i;
      } else {
        while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) precision = precision * 10 + (fmt[i++] - '0');
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) Fail("incomplete format");
    const char conv = fmt[i++];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = take();
    Spec s;
    s.width = width;
    s.precision = precision;
    s.align = flags.find('-') != std::string::npos ? '<' : '>';
    if (flags.find('+') != std::string::npos) s.sign = '+';
    else if (flags.find(' ') != std::string::npos) s.sign = ' ';
    s.alt = flags.find('#') != std::string::npos;
    const bool zero = flags.find('0') != std::string::npos && s.align != '<';
    std::string body;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        body = conv == 's' ? arg.Str() : arg.Repr();
        if (precision >= 0) body = Encode(Decode(body).substr(0, static_cast<size_t>(precision)));
        s.precision = -1;
        out += Pad(body, s, s.align);
        continue;
      }
      case 'c': {
        if (arg.is_string()) {
          body = arg.string_value();
        } else {
          AppendUtf8(static_cast<char32_t>(NeedInt(arg, "%c")), &body);
        }
        out += Pad(body, s, s.align);
        continue;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        if (!arg.is_number()) {
          if (arg.is_undefined()) FailUndefined(arg);
          TypeError(absl::StrCat("%", std::string(1, conv), " format: a real number is required, not ", arg.TypeName()));
        }
        Value iv = arg.kind() == Value::Kind::kFloat ? Value(static_cast<int64_t>(arg.float_value())) : Value(arg.int_value());
        std::string spec;
        spec += s.sign == '-' ? "" : std::string(1, s.sign);
        if (s.alt) spec += "#";
        if (zero) spec += "0";
        if (width >= 0) spec += std::to_string(width);
        spec += conv == 'i' || conv == 'u' ? 'd' : conv;
        body = FormatValue(iv, spec);
        if (precision > 0) {
          // %.Nd pads the digits with zeros to N.
          const bool neg = iv.int_value() < 0;
          std::string digits = FormatValue(Value(neg ? -iv.int_value() : iv.int_value()), std::string(1, conv == 'i' || conv == 'u' ? 'd' : conv));
          if (static_cast<int>(digits.size()) < precision) digits = std::string(static_cast<size_t>(precision) - digits.size(), '0') + digits;
          body = (neg ? "-" : (s.sign != '-' ? std::string(1, s.sign) : "")) + digits;
          Spec p;
          p.width = width;
          out += Pad(body, p, s.align);
          continue;
        }
        if (s.align == '<') {
          Spec p;
          p.width = width;
          body = FormatValue(iv, spec.substr(0, spec.size() - 1 - (width >= 0 ? std::to_string(width).size() : 0)) + spec.back());
          out += Pad(body, p, '<');
          continue;
        }
        out += body;
        continue;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!arg.is_number()) {
          if (arg.is_undefined()) FailUndefined(arg);
          TypeError(absl::StrCat("must be real number, not ", arg.TypeName()));
        }
        std::string spec;
        spec += s.sign == '-' ? "" : std::string(1, s.sign);
        if (s.alt) spec += "#";
        if (zero) spec += "0";
        if (width >= 0 && s.align != '<') spec += std::to_string(width);
        spec += "." + std::to_string(precision < 0 ? 6 : precision);
        spec += conv;
        body = FormatValue(Value(AsDouble(arg)), spec);
        if (s.align == '<') {
          Spec p;
          p.width = width;
          body = Pad(body, p, '<');
        }
        out += body;
        continue;
      }
      default:
        Fail(absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
    }
  }
  if (!used_mapping && !mapping_like && next < positional.size()) {
    TypeError("not all arguments converted during string formatting");
  }
  return out;
}

std::string PyStrFormat(Interpreter& interp, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  size_t i = 0;
  while (i < fmt.size()) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      Fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    // {field[!conv][:spec]}; nested {} in the spec are expanded.
    size_t j = i + 1;
    int depth = 1;
    while (j < fmt.size() && depth > 0) {
      if (fmt[j] == '{') ++depth;
      if (fmt[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= fmt.size()) Fail("expected '}' before end of string");
    std::string field = fmt.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string spec;
    char conv = 0;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) Fail("expected ':' after conversion specifier");
      conv = field[bang + 1];
      field = field.substr(0, bang);
    }
    if (spec.find('{') != std::string::npos) {
      CallArgs copy = args;
      spec = PyStrFormat(interp, spec, copy);
    }
    // field: name or index, then .attr / [key] parts.
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    const std::string head = field.substr(0, k);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.args.size()) Fail(absl::StrCat("Replacement index ", auto_index, " out of range for positional args tuple"));
      v = args.args[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t idx = std::stoul(head);
      if (idx >= args.args.size()) Fail(absl::StrCat("Replacement index ", idx, " out of range for positional args tuple"));
      v = args.args[idx];
    } else {
      bool found = false;
      for (auto& kv : args.kwargs) {
        if (kv.first == head) v = kv.second, found = true;
      }
      if (!found) Fail(absl::StrCat("KeyError: '", head, "'"));
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = interp.GetAttr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        const size_t e = field.find(']', k);
        if (e == std::string::npos) Fail("Missing ']' in format string");
        const std::string key = field.substr(k + 1, e - k - 1);
        const bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = interp.GetItem(v, digits ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        k = e + 1;
      }
    }
    if (conv == 'r' || conv == 'a') {
      v = Value(v.Repr());
    } else if (conv == 's') {
      v = Value(v.Str());
    } else if (conv != 0) {
      Fail(absl::StrCat("Unknown conversion specifier ", std::string(1, conv)));
    }
    out += FormatValue(v, spec);
  }
  return out;
}

std::string Strftime(const std::string& fmt, const CivilTime& t) {
  // Python pre-processes %f, %z and %Z (naive datetime: empty), then calls the C
  // library's strftime in the C locale.
  std::string f;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      const char k = fmt[i + 1];
      if (k == 'f') {
        char buf[16];
        std::snprintf(buf, sizeof(buf), "%06d", t.microsecond);
        f += buf;
        ++i;
        continue;
      }
      if (k == 'z' || k == 'Z') {
        ++i;
        continue;
      }
      f += fmt.substr(i, 2);
      ++i;
      continue;
    }
    f.push_back(fmt[i]);
  }
  std::tm tm{};
  tm.tm_year = t.year - 1900;
  tm.tm_mon = t.month - 1;
  tm.tm_mday = t.day;
  tm.tm_hour = t.hour;
  tm.tm_min = t.minute;
  tm.tm_sec = t.second;
  tm.tm_isdst = -1;
  // Day of week / year from a days-from-civil computation (proleptic Gregorian).
  const auto days_from_civil = [](int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = static_cast<unsigned>(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + static_cast<int64_t>(doe) - 719468;
  };
  const int64_t days = days_from_civil(t.year, static_cast<unsigned>(t.month), static_cast<unsigned>(t.day));
  tm.tm_wday = static_cast<int>(((days % 7) + 11) % 7);  // 1970-01-01 was a Thursday
  tm.tm_yday = static_cast<int>(days - days_from_civil(t.year, 1, 1));
  if (f.empty()) return "";
  for (size_t cap = 256 + f.size() * 4; cap < (1u << 20); cap *= 4) {
    std::string buf(cap, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
  }
  return "";
}

bool Interpreter::HasFilter(const std::string& name) { return Filters().count(name) > 0 || name == "d" || name == "e"; }
bool Interpreter::HasTest(const std::string& name) { return Tests().count(name) > 0; }

Value Interpreter::CallFilter(const std::string& name, const Value& value, CallArgs& args) {
  const std::string& key = name == "d" ? std::string("default") : name == "e" ? std::string("escape") : name;
  auto it = Filters().find(key);
  if (it == Filters().end()) Fail(absl::StrCat("No filter named '", name, "'."));
  return it->second(*this, value, args);
}

bool Interpreter::CallTest(const std::string& name, const Value& value, CallArgs& args) {
  auto it = Tests().find(name);
  if (it == Tests().end()) Fail(absl::StrCat("No test named '", name, "'."));
  return it->second(*this, value, args);
}

void Interpreter::AddGlobals(Scope* scope) {
  scope->Set("range", Callable("<class 'range'>", [](Interpreter&, CallArgs& a) {
    if (!a.kwargs.empty()) TypeError("range() takes no keyword arguments");
    if (a.args.empty() || a.args.size() > 3) {
      TypeError(absl::StrCat("range expected at most 3 arguments, got ", a.args.size()));
    }
    int64_t start = 0, stop, step = 1;
    if (a.args.size() == 1) {
      stop = NeedInt(a.args[0], "range");
    } else {
      start = NeedInt(a.args[0], "range");
      stop = NeedInt(a.args[1], "range");
      if (a.args.size() == 3) step = NeedInt(a.args[2], "range");
    }
    if (step == 0) Fail("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 100000) {
        Fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      }
      out.emplace_back(i);
    }
    return Value::MakeList(std::move(out));
  }));
  scope->Set("dict", Callable("<class 'dict'>", [](Interpreter& interp, CallArgs& a) {
    Dict d;
    if (a.args.size() > 1) TypeError("dict expected at most 1 argument");
    if (a.args.size() == 1) {
      if (a.args[0].kind() == Value::Kind::kDict) {
        d = a.args[0].dict_value();
      } else {
        for (const Value& pair : interp.Iterate(a.args[0])) {
          std::vector<Value> kv = interp.Iterate(pair);
          if (kv.size() != 2) Fail("dictionary update sequence element has the wrong length; 2 is required");
          d.Set(kv[0], kv[1]);
        }
      }
    }
    for (auto& kv : a.kwargs) d.Set(Value(kv.first), kv.second);
    return Value::MakeDict(std::move(d));
  }));
  scope->Set("namespace", Callable("<class 'jinja2.utils.Namespace'>", [](Interpreter& interp, CallArgs& a) {
    auto ns = std::make_shared<NamespaceObject>();
    interp.TrackNamespace(ns);
    if (a.args.size() > 1) TypeError("namespace expected at most 1 argument");
    if (a.args.size() == 1) {
      if (a.args[0].kind() == Value::Kind::kDict) {
        ns->attrs = a.args[0].dict_value();
      } else {
        for (const Value& pair : interp.Iterate(a.args[0])) {
          std::vector<Value> kv = interp.Iterate(pair);
          if (kv.size() != 2) Fail("dictionary update sequence element has the wrong length; 2 is required");
          ns->attrs.Set(kv[0], kv[1]);
        }
      }
    }
    for (auto& kv : a.kwargs) ns->attrs.Set(Value(kv.first), kv.second);
    return Value::FromObject(Value::Kind::kNamespace, ns);
  }));
  scope->Set("joiner", Callable("<class 'jinja2.utils.Joiner'>", [](Interpreter&, CallArgs& a) {
    ArgBinder b(a, "joiner", {"sep"});
    const std::string sep = b.Get(0, Value(", ")).Str();
    auto used = std::make_shared<bool>(false);
    return Callable("<jinja2.utils.Joiner object>", [sep, used](Interpreter&, CallArgs&) {
      if (!*used) {
        *used = true;
        return Value("");
      }
      return Value(sep);
    });
  }));
  scope->Set("raise_exception", Callable("<function raise_exception>", [](Interpreter&, CallArgs& a) -> Value {
    ArgBinder b(a, "raise_exception", {"message"});
    if (!b.Has(0)) TypeError("raise_exception() missing 1 required positional argument: 'message'");
    throw TemplateError{b.Get(0).Str(), TemplateError::kUnknown, /*raised=*/true};
  }));
  scope->Set("strftime_now", Callable("<function strftime_now>", [](Interpreter& interp, CallArgs& a) {
    ArgBinder b(a, "strftime_now", {"format"});
    if (!b.Has(0)) TypeError("strftime_now() missing 1 required positional argument: 'format'");
    const std::string& fmt = NeedStr(b.Get(0), "strftime() argument 1");
    CivilTime now;
    if (interp.options().now) {
      now = interp.options().now();
    } else {
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      now = CivilTime{tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, 0};
    }
    return Value(Strftime(fmt, now));
  }));
}

}  // namespace echokv::jinja::internal
