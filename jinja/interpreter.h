// Internal: the tree-walking evaluator. It reproduces what Jinja2's compiled Python
// does in the environment transformers uses (ImmutableSandboxedEnvironment,
// Undefined as the undefined type, autoescape off): scoping (a for body gets a fresh
// scope per iteration, macros see their defining scope live, `if` has no scope),
// the sandbox's attribute / item lookup order, one-shot generators, and the Python
// operators. Errors are thrown as TemplateError and turned into a Status by
// Template::Render; nothing throws past the library.
#ifndef ECHOKV_JINJA_INTERPRETER_H_
#define ECHOKV_JINJA_INTERPRETER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/object.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace echokv::jinja::internal {

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* Lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
      auto it = s->vars_.find(name);
      if (it != s->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void Set(const std::string& name, Value v) { vars_[name] = std::move(v); }
  void Clear() { vars_.clear(); }

 private:
  std::shared_ptr<Scope> parent_;                // enclosing scope (null at the root)
  std::unordered_map<std::string, Value> vars_;  // this scope's variables
};
using ScopePtr = std::shared_ptr<Scope>;

// The `loop` variable of a for loop.
class LoopObject : public Object {
 public:
  std::string Repr() const override;
  std::string TypeName() const override { return "LoopContext"; }
  std::vector<Value> items;  // every item of the (filtered) loop
  int64_t index0 = 0;        // the current iteration
  std::optional<std::vector<Value>> last_changed;  // loop.changed()'s memory
};

// Positional / keyword argument binding for builtins (Python's signature rules):
//   ArgBinder b(args, "round", {"precision", "method"});
//   int64_t precision = b.Get(0, Value(0)) ...
class ArgBinder {
 public:
  ArgBinder(CallArgs& args, std::string func, std::vector<std::string> names);
  // The value of parameter `i`, or `fallback` when not passed.
  Value Get(size_t i, const Value& fallback = Value()) const;
  bool Has(size_t i) const { return values_[i].has_value(); }

 private:
  std::vector<std::optional<Value>> values_;  // per parameter
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}
  // Clears the scopes macros closed over, breaking the scope -> macro -> scope cycles.
  ~Interpreter() {
    for (const ScopePtr& s : macro_scopes_) s->Clear();
    for (const auto& ns : namespaces_) ns->attrs = Dict();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `body` into `out` in `scope`.
  void Render(const Body& body, const ScopePtr& scope, std::string* out);

  Value Eval(const Expr& e, const ScopePtr& scope);
  Value CallValue(const Value& callee, CallArgs& args);
  Value CallFilter(const std::string& name, const Value& value, CallArgs& args);
  bool CallTest(const std::string& name, const Value& value, CallArgs& args);
  static bool HasFilter(const std::string& name);
  static bool HasTest(const std::string& name);

  // env.getattr / env.getitem of the sandbox.
  Value GetAttr(const Value& obj, const std::string& name);
  Value GetItem(const Value& obj, const Value& key);
  // Python iter(): the items (consuming a generator); TypeError for non-iterables.
  std::vector<Value> Iterate(const Value& v);
  // Python len(); TypeError when there is none.
  int64_t Length(const Value& v);
  // Python's < / > ... : -1, 0, 1; TypeError for unorderable types.
  int Compare(const Value& a, const Value& b, const char* op);
  bool Contains(const Value& container, const Value& item);
  Value Binary(const std::string& op, const Value& a, const Value& b);

  const RenderOptions& options() const { return options_; }
  // Namespaces are cleared at the end of the render (they may hold themselves).
  void TrackNamespace(std::shared_ptr<NamespaceObject> ns) { namespaces_.push_back(std::move(ns)); }
  // Builtin globals (range, dict, namespace, raise_exception, strftime_now, ...).
  static void AddGlobals(Scope* scope);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow Exec(const Body& body, const ScopePtr& scope, std::string* out);
  Flow ExecStmt(const Stmt& s, const ScopePtr& scope, std::string* out);
  Value EvalInner(const Expr& e, const ScopePtr& scope);
  void Assign(const Target& t, const Value& v, const ScopePtr& scope);
  Flow ExecFor(const Stmt& s, const ScopePtr& scope, std::string* out);
  Value MakeMacro(const std::string& name, std::shared_ptr<const MacroSignature> sig, const Body* body,
                  const ScopePtr& scope);
  CallArgs EvalArgs(const Expr& e, const ScopePtr& scope);

  const RenderOptions& options_;  // clock for strftime_now
  int depth_ = 0;                 // macro call depth (recursion guard)
  bool as_const_ = false;         // evaluating a compile-time constant output
  std::vector<ScopePtr> macro_scopes_;  // scopes a macro closes over (see ~Interpreter)
  std::vector<std::shared_ptr<NamespaceObject>> namespaces_;  // every namespace() made
};

// Python's hash() precondition: TypeError "unhashable type: 'list'" for lists,
// dicts, namespaces and tuples holding any of them.
void CheckHashable(const Value& v);

// "'dict object'"-style name Jinja uses in undefined messages.
std::string ObjectTypeRepr(const Value& v);
[[noreturn]] void FailUndefined(const Value& undefined);

// Python string helpers used by filters and methods.
std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right);
std::vector<std::string> PySplit(const std::string& s, const Value& sep, int64_t maxsplit);
std::vector<std::string> PySplitLines(const std::string& s, bool keepends);
std::string PyReplace(const std::string& s, const std::string& old, const std::string& repl,
                      int64_t count);
std::string PyPercentFormat(const std::string& fmt, const Value& args);
std::string PyStrFormat(Interpreter& interp, const std::string& fmt, CallArgs& args);
std::string Strftime(const std::string& fmt, const CivilTime& t);

// Methods of str / dict / list values (as bound callables), or undefined when the
// type has no such attribute; `unsafe` marks methods the immutable sandbox forbids.
std::optional<Value> BuiltinMethod(const Value& obj, const std::string& name);

}  // namespace echokv::jinja::internal

#endif  // ECHOKV_JINJA_INTERPRETER_H_
