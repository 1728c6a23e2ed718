#include "jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "jinja/unicode.h"

namespace echokv::jinja::internal {
namespace {

constexpr int kMaxCallDepth = 100;  // macro recursion guard (bounds the C++ stack)

bool IsNum(const Value& v) { return v.is_number(); }
bool IsIntLike(const Value& v) { return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool; }
double AsDouble(const Value& v) {
  return v.kind() == Value::Kind::kFloat ? v.float_value() : static_cast<double>(v.int_value());
}

[[noreturn]] void TypeError(std::string message) { Fail(std::move(message)); }

[[noreturn]] void Unsupported(const std::string& op, const Value& a, const Value& b) {
  TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(), "' and '",
                         b.TypeName(), "'"));
}

Value CheckedInt(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    Fail("integer result beyond 64 bits (not supported)");
  }
  return Value(static_cast<int64_t>(v));
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t FloorMod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// CPython's float_divmod, floor part.
double PyFloatFloorDiv(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) div -= 1.0;
  }
  if (div != 0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::copysign(0.0, vx / wx);
}

double PyFloatMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}

// Upper bound on what `seq * n` may build (elements, or bytes of a string): templates
// render prompts, far below it; a template's `'ab' * 9000000000000` is an error, not a
// loop that runs for hours or exhausts memory (found reading the fuzzing results).
constexpr int64_t kMaxRepeatSize = int64_t{16} << 20;

Value Repeat(const Value& seq, int64_t n) {
  const int64_t unit = seq.is_string() ? static_cast<int64_t>(seq.string_value().size())
                                       : static_cast<int64_t>(seq.list_value().size());
  if (n <= 0 || unit == 0) n = 0;  // Python: an empty result (no loop over a huge n)
  if (n > 0 && unit > kMaxRepeatSize / n) {
    Fail(absl::StrCat("repeating a sequence of ", unit, " ", n, " times exceeds the template limit of ",
                      kMaxRepeatSize, " elements"));
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.string_value();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) {
    out.insert(out.end(), seq.list_value().begin(), seq.list_value().end());
  }
  return seq.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
}

// Python slice index normalisation (slice.indices).
void SliceIndices(int64_t len, const Value& start_v, const Value& stop_v, const Value& step_v,
                  int64_t* start, int64_t* stop, int64_t* step) {
  const auto as_int = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!IsIntLike(v)) TypeError("slice indices must be integers or None or have an __index__ method");
    return v.int_value();
  };
  const std::optional<int64_t> st = as_int(step_v);
  *step = st.value_or(1);
  if (*step == 0) Fail("slice step cannot be zero");
  const std::optional<int64_t> a = as_int(start_v), b = as_int(stop_v);
  const auto adjust = [&](std::optional<int64_t> v, bool is_start) -> int64_t {
    if (!v) {
      if (*step > 0) return is_start ? 0 : len;
      return is_start ? len - 1 : -1;
    }
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = *step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = *step < 0 ? len - 1 : len;
    }
    return x;
  };
  *start = adjust(a, true);
  *stop = adjust(b, false);
}

std::vector<int64_t> SliceRange(int64_t len, const Value& a, const Value& b, const Value& c) {
  int64_t start, stop, step;
  SliceIndices(len, a, b, c, &start, &stop, &step);
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  }
  return idx;
}

// Jinja's Undefined for an attribute / item that is missing.
Value MissingAttr(const Value& obj, const Value& name) {
  if (!name.is_string()) {
    return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element ", name.Repr()));
  }
  return Value::Undefined(
      absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute ", name.Repr()));
}

}  // namespace

std::string LoopObject::Repr() const {
  return absl::StrCat("<LoopContext ", index0 + 1, "/", items.size(), ">");
}

std::string ObjectTypeRepr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kDict: return "dict object";
    case Value::Kind::kList: return "list object";
    case Value::Kind::kTuple: return "tuple object";
    case Value::Kind::kString: return "str object";
    case Value::Kind::kInt: return "int object";
    case Value::Kind::kFloat: return "float object";
    case Value::Kind::kBool: return "bool object";
    default: return v.TypeName() + " object";
  }
}

