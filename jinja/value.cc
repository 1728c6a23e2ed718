#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "jinja/object.h"
#include "jinja/unicode.h"
#include "nlohmann/json.hpp"

namespace echokv::jinja {
namespace {

const std::string& EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}
const std::vector<Value>& EmptyList() {
  static const std::vector<Value>* const kEmpty = new std::vector<Value>();
  return *kEmpty;
}
const Dict& EmptyDict() {
  static const Dict* const kEmpty = new Dict();
  return *kEmpty;
}

void AppendHex(std::string* out, const char* prefix, unsigned value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s%0*x", prefix, digits, value);
  out->append(buf);
}

// Python's repr() of a str.
std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : internal::Decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < ' ' || c == 0x7F) {
      AppendHex(&out, "\\x", c, 2);
    } else if (c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (internal::IsPrintable(c)) {
      internal::AppendUtf8(c, &out);
    } else if (c <= 0xFF) {
      AppendHex(&out, "\\x", c, 2);
    } else if (c <= 0xFFFF) {
      AppendHex(&out, "\\u", c, 4);
    } else {
      AppendHex(&out, "\\U", c, 8);
    }
  }
  out.push_back(quote);
  return out;
}

bool IsNumeric(const Value& v) {
  return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kFloat ||
         v.kind() == Value::Kind::kBool;
}

// json.dumps's string encoder.
void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t c : internal::Decode(s)) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          AppendHex(out, "\\u", c, 4);
        } else if (ensure_ascii && c > 0x7E) {
          if (c == 0x7F) {
            out->push_back(static_cast<char>(c));
          } else if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            AppendHex(out, "\\u", 0xD800 | (v >> 10), 4);
            AppendHex(out, "\\u", 0xDC00 | (v & 0x3FF), 4);
          } else {
            AppendHex(out, "\\u", c, 4);
          }
        } else {
          internal::AppendUtf8(c, out);
        }
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return FloatRepr(d);
}

// Python's ordering of json.dumps's sort_keys: -1, 0, 1, or nullopt when the key
// types cannot be ordered (TypeError in Python).
std::optional<int> CompareKeys(const Value& a, const Value& b) {
  if (a.is_string() && b.is_string()) {
    const int c = a.string_value().compare(b.string_value());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (IsNumeric(a) && IsNumeric(b)) {
    const double x = a.kind() == Value::Kind::kFloat ? a.float_value() : static_cast<double>(a.int_value());
    const double y = b.kind() == Value::Kind::kFloat ? b.float_value() : static_cast<double>(b.int_value());
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) {
      return a.int_value() < b.int_value() ? -1 : (a.int_value() > b.int_value() ? 1 : 0);
    }
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  return std::nullopt;
}

absl::Status JsonValue(const Value& v, const JsonOptions& o, int level, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      *out += JsonFloat(v.float_value());
      return absl::OkStatus();
    case Value::Kind::kString:
      JsonString(v.string_value(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kDict:
      break;
    case Value::Kind::kUndefined:
    case Value::Kind::kNamespace:
    case Value::Kind::kGenerator:
    case Value::Kind::kCallable:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", v.TypeName(), " is not JSON serializable"));
  }
  const std::string item_sep =
      o.separators ? o.separators->first : (o.indent ? std::string(",") : std::string(", "));
  const std::string key_sep = o.separators ? o.separators->second : std::string(": ");
  std::string newline_indent, close_indent;
  if (o.indent) {
    newline_indent = "\n";
    for (int i = 0; i <= level; ++i) newline_indent += *o.indent;
    close_indent = "\n";
    for (int i = 0; i < level; ++i) close_indent += *o.indent;
  }
  if (v.kind() != Value::Kind::kDict) {
    const std::vector<Value>& items = v.list_value();
    if (items.empty()) {
      *out += "[]";
      return absl::OkStatus();
    }
    out->push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      *out += i == 0 ? newline_indent : item_sep + newline_indent;
      absl::Status s = JsonValue(items[i], o, level + 1, out);
      if (!s.ok()) return s;
    }
    *out += close_indent;
    out->push_back(']');
    return absl::OkStatus();
  }
  std::vector<const std::pair<Value, Value>*> items;
  for (const auto& kv : v.dict_value().items()) items.push_back(&kv);
  if (items.empty()) {
    *out += "{}";
    return absl::OkStatus();
  }
  if (o.sort_keys) {
    // Insertion sort keeps this simple and stable; the error mirrors Python's.
    for (size_t i = 1; i < items.size(); ++i) {
      for (size_t j = i; j > 0; --j) {
        std::optional<int> c = CompareKeys(items[j - 1]->first, items[j]->first);
        if (!c) {
          return absl::InvalidArgumentError(absl::StrCat(
              "'<' not supported between instances of '", items[j]->first.TypeName(), "' and '",
              items[j - 1]->first.TypeName(), "'"));
        }
        if (*c <= 0) break;
        std::swap(items[j - 1], items[j]);
      }
    }
  }
  out->push_back('{');
  bool first = true;
  for (const auto* kv : items) {
    *out += first ? newline_indent : item_sep + newline_indent;
    first = false;
    const Value& k = kv->first;
    switch (k.kind()) {
      case Value::Kind::kString:
        JsonString(k.string_value(), o.ensure_ascii, out);
        break;
      case Value::Kind::kInt:
        *out += "\"" + std::to_string(k.int_value()) + "\"";
        break;
      case Value::Kind::kFloat:
        *out += "\"" + JsonFloat(k.float_value()) + "\"";
        break;
      case Value::Kind::kBool:
        *out += k.bool_value() ? "\"true\"" : "\"false\"";
        break;
      case Value::Kind::kNone:
        *out += "\"null\"";
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "keys must be str, int, float, bool or None, not ", k.TypeName()));
    }
    *out += key_sep;
    absl::Status s = JsonValue(kv->second, o, level + 1, out);
    if (!s.ok()) return s;
  }
  *out += close_indent;
  out->push_back('}');
  return absl::OkStatus();
}

}  // namespace

