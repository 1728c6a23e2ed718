// The values a Jinja template computes with, with the Python semantics chat templates
// depend on: undefined vs None, int vs float (and bool as an int), dicts in insertion
// order, tuples apart from lists, str()/repr() formatting of lists, dicts and floats,
// Python equality (1 == 1.0 == True) and ordering, and json.dumps as transformers'
// `tojson` filter calls it. Lists and dicts are immutable and shared (the sandbox
// transformers uses forbids mutating them); namespaces and generators are the only
// mutable objects and have reference semantics, as in Python.
//
//   Value msgs = Value::FromJson(nlohmann::json::parse(R"([{"role": "user"}])")).value();
//   Value ctx = Value::MakeDict({{"messages", msgs}, {"bos_token", Value("<s>")}});
//   std::string s = msgs.Str();   // "[{'role': 'user'}]", as Python's str() prints it
//   absl::StatusOr<std::string> j = ToJson(msgs, JsonOptions{});   // '[{"role": "user"}]'
#ifndef ECHOKV_JINJA_VALUE_H_
#define ECHOKV_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace echokv::jinja {

namespace internal {
class Object;  // namespaces, generators, callables (interpreter.cc)
}  // namespace internal

class Value;

// An insertion-ordered dict. Keys are compared with Python equality (so 1, 1.0 and
// True are one key); lookups are linear, which is what template-sized dicts need.
class Dict {
 public:
  const Value* Find(const Value& key) const;
  // Replaces the value of an existing key (keeping its position) or appends.
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<Value, Value>> items_;  // in insertion order
};

class Value {
 public:
  enum class Kind {
    kUndefined,  // a missing variable / attribute: prints "", false, iterates empty
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,     // UTF-8; lengths, indices and slices count code points
    kList,
    kTuple,
    kDict,
    kNamespace,  // namespace(): the one object `set ns.attr = ...` may change
    kGenerator,  // a one-shot iterator (select, map, items, ... return these)
    kCallable,   // macros, globals, bound methods, loop.cycle
  };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::kBool), b_(b) {}                          // NOLINT
  Value(int i) : kind_(Kind::kInt), i_(i) {}                            // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), i_(i) {}                        // NOLINT
  Value(double d) : kind_(Kind::kFloat), f_(d) {}                       // NOLINT
  Value(std::string s);                                                 // NOLINT
  Value(absl::string_view s) : Value(std::string(s)) {}                 // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                       // NOLINT

  // `hint` says what was missing ("'x' is undefined"); used in error messages.
  static Value Undefined(std::string hint = "");
  static Value None();
  static Value MakeList(std::vector<Value> items);
  static Value MakeTuple(std::vector<Value> items);
  static Value MakeDict(Dict dict);
  // String keys in the given order.
  static Value MakeDict(std::vector<std::pair<std::string, Value>> items);
  static Value FromObject(Value::Kind kind, std::shared_ptr<internal::Object> object);

  // JSON -> Value. Only ordered_json keeps object keys in document order (plain
  // nlohmann::json sorts them, which would change what tojson prints), so that is the
  // type taken here. Integers beyond int64 and invalid UTF-8 are InvalidArgument.
  static absl::StatusOr<Value> FromOrderedJson(const nlohmann::ordered_json& json);
  // Parses JSON text keeping object key order. InvalidArgument on bad JSON.
  static absl::StatusOr<Value> FromJsonText(absl::string_view text);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  // list or tuple
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }  // kInt, kBool
  double float_value() const { return f_; }
  // kString, or kUndefined (its hint).
  const std::string& string_value() const;
  const std::vector<Value>& list_value() const;  // kList, kTuple
  const Dict& dict_value() const;                // kDict
  internal::Object* object() const { return object_.get(); }
  const std::shared_ptr<internal::Object>& shared_object() const { return object_; }

  // Python truthiness (undefined and None are false; generators and callables true).
  bool Truthy() const;
  // Python str(): strings as is, None -> "None", undefined -> "", floats as repr.
  std::string Str() const;
  // Python repr() (strings quoted and escaped as Python does).
  std::string Repr() const;
  // Python's type name ("str", "int", "dict", "NoneType", ...), for error messages.
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;          // kString; kUndefined: the hint
  std::shared_ptr<const std::vector<Value>> list_;  // kList, kTuple
  std::shared_ptr<const Dict> dict_;               // kDict
  std::shared_ptr<internal::Object> object_;       // kNamespace, kGenerator, kCallable
};

// Python ==. Lists vs tuples are unequal; dicts compare as unordered maps; undefined
// equals only undefined; objects compare by identity.
bool PyEquals(const Value& a, const Value& b);

// Python float repr: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf".
std::string FloatRepr(double d);

// json.dumps(value, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
struct JsonOptions {
  bool ensure_ascii = false;
  // nullopt: one line. Otherwise the indent string (an int n means n spaces).
  std::optional<std::string> indent;
  // nullopt: Python's defaults (", " and ": ", or "," and ": " when indented).
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
// InvalidArgument for values JSON cannot hold (undefined, callables, generators,
// namespaces) and for sort_keys over keys of mixed types, as json.dumps raises.
absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options);

}  // namespace echokv::jinja

#endif  // ECHOKV_JINJA_VALUE_H_