void CheckHashable(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      TypeError(absl::StrCat("unhashable type: '", v.TypeName(), "'"));
    case Value::Kind::kTuple:
      for (const Value& i : v.list_value()) CheckHashable(i);
      return;
    default:
      return;
  }
}

void FailUndefined(const Value& undefined) {
  const std::string& hint = undefined.string_value();
  Fail(hint.empty() ? "undefined value" : hint);
}

ArgBinder::ArgBinder(CallArgs& args, std::string func, std::vector<std::string> names)
    : values_(names.size()) {
  if (args.args.size() > names.size()) {
    TypeError(absl::StrCat(func, "() takes at most ", names.size(), " argument(s) (", args.args.size(),
                           " given)"));
  }
  for (size_t i = 0; i < args.args.size(); ++i) values_[i] = args.args[i];
  for (auto& kv : args.kwargs) {
    size_t i = 0;
    while (i < names.size() && names[i] != kv.first) ++i;
    if (i == names.size()) {
      TypeError(absl::StrCat(func, "() got an unexpected keyword argument '", kv.first, "'"));
    }
    if (values_[i]) TypeError(absl::StrCat(func, "() got multiple values for argument '", kv.first, "'"));
    values_[i] = kv.second;
  }
}

Value ArgBinder::Get(size_t i, const Value& fallback) const {
  return values_[i] ? *values_[i] : fallback;
}

void Interpreter::Render(const Body& body, const ScopePtr& scope, std::string* out) {
  Exec(body, scope, out);
}