namespace internal {
std::string NamespaceObject::Repr() const { return "<Namespace " + Value::MakeDict(attrs).Repr() + ">"; }
void Fail(std::string message) { throw TemplateError{std::move(message)}; }
}  // namespace internal

const Value* Dict::Find(const Value& key) const {
  if (key.is_string()) {
    for (const auto& kv : items_) {
      if (kv.first.is_string() && kv.first.string_value() == key.string_value()) return &kv.second;
    }
    return nullptr;
  }
  for (const auto& kv : items_) {
    if (PyEquals(kv.first, key)) return &kv.second;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& kv : items_) {
    if (PyEquals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

Value::Value(std::string s)
    : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::Undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::MakeList(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}

Value Value::MakeTuple(std::vector<Value> items) {
  Value v = MakeList(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

Value Value::MakeDict(std::vector<std::pair<std::string, Value>> items) {
  Dict d;
  for (auto& kv : items) d.Set(Value(std::move(kv.first)), std::move(kv.second));
  return MakeDict(std::move(d));
}

Value Value::FromObject(Kind kind, std::shared_ptr<internal::Object> object) {
  Value v;
  v.kind_ = kind;
  v.object_ = std::move(object);
  return v;
}

absl::StatusOr<Value> Value::FromOrderedJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat("integer ", u, " is beyond 64 bits"));
      }
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      size_t bad = 0;
      if (!internal::IsValidUtf8(s, &bad)) {
        return absl::InvalidArgumentError(absl::StrCat("invalid UTF-8 at byte ", bad, " of a string"));
      }
      return Value(s);
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        absl::StatusOr<Value> v = FromOrderedJson(e);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) {
        absl::StatusOr<Value> v = FromOrderedJson(it.value());
        if (!v.ok()) return v.status();
        size_t bad = 0;
        if (!internal::IsValidUtf8(it.key(), &bad)) {
          return absl::InvalidArgumentError("invalid UTF-8 in an object key");
        }
        d.Set(Value(it.key()), *std::move(v));
      }
      return MakeDict(std::move(d));
    }
    case nlohmann::ordered_json::value_t::binary:
    case nlohmann::ordered_json::value_t::discarded:
      break;
  }
  return absl::InvalidArgumentError("unsupported JSON value");
}

absl::StatusOr<Value> Value::FromJsonText(absl::string_view text) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr,
                                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("invalid JSON");
  return FromOrderedJson(j);
}

const std::string& Value::string_value() const { return s_ ? *s_ : EmptyString(); }
const std::vector<Value>& Value::list_value() const { return list_ ? *list_ : EmptyList(); }
const Dict& Value::dict_value() const { return dict_ ? *dict_ : EmptyDict(); }

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !string_value().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !list_value().empty();
    case Kind::kDict:
      return dict_value().size() != 0;
    case Kind::kNamespace:
    case Kind::kGenerator:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return string_value();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return StringRepr(string_value());
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = kind_ == Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      const std::vector<Value>& items = list_value();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += items[i].Repr();
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : dict_value().items()) {
        if (!first) out += ", ";
        first = false;
        out += kv.first.Repr() + ": " + kv.second.Repr();
      }
      return out + "}";
    }
    case Kind::kNamespace:
    case Kind::kGenerator:
    case Kind::kCallable:
      return object_->Repr();
  }
  return "";
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace:
    case Kind::kGenerator:
    case Kind::kCallable:
      return object_->TypeName();
  }
  return "object";
}

bool PyEquals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (IsNumeric(a) && IsNumeric(b)) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) {
      const double x = a.kind() == K::kFloat ? a.float_value() : static_cast<double>(a.int_value());
      const double y = b.kind() == K::kFloat ? b.float_value() : static_cast<double>(b.int_value());
      return x == y;
    }
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.string_value() == b.string_value();
    case K::kList:
    case K::kTuple: {
      const auto& x = a.list_value();
      const auto& y = b.list_value();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!PyEquals(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      const Dict& x = a.dict_value();
      const Dict& y = b.dict_value();
      if (x.size() != y.size()) return false;
      for (const auto& kv : x.items()) {
        const Value* other = y.Find(kv.first);
        if (other == nullptr || !PyEquals(kv.second, *other)) return false;
      }
      return true;
    }
    default:
      return a.object() == b.object();
  }
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "d.ddde[+-]x".
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return out + eb;
  }
  std::string out;
  if (exp >= 0) {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  } else {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  }
  return sign + out;
}

absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  absl::Status s = JsonValue(value, options, 0, &out);
  if (!s.ok()) return s;
  return out;
}

}  // namespace echokv::jinja
