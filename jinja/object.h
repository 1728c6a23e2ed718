// Internal: the mutable / opaque objects a Value can point to (namespace(), one-shot
// generators, callables) and the error type the interpreter throws internally (it
// never leaves the library: Template::Render turns it into an absl::Status).
#ifndef ECHOKV_JINJA_OBJECT_H_
#define ECHOKV_JINJA_OBJECT_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace echokv::jinja::internal {

class Object {
 public:
  virtual ~Object() = default;
  virtual std::string Repr() const = 0;
  virtual std::string TypeName() const = 0;
};

// namespace(...): attributes in insertion order, changed by `set ns.attr = value`.
class NamespaceObject : public Object {
 public:
  std::string Repr() const override;
  std::string TypeName() const override { return "Namespace"; }
  Dict attrs;  // string keys
};

// A Python generator: iterating it consumes it (a second loop sees nothing).
class GeneratorObject : public Object {
 public:
  // `name`: the generator function (repr "<generator object NAME>"), or with `plain`
  // an iterator type (repr "<NAME object>", e.g. list_reverseiterator). Python adds
  // " at 0x..." to both; the differential tests strip that.
  GeneratorObject(std::vector<Value> items, std::string name, bool plain = false)
      : items_(std::move(items)), name_(std::move(name)), plain_(plain) {}
  std::string Repr() const override {
    return plain_ ? "<" + name_ + " object>" : "<generator object " + name_ + ">";
  }
  std::string TypeName() const override { return plain_ ? name_ : "generator"; }
  // Takes every item not consumed yet.
  std::vector<Value> TakeAll() {
    std::vector<Value> rest(items_.begin() + static_cast<std::ptrdiff_t>(pos_), items_.end());
    pos_ = items_.size();
    return rest;
  }
  // Takes the next item; false when exhausted.
  bool Next(Value* out) {
    if (pos_ >= items_.size()) return false;
    *out = items_[pos_++];
    return true;
  }

 private:
  std::vector<Value> items_;  // every item the generator yields
  size_t pos_ = 0;            // items_[..pos_) have been consumed
  std::string name_;          // the producing function or iterator type, for repr
  bool plain_ = false;        // an iterator type rather than a generator function
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

class Interpreter;

// Anything a template can call. `fn` gets the interpreter (macros render with it).
class CallableObject : public Object {
 public:
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  CallableObject(std::string repr, std::string type_name, Fn fn)
      : repr_(std::move(repr)), type_name_(std::move(type_name)), fn_(std::move(fn)) {}
  std::string Repr() const override { return repr_; }
  std::string TypeName() const override { return type_name_; }
  Value Call(Interpreter& interp, CallArgs& args) const { return fn_(interp, args); }

 private:
  std::string repr_;       // what str() prints
  std::string type_name_;  // Python's type name
  Fn fn_;                  // the behaviour
};

// The internal error: a message, the template position and whether the template
// raised it on purpose (raise_exception). Thrown inside the interpreter only.
struct TemplateError {
  static constexpr size_t kUnknown = static_cast<size_t>(-1);
  std::string message;
  size_t offset = kUnknown;  // source byte offset; kUnknown until a node claims it
  bool raised = false;       // from raise_exception(msg)
};

[[noreturn]] void Fail(std::string message);

}  // namespace echokv::jinja::internal

#endif  // ECHOKV_JINJA_OBJECT_H_