Interpreter::Flow Interpreter::Exec(const Body& body, const ScopePtr& scope, std::string* out) {
  for (const StmtPtr& s : body) {
    Flow f = ExecStmt(*s, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecStmt(const Stmt& s, const ScopePtr& scope, std::string* out) {
  try {
    switch (s.kind) {
      case Stmt::Kind::kData:
        *out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        if (s.const_output) {
          // Jinja folded this at compile time; if folding fails it runs as usual.
          as_const_ = true;
          try {
            std::string text = Eval(*s.expr, scope).Str();
            as_const_ = false;
            *out += text;
            return Flow::kNormal;
          } catch (const TemplateError&) {
            as_const_ = false;
          }
        }
        *out += Eval(*s.expr, scope).Str();
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        return Exec(Eval(*s.expr, scope).Truthy() ? s.body : s.else_body, scope, out);
      case Stmt::Kind::kFor:
        return ExecFor(s, scope, out);
      case Stmt::Kind::kAssign:
        Assign(s.target, Eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case Stmt::Kind::kAssignBlock: {
        std::string text;
        // break / continue inside the block leave the loop before the assignment,
        // as in Jinja's generated code.
        const Flow f = Exec(s.body, std::make_shared<Scope>(scope), &text);
        if (f != Flow::kNormal) return f;
        Value v(std::move(text));
        if (s.expr) {
          // The filter chain was parsed with a null innermost operand.
          std::vector<const Expr*> chain;
          for (const Expr* f = s.expr.get(); f != nullptr; f = f->a.get()) chain.push_back(f);
          for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
            CallArgs args = EvalArgs(**it, scope);
            v = CallFilter((*it)->name, v, args);
          }
        }
        Assign(s.target, v, scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->Set(s.text, MakeMacro(s.text, s.signature, &s.body, scope));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        Value caller = MakeMacro("caller", s.signature, &s.body, scope);
        const Expr& call = *s.expr;
        Value callee = Eval(*call.a, scope);
        CallArgs args = EvalArgs(call, scope);
        args.kwargs.emplace_back("caller", caller);
        *out += CallValue(callee, args).Str();
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string text;
        const Flow flow = Exec(s.body, std::make_shared<Scope>(scope), &text);
        if (flow != Flow::kNormal) return flow;  // the filtered text is never written
        Value v(std::move(text));
        std::vector<const Expr*> chain;
        for (const Expr* f = s.expr.get(); f != nullptr; f = f->a.get()) chain.push_back(f);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args = EvalArgs(**it, scope);
          v = CallFilter((*it)->name, v, args);
        }
        *out += v.Str();
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        auto inner = std::make_shared<Scope>(scope);
        for (size_t i = 0; i < s.targets.size(); ++i) {
          Assign(s.targets[i], Eval(*s.values[i], scope), inner);
        }
        return Exec(s.body, inner, out);
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope:
        return Exec(s.body, scope, out);
    }
  } catch (TemplateError& e) {
    if (e.offset == TemplateError::kUnknown) e.offset = s.offset;
    throw;
  }
  return Flow::kNormal;
}

void Interpreter::Assign(const Target& t, const Value& v, const ScopePtr& scope) {
  switch (t.kind) {
    case Target::Kind::kName:
      scope->Set(t.name, v);
      return;
    case Target::Kind::kNsAttr: {
      const Value* ns = scope->Lookup(t.name);
      if (ns == nullptr || ns->kind() != Value::Kind::kNamespace) {
        Fail("cannot assign attribute on non-namespace object");
      }
      static_cast<NamespaceObject*>(ns->object())->attrs.Set(Value(t.attr), v);
      return;
    }
    case Target::Kind::kTuple: {
      std::vector<Value> items = Iterate(v);
      if (items.size() != t.items.size()) {
        if (items.size() > t.items.size()) {
          Fail(absl::StrCat("too many values to unpack (expected ", t.items.size(), ")"));
        }
        Fail(absl::StrCat("not enough values to unpack (expected ", t.items.size(), ", got ",
                          items.size(), ")"));
      }
      for (size_t i = 0; i < items.size(); ++i) Assign(t.items[i], items[i], scope);
      return;
    }
  }
}

Interpreter::Flow Interpreter::ExecFor(const Stmt& s, const ScopePtr& scope, std::string* out) {
  std::vector<Value> items;
  try {
    items = Iterate(Eval(*s.expr, scope));
  } catch (TemplateError& e) {
    if (e.offset == TemplateError::kUnknown) e.offset = s.expr->offset;
    throw;
  }
  if (s.test) {
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>(scope);
      Assign(s.target, item, probe);
      if (Eval(*s.test, probe).Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  // Jinja clears its "no iteration" flag at the end of the body, so the else block
  // also runs when every iteration ended in break or continue.
  bool completed = false;
  if (!items.empty()) {
    auto loop = std::make_shared<LoopObject>();
    loop->items = items;
    const Value loop_value = Value::FromObject(Value::Kind::kCallable, loop);
    for (size_t i = 0; i < items.size(); ++i) {
      loop->index0 = static_cast<int64_t>(i);
      auto inner = std::make_shared<Scope>(scope);
      Assign(s.target, items[i], inner);
      inner->Set("loop", loop_value);
      const Flow f = Exec(s.body, inner, out);
      if (f == Flow::kBreak) break;
      if (f == Flow::kNormal) completed = true;
    }
  }
  // The else block belongs to the enclosing loop's body: its break / continue act there.
  if (!completed && !s.else_body.empty()) return Exec(s.else_body, std::make_shared<Scope>(scope), out);
  return Flow::kNormal;
}

Value Interpreter::MakeMacro(const std::string& name, std::shared_ptr<const MacroSignature> sig,
                             const Body* body, const ScopePtr& scope) {
  // The macro keeps its defining scope alive (Jinja closures see it live); that is a
  // reference cycle (scope -> macro -> scope), which ~Interpreter breaks.
  macro_scopes_.push_back(scope);
  auto fn = [name, sig, body, scope](Interpreter& interp, CallArgs& call) -> Value {
    if (interp.depth_ >= kMaxCallDepth) Fail("maximum recursion depth exceeded in macro calls");
    auto inner = std::make_shared<Scope>(scope);
    const size_t n = sig->args.size();
    const size_t first_default = n - sig->defaults.size();
    std::vector<std::pair<std::string, Value>> kwargs = std::move(call.kwargs);
    const auto pop_kwarg = [&](const std::string& key, Value* v) {
      for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
        if (it->first == key) {
          *v = std::move(it->second);
          kwargs.erase(it);
          return true;
        }
      }
      return false;
    };
    bool found_caller = false;
    for (size_t i = 0; i < n; ++i) {
      const std::string& arg = sig->args[i];
      Value v;
      if (i < call.args.size()) {
        v = call.args[i];
      } else if (pop_kwarg(arg, &v)) {
        if (arg == "caller") found_caller = true;
      } else {
        if (arg == "caller") found_caller = true;
        if (i >= first_default) {
          v = interp.Eval(*sig->defaults[i - first_default], inner);
        } else {
          v = Value::Undefined(absl::StrCat("parameter '", arg, "' was not provided"));
        }
      }
      inner->Set(arg, std::move(v));
    }
    if (call.args.size() >= n) {
      found_caller = std::find(sig->args.begin(), sig->args.end(), "caller") != sig->args.end();
    }
    if (sig->caller && !found_caller) {
      Value caller;
      if (!pop_kwarg("caller", &caller)) caller = Value::Undefined("No caller defined");
      inner->Set("caller", caller);
    }
    if (sig->catch_kwargs) {
      Dict d;
      for (auto& kv : kwargs) d.Set(Value(kv.first), kv.second);
      inner->Set("kwargs", Value::MakeDict(std::move(d)));
    } else if (!kwargs.empty()) {
      if (kwargs.front().first == "caller") {
        Fail(absl::StrCat("macro '", name,
                          "' was invoked with two values for the special caller argument. This is "
                          "most likely a bug."));
      }
      Fail(absl::StrCat("macro '", name, "' takes no keyword argument '", kwargs.front().first, "'"));
    }
    if (sig->catch_varargs) {
      std::vector<Value> extra;
      for (size_t i = n; i < call.args.size(); ++i) extra.push_back(call.args[i]);
      inner->Set("varargs", Value::MakeTuple(std::move(extra)));
    } else if (call.args.size() > n) {
      Fail(absl::StrCat("macro '", name, "' takes not more than ", n, " argument(s)"));
    }
    std::string out;
    ++interp.depth_;
    try {
      interp.Exec(*body, inner, &out);
    } catch (...) {
      --interp.depth_;
      throw;
    }
    --interp.depth_;
    return Value(std::move(out));
  };
  return Value::FromObject(Value::Kind::kCallable,
                           std::make_shared<CallableObject>("<Macro '" + name + "'>", "Macro", fn));
}

CallArgs Interpreter::EvalArgs(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  for (const ExprPtr& a : e.items) args.args.push_back(Eval(*a, scope));
  for (const auto& kv : e.kwargs) args.kwargs.emplace_back(kv.first, Eval(*kv.second, scope));
  if (e.dyn_args) {
    for (Value& v : Iterate(Eval(*e.dyn_args, scope))) args.args.push_back(std::move(v));
  }
  if (e.dyn_kwargs) {
    Value d = Eval(*e.dyn_kwargs, scope);
    if (d.kind() != Value::Kind::kDict) TypeError("argument after ** must be a mapping");
    for (const auto& kv : d.dict_value().items()) {
      if (!kv.first.is_string()) TypeError("keywords must be strings");
      args.kwargs.emplace_back(kv.first.string_value(), kv.second);
    }
  }
  return args;
}

Value Interpreter::Eval(const Expr& e, const ScopePtr& scope) {
  try {
    return EvalInner(e, scope);
  } catch (TemplateError& err) {
    if (err.offset == TemplateError::kUnknown) err.offset = e.offset;
    throw;
  }
}

Value Interpreter::EvalInner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case Expr::Kind::kConst:
      return e.value;
    case Expr::Kind::kName: {
      const Value* v = scope->Lookup(e.name);
      if (v == nullptr) return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      return *v;
    }
    case Expr::Kind::kGetattr:
      return GetAttr(Eval(*e.a, scope), e.name);
    case Expr::Kind::kGetitem: {
      Value obj = Eval(*e.a, scope);
      if (e.b->kind == Expr::Kind::kSlice) {
        const Expr& sl = *e.b;
        Value a = sl.a ? Eval(*sl.a, scope) : Value::None();
        Value b = sl.b ? Eval(*sl.b, scope) : Value::None();
        Value c = sl.c ? Eval(*sl.c, scope) : Value::None();
        if (obj.is_undefined()) FailUndefined(obj);
        if (obj.is_string()) {
          const std::u32string cps = Decode(obj.string_value());
          std::u32string out;
          for (int64_t i : SliceRange(static_cast<int64_t>(cps.size()), a, b, c)) out.push_back(cps[i]);
          return Value(Encode(out));
        }
        if (obj.is_sequence()) {
          const auto& items = obj.list_value();
          std::vector<Value> out;
          for (int64_t i : SliceRange(static_cast<int64_t>(items.size()), a, b, c)) out.push_back(items[i]);
          return obj.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out))
                                                   : Value::MakeList(std::move(out));
        }
        // Jinja compiles slices to plain Python subscripts (no sandbox getitem), so
        // anything but str / list / tuple raises - except when it folded the
        // expression at compile time, where the sandbox getitem gave undefined.
        if (as_const_) return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element slice"));
        if (obj.kind() == Value::Kind::kDict) TypeError("unhashable type: 'slice'");
        TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
      }
      return GetItem(obj, Eval(*e.b, scope));
    }
    case Expr::Kind::kSlice:
      Fail("a slice is only valid inside []");
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& i : e.items) items.push_back(Eval(*i, scope));
      return e.kind == Expr::Kind::kList ? Value::MakeList(std::move(items))
                                         : Value::MakeTuple(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = Eval(*e.items[i], scope);
        CheckHashable(k);
        d.Set(std::move(k), Eval(*e.items[i + 1], scope));
      }
      return Value::MakeDict(std::move(d));
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      Value v = Eval(*e.a, scope);
      if (v.is_undefined()) FailUndefined(v);
      if (v.kind() == Value::Kind::kFloat) return Value(e.kind == Expr::Kind::kNeg ? -v.float_value() : v.float_value());
      if (IsIntLike(v)) {
        return e.kind == Expr::Kind::kNeg ? CheckedInt(-static_cast<__int128>(v.int_value()))
                                          : Value(v.int_value());
      }
      TypeError(absl::StrCat("bad operand type for unary ", e.kind == Expr::Kind::kNeg ? "-" : "+",
                             ": '", v.TypeName(), "'"));
    }
    case Expr::Kind::kNot:
      return Value(!Eval(*e.a, scope).Truthy());
    case Expr::Kind::kBinary: {
      if (e.name == "and") {
        Value a = Eval(*e.a, scope);
        return a.Truthy() ? Eval(*e.b, scope) : a;
      }
      if (e.name == "or") {
        Value a = Eval(*e.a, scope);
        return a.Truthy() ? a : Eval(*e.b, scope);
      }
      Value a = Eval(*e.a, scope);
      Value b = Eval(*e.b, scope);
      if (e.negative_const_base && (a.kind() == Value::Kind::kInt || a.kind() == Value::Kind::kFloat) &&
          AsDouble(a) < 0) {
        // Jinja writes a folded negative constant base without parentheses, so
        // Python computes -(|a| ** b) (see Expr::negative_const_base).
        const Value magnitude = a.kind() == Value::Kind::kInt ? Value(-a.int_value()) : Value(-a.float_value());
        const Value r = Binary(e.name, magnitude, b);
        return r.kind() == Value::Kind::kInt ? Value(-r.int_value()) : Value(-r.float_value());
      }
      return Binary(e.name, a, b);
    }
    case Expr::Kind::kConcat: {
      std::string out;
      for (const ExprPtr& i : e.items) out += Eval(*i, scope).Str();
      return Value(std::move(out));
    }
    case Expr::Kind::kCompare: {
      Value left = Eval(*e.a, scope);
      for (const auto& op : e.ops) {
        Value right = Eval(*op.second, scope);
        bool r;
        if (op.first == "==") {
          r = PyEquals(left, right);
        } else if (op.first == "!=") {
          r = !PyEquals(left, right);
        } else if (op.first == "in") {
          r = Contains(right, left);
        } else if (op.first == "notin") {
          r = !Contains(right, left);
        } else {
          const int c = Compare(left, right, op.first.c_str());
          r = op.first == "<" ? c < 0 : op.first == "<=" ? c <= 0 : op.first == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::kCond:
      if (Eval(*e.a, scope).Truthy()) return Eval(*e.b, scope);
      if (e.c) return Eval(*e.c, scope);
      return Value::Undefined("the inline if-expression evaluated to false and no else section was defined.");
    case Expr::Kind::kCall: {
      Value callee = Eval(*e.a, scope);
      CallArgs args = EvalArgs(e, scope);
      return CallValue(callee, args);
    }
    case Expr::Kind::kFilter: {
      Value v = e.a ? Eval(*e.a, scope) : Value();
      CallArgs args = EvalArgs(e, scope);
      return CallFilter(e.name, v, args);
    }
    case Expr::Kind::kTest: {
      Value v = Eval(*e.a, scope);
      CallArgs args = EvalArgs(e, scope);
      return Value(CallTest(e.name, v, args));
    }
  }
  Fail("unknown expression");
}

Value Interpreter::CallValue(const Value& callee, CallArgs& args) {
  if (callee.kind() == Value::Kind::kCallable) {
    if (auto* loop = dynamic_cast<LoopObject*>(callee.object())) {
      (void)loop;
      TypeError("The loop must have the 'recursive' marker to be called recursively.");
    }
    return static_cast<CallableObject*>(callee.object())->Call(*this, args);
  }
  if (callee.is_undefined()) FailUndefined(callee);
  TypeError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
}

Value Interpreter::Binary(const std::string& op, const Value& a, const Value& b) {
  // str % x formats x whatever it is (Undefined prints as "").
  if (op == "%" && a.is_string()) return Value(PyPercentFormat(a.string_value(), b));
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (IsNum(a) && IsNum(b)) {
    const bool ints = IsIntLike(a) && IsIntLike(b);
    const int64_t x = ints ? a.int_value() : 0, y = ints ? b.int_value() : 0;
    const double fx = AsDouble(a), fy = AsDouble(b);
    if (op == "+") return ints ? CheckedInt(static_cast<__int128>(x) + y) : Value(fx + fy);
    if (op == "-") return ints ? CheckedInt(static_cast<__int128>(x) - y) : Value(fx - fy);
    if (op == "*") return ints ? CheckedInt(static_cast<__int128>(x) * y) : Value(fx * fy);
    if (op == "/") {
      if (fy == 0) Fail(ints ? "division by zero" : "float division by zero");
      return Value(ints ? static_cast<double>(x) / static_cast<double>(y) : fx / fy);
    }
    if (op == "//") {
      if (ints) {
        if (y == 0) Fail("integer division or modulo by zero");
        return Value(FloorDiv(x, y));
      }
      if (fy == 0) Fail("float floor division by zero");
      return Value(PyFloatFloorDiv(fx, fy));
    }
    if (op == "%") {
      if (ints) {
        if (y == 0) Fail("integer division or modulo by zero");
        return Value(FloorMod(x, y));
      }
      if (fy == 0) Fail("float modulo");
      return Value(PyFloatMod(fx, fy));
    }
    if (op == "**") {
      if (ints && y >= 0) {
        // Bases 0, 1 and -1 never overflow: answer them directly rather than multiply
        // y times (1 ** 9000000000000 would loop for hours); |x| >= 2 overflows 64 bits
        // within 63 steps.
        if (x == 0) return Value(int64_t{y == 0 ? 1 : 0});
        if (x == 1) return Value(int64_t{1});
        if (x == -1) return Value(int64_t{y % 2 == 0 ? 1 : -1});
        __int128 r = 1;
        for (int64_t i = 0; i < y; ++i) {
          r *= x;
          if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min()) {
            Fail("integer result beyond 64 bits (not supported)");
          }
        }
        return Value(static_cast<int64_t>(r));
      }
      if (fx == 0 && fy < 0) Fail("0.0 cannot be raised to a negative power");
      if (fx < 0 && std::isfinite(fy) && fy != std::floor(fy)) {
        Fail("a negative number to a fractional power is complex (not supported)");
      }
      const double r = std::pow(fx, fy);
      if (std::isinf(r) && std::isfinite(fx) && std::isfinite(fy)) Fail("(34, 'Numerical result out of range')");
      return Value(r);
    }
    Unsupported(op, a, b);
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.string_value() + b.string_value());
    if (a.kind() == b.kind() && a.is_sequence()) {
      std::vector<Value> out = a.list_value();
      out.insert(out.end(), b.list_value().begin(), b.list_value().end());
      return a.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
    }
    if (a.is_string()) {
      TypeError(absl::StrCat("can only concatenate str (not \"", b.TypeName(), "\") to str"));
    }
    if (a.is_sequence()) {
      TypeError(absl::StrCat("can only concatenate ", a.TypeName(), " (not \"", b.TypeName(), "\") to ",
                             a.TypeName()));
    }
    Unsupported(op, a, b);
  }
  if (op == "*") {
    if ((a.is_string() || a.is_sequence()) && IsIntLike(b)) return Repeat(a, b.int_value());
    if ((b.is_string() || b.is_sequence()) && IsIntLike(a)) return Repeat(b, a.int_value());
    if ((a.is_string() || a.is_sequence()) || (b.is_string() || b.is_sequence())) {
      TypeError(absl::StrCat("can't multiply sequence by non-int of type '",
                             (a.is_string() || a.is_sequence()) ? b.TypeName() : a.TypeName(), "'"));
    }
    Unsupported(op, a, b);
  }
  if (op == "%" && a.is_string()) return Value(PyPercentFormat(a.string_value(), b));
  Unsupported(op, a, b);
}

int Interpreter::Compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (IsNum(a) && IsNum(b)) {
    if (IsIntLike(a) && IsIntLike(b)) {
      return a.int_value() < b.int_value() ? -1 : a.int_value() > b.int_value() ? 1 : 0;
    }
    const double x = AsDouble(a), y = AsDouble(b);
    if (std::isnan(x) || std::isnan(y)) return 2;  // every comparison false... approximated
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.string_value().compare(b.string_value());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind() == b.kind() && a.is_sequence()) {
    const auto& x = a.list_value();
    const auto& y = b.list_value();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (PyEquals(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  TypeError(absl::StrCat("'", op, "' not supported between instances of '", a.TypeName(), "' and '",
                         b.TypeName(), "'"));
}

bool Interpreter::Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        TypeError(absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return container.string_value().find(item.string_value()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& v : container.list_value()) {
        if (PyEquals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      CheckHashable(item);
      return container.dict_value().Find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kGenerator: {
      auto* g = static_cast<GeneratorObject*>(container.object());
      Value v;
      while (g->Next(&v)) {
        if (PyEquals(v, item)) return true;
      }
      return false;
    }
    case Value::Kind::kCallable:
      if (auto* loop = dynamic_cast<LoopObject*>(container.object())) {
        for (size_t i = static_cast<size_t>(loop->index0) + 1; i < loop->items.size(); ++i) {
          if (PyEquals(loop->items[i], item)) return true;
        }
        return false;
      }
      break;
    default:
      break;
  }
  TypeError(absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
}

std::vector<Value> Interpreter::Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kString: {
      std::vector<Value> out;
      std::string ch;
      for (char32_t c : Decode(v.string_value())) {
        ch.clear();
        AppendUtf8(c, &ch);
        out.emplace_back(ch);
      }
      return out;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return v.list_value();
    case Value::Kind::kDict: {
      std::vector<Value> out;
      for (const auto& kv : v.dict_value().items()) out.push_back(kv.first);
      return out;
    }
    case Value::Kind::kGenerator:
      return static_cast<GeneratorObject*>(v.object())->TakeAll();
    case Value::Kind::kCallable:
      if (auto* loop = dynamic_cast<LoopObject*>(v.object())) {
        // Iterating a LoopContext yields the remaining items (rarely useful).
        return std::vector<Value>(loop->items.begin() + loop->index0 + 1, loop->items.end());
      }
      break;
    default:
      break;
  }
  TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

int64_t Interpreter::Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.string_value()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(v.list_value().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict_value().size());
    case Value::Kind::kCallable:
      if (auto* loop = dynamic_cast<LoopObject*>(v.object())) return static_cast<int64_t>(loop->items.size());
      break;
    default:
      break;
  }
  TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
}

Value Interpreter::GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (!name.empty() && name[0] == '_') {
    return Value::Undefined(absl::StrCat("access to attribute '", name, "' of '", obj.TypeName(),
                                         "' object is unsafe."));
  }
  if (std::optional<Value> m = BuiltinMethod(obj, name)) return *m;
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      const Value* v = obj.dict_value().Find(Value(name));
      if (v != nullptr) return *v;
      break;
    }
    case Value::Kind::kNamespace: {
      const Value* v = static_cast<NamespaceObject*>(obj.object())->attrs.Find(Value(name));
      if (v != nullptr) return *v;
      break;
    }
    case Value::Kind::kCallable:
      if (auto* loop = dynamic_cast<LoopObject*>(obj.object())) {
        const int64_t n = static_cast<int64_t>(loop->items.size());
        const int64_t i = loop->index0;
        if (name == "index") return Value(i + 1);
        if (name == "index0") return Value(i);
        if (name == "revindex") return Value(n - i);
        if (name == "revindex0") return Value(n - i - 1);
        if (name == "first") return Value(i == 0);
        if (name == "last") return Value(i == n - 1);
        if (name == "length") return Value(n);
        if (name == "depth") return Value(1);
        if (name == "depth0") return Value(0);
        if (name == "previtem") {
          return i == 0 ? Value::Undefined("there is no previous item") : loop->items[i - 1];
        }
        if (name == "nextitem") {
          return i + 1 >= n ? Value::Undefined("there is no next item") : loop->items[i + 1];
        }
      }
      break;
    default:
      break;
  }
  return MissingAttr(obj, Value(name));
}

Value Interpreter::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(obj);
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      bool hashable = true;
      try {
        CheckHashable(key);
      } catch (const TemplateError&) {
        hashable = false;  // Python's TypeError, which the sandbox getitem swallows
      }
      if (!hashable) break;
      const Value* v = obj.dict_value().Find(key);
      if (v != nullptr) return *v;
      break;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kString: {
      if (!IsIntLike(key)) break;
      int64_t i = key.int_value();
      if (obj.is_string()) {
        const std::u32string cps = Decode(obj.string_value());
        const int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return MissingAttr(obj, key);
        std::string ch;
        AppendUtf8(cps[i], &ch);
        return Value(std::move(ch));
      }
      const auto& items = obj.list_value();
      const int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return MissingAttr(obj, key);
      return items[i];
    }
    default:
      break;
  }
  if (key.is_string()) {
    // The sandbox falls back to getattr for string keys.
    const std::string& name = key.string_value();
    if (!name.empty() && name[0] == '_') return MissingAttr(obj, key);
    if (std::optional<Value> m = BuiltinMethod(obj, name)) return *m;
    if (obj.kind() == Value::Kind::kNamespace || obj.kind() == Value::Kind::kCallable) {
      return GetAttr(obj, name);
    }
  }
  return MissingAttr(obj, key);
}

}  // namespace echokv::jinja::internal
