// The Jinja2 parser (jinja2/parser.py), same grammar and precedence:
//   condexpr: or ("if" or ["else" condexpr])*      or: and ("or" and)*
//   and: not ("and" not)*    not: "not" not | compare
//   compare: math1 ((== != < <= > >= | in | not in) math1)*
//   math1: concat ((+ | -) concat)*     concat: math2 ("~" math2)*
//   math2: pow ((* | / | // | %) pow)*  pow: unary ("**" unary)*
//   unary: (- | +) unary-without-filters | primary; then postfix (. [] ()) and
//          filters / tests (| name(args), is [not] name args)
// Statements: if/elif/else, for (with `if` filter, else, recursive), set (incl.
// namespace attributes and block set), macro, call, filter, with, break/continue
// (loopcontrols), print, raw, and transformers' {% generation %}. include / import /
// extends / block / autoescape are refused with a clear error (a chat template is a
// single string).
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "jinja/ast.h"
#include "jinja/interpreter.h"
#include "jinja/object.h"

namespace echokv::jinja::internal {
namespace {

[[noreturn]] void FailAt(size_t offset, std::string message) {
  throw TemplateError{std::move(message), offset};
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData: return "template data / text";
    case TokenType::kVariableBegin: return "begin of print statement";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kName:
    case TokenType::kString:
    case TokenType::kInteger:
    case TokenType::kFloat:
    case TokenType::kOperator:
      return t.value;
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

ExprPtr NewExpr(Expr::Kind kind, size_t offset) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->offset = offset;
  return e;
}

StmtPtr NewStmt(Stmt::Kind kind, size_t offset) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->offset = offset;
  return s;
}

// Every Name referenced in a macro body (to know whether it takes varargs / kwargs /
// caller, as Jinja decides at compile time).
void CollectNames(const Expr* e, std::set<std::string>* names);
void CollectNames(const Body& body, std::set<std::string>* names);

void CollectNames(const Expr* e, std::set<std::string>* names) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::kName) names->insert(e->name);
  CollectNames(e->a.get(), names);
  CollectNames(e->b.get(), names);
  CollectNames(e->c.get(), names);
  CollectNames(e->d.get(), names);
  for (const auto& i : e->items) CollectNames(i.get(), names);
  for (const auto& kv : e->kwargs) CollectNames(kv.second.get(), names);
  CollectNames(e->dyn_args.get(), names);
  CollectNames(e->dyn_kwargs.get(), names);
  for (const auto& op : e->ops) CollectNames(op.second.get(), names);
}

void CollectNames(const Body& body, std::set<std::string>* names) {
  for (const StmtPtr& s : body) {
    CollectNames(s->expr.get(), names);
    CollectNames(s->test.get(), names);
    for (const auto& v : s->values) CollectNames(v.get(), names);
    CollectNames(s->body, names);
    CollectNames(s->else_body, names);
    if (s->signature) {
      for (const auto& d : s->signature->defaults) CollectNames(d.get(), names);
    }
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body ParseTemplate() {
    Body body = Subparse({});
    if (cur().type != TokenType::kEof) FailAt(cur().offset, "unexpected " + Describe(cur()));
    return body;
  }

 private:
  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[std::min(pos_ + 1, t_.size() - 1)]; }
  const Token& Next() {
    const Token& t = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return t;
  }
  bool IsName(const Token& t, const char* name) const {
    return t.type == TokenType::kName && t.value == name;
  }
  bool IsOp(const Token& t, const char* op) const {
    return t.type == TokenType::kOperator && t.value == op;
  }
  bool SkipName(const char* name) {
    if (!IsName(cur(), name)) return false;
    Next();
    return true;
  }
  bool SkipOp(const char* op) {
    if (!IsOp(cur(), op)) return false;
    Next();
    return true;
  }
  const Token& ExpectOp(const char* op) {
    if (!IsOp(cur(), op)) {
      FailAt(cur().offset, absl::StrCat("expected token '", op, "', got '", Describe(cur()), "'"));
    }
    return Next();
  }
  const Token& ExpectName() {
    if (cur().type != TokenType::kName) {
      FailAt(cur().offset, absl::StrCat("expected token 'name', got '", Describe(cur()), "'"));
    }
    return Next();
  }
  void ExpectName(const char* name) {
    if (!IsName(cur(), name)) {
      FailAt(cur().offset, absl::StrCat("expected token '", name, "', got '", Describe(cur()), "'"));
    }
    Next();
  }
  void Expect(TokenType type, const char* what) {
    if (cur().type != type) {
      FailAt(cur().offset, absl::StrCat("expected token '", what, "', got '", Describe(cur()), "'"));
    }
    Next();
  }

  // Statements until a block whose first name is in `end_tokens` (left current).
  Body Subparse(const std::vector<std::string>& end_tokens) {
    Body body;
    while (cur().type != TokenType::kEof) {
      const Token& t = cur();
      if (t.type == TokenType::kData) {
        auto s = NewStmt(Stmt::Kind::kData, t.offset);
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVariableBegin) {
        Next();
        auto s = NewStmt(Stmt::Kind::kOutput, cur().offset);
        s->expr = ParseTuple(false, true, {}, false);
        Expect(TokenType::kVariableEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Next();
        if (cur().type == TokenType::kName &&
            std::find(end_tokens.begin(), end_tokens.end(), cur().value) != end_tokens.end()) {
          return body;
        }
        ParseStatement(&body);
        Expect(TokenType::kBlockEnd, "end of statement block");
      } else {
        FailAt(t.offset, "unexpected " + Describe(t));
      }
    }
    if (!end_tokens.empty()) {
      std::string want;
      for (const auto& e : end_tokens) want += (want.empty() ? "'" : " or '") + e + "'";
      FailAt(cur().offset, absl::StrCat("Unexpected end of template. Jinja was looking for the "
                                        "following tags: ", want, "."));
    }
    return body;
  }

  // `:`? block_end, then statements up to one of end_tokens; `drop` consumes it.
  Body ParseStatements(const std::vector<std::string>& end_tokens, bool drop) {
    if (++block_depth_ > kMaxNesting) FailAt(cur().offset, "blocks nested too deeply");
    SkipOp(":");
    Expect(TokenType::kBlockEnd, "end of statement block");
    Body body = Subparse(end_tokens);
    if (drop) Next();
    --block_depth_;
    return body;
  }

  void ParseStatement(Body* out) {
    const Token& t = cur();
    if (t.type != TokenType::kName) FailAt(t.offset, "tag name expected");
    const std::string name = t.value;
    const size_t offset = t.offset;
    if (name == "if") return out->push_back(ParseIf());
    if (name == "for") return out->push_back(ParseFor());
    if (name == "set") return out->push_back(ParseSet());
    if (name == "macro") return out->push_back(ParseMacro());
    if (name == "call") return out->push_back(ParseCallBlock());
    if (name == "filter") return out->push_back(ParseFilterBlock());
    if (name == "with") return out->push_back(ParseWith());
    if (name == "print") {
      Next();
      auto s = NewStmt(Stmt::Kind::kOutput, offset);
      std::vector<ExprPtr> items;
      while (cur().type != TokenType::kBlockEnd) {
        if (!items.empty()) ExpectOp(",");
        items.push_back(ParseExpression(true));
      }
      for (auto& e : items) {
        auto o = NewStmt(Stmt::Kind::kOutput, e->offset);
        o->expr = std::move(e);
        out->push_back(std::move(o));
      }
      return;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) FailAt(offset, absl::StrCat("'", name, "' outside loop"));
      Next();
      out->push_back(NewStmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, offset));
      return;
    }
    if (name == "generation") {
      // transformers' AssistantTracker: the body renders as is.
      Next();
      auto s = NewStmt(Stmt::Kind::kScope, offset);
      const int saved = loop_depth_;  // a call block in Jinja: no break / continue inside
      loop_depth_ = 0;
      s->body = ParseStatements({"endgeneration"}, true);
      loop_depth_ = saved;
      return out->push_back(std::move(s));
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends" ||
        name == "block" || name == "autoescape") {
      FailAt(offset, absl::StrCat("the '", name, "' tag is not supported (a chat template is one "
                                  "self-contained string)"));
    }
    std::string msg = absl::StrCat("Encountered unknown tag '", name, "'.");
    FailAt(offset, msg);
  }

  StmtPtr ParseIf() {
    auto node = NewStmt(Stmt::Kind::kIf, cur().offset);
    Next();
    node->expr = ParseTuple(false, false, {}, false);
    node->body = ParseStatements({"elif", "else", "endif"}, false);
    const Token& t = Next();
    if (t.value == "elif") {
      // elif chains become a nested if in the else branch.
      --pos_;
      node->else_body.push_back(ParseIf());
      return node;
    }
    if (t.value == "else") node->else_body = ParseStatements({"endif"}, true);
    return node;
  }

  StmtPtr ParseFor() {
    auto node = NewStmt(Stmt::Kind::kFor, cur().offset);
    Next();
    node->target = ParseAssignTarget(true, false, {"in"}, false);
    ExpectName("in");
    node->expr = ParseTuple(false, false, {"recursive"}, false);
    if (SkipName("if")) node->test = ParseExpression(true);
    node->recursive = SkipName("recursive");
    if (node->recursive) FailAt(node->offset, "recursive for loops are not supported");
    ++loop_depth_;
    node->body = ParseStatements({"endfor", "else"}, false);
    --loop_depth_;
    // (the else block runs after the loop: break / continue there act on an outer one)
    if (Next().value != "endfor") node->else_body = ParseStatements({"endfor"}, true);
    return node;
  }

  StmtPtr ParseSet() {
    const size_t offset = cur().offset;
    Next();
    Target target = ParseAssignTarget(true, false, {}, true);
    if (SkipOp("=")) {
      auto node = NewStmt(Stmt::Kind::kAssign, offset);
      node->target = std::move(target);
      node->expr = ParseTuple(false, true, {}, false);
      return node;
    }
    auto node = NewStmt(Stmt::Kind::kAssignBlock, offset);
    node->target = std::move(target);
    node->expr = ParseFilter(nullptr, false);
    node->body = ParseStatements({"endset"}, true);
    return node;
  }

  std::shared_ptr<MacroSignature> ParseSignature() {
    auto sig = std::make_shared<MacroSignature>();
    ExpectOp("(");
    while (!IsOp(cur(), ")")) {
      if (!sig->args.empty()) ExpectOp(",");
      const Token& name = ExpectName();
      if (SkipOp("=")) {
        sig->defaults.push_back(ParseExpression(true));
      } else if (!sig->defaults.empty()) {
        FailAt(name.offset, "non-default argument follows default argument");
      }
      sig->args.push_back(name.value);
    }
    ExpectOp(")");
    return sig;
  }

  void FinishSignature(MacroSignature* sig, const Body& body) {
    std::set<std::string> names;
    CollectNames(body, &names);
    sig->catch_varargs = names.count("varargs") > 0;
    sig->catch_kwargs = names.count("kwargs") > 0;
    sig->caller = names.count("caller") > 0;
  }

  StmtPtr ParseMacro() {
    auto node = NewStmt(Stmt::Kind::kMacro, cur().offset);
    Next();
    node->text = ExpectName().value;
    node->signature = ParseSignature();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    node->body = ParseStatements({"endmacro"}, true);
    loop_depth_ = saved;
    FinishSignature(node->signature.get(), node->body);
    return node;
  }

  StmtPtr ParseCallBlock() {
    auto node = NewStmt(Stmt::Kind::kCallBlock, cur().offset);
    Next();
    if (IsOp(cur(), "(")) {
      node->signature = ParseSignature();
    } else {
      node->signature = std::make_shared<MacroSignature>();
    }
    node->expr = ParseExpression(true);
    if (node->expr->kind != Expr::Kind::kCall) FailAt(node->offset, "expected call");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    node->body = ParseStatements({"endcall"}, true);
    loop_depth_ = saved;
    FinishSignature(node->signature.get(), node->body);
    return node;
  }

  StmtPtr ParseFilterBlock() {
    auto node = NewStmt(Stmt::Kind::kFilterBlock, cur().offset);
    Next();
    node->expr = ParseFilter(nullptr, true);
    node->body = ParseStatements({"endfilter"}, true);
    return node;
  }

  StmtPtr ParseWith() {
    auto node = NewStmt(Stmt::Kind::kWith, cur().offset);
    Next();
    while (cur().type != TokenType::kBlockEnd) {
      if (!node->targets.empty()) ExpectOp(",");
      node->targets.push_back(ParseAssignTarget(true, false, {}, false));
      ExpectOp("=");
      node->values.push_back(ParseExpression(true));
    }
    node->body = ParseStatements({"endwith"}, true);
    return node;
  }

  Target ParseAssignTarget(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                           bool with_namespace) {
    if (with_namespace && IsOp(look(), ".")) {
      Target t;
      t.kind = Target::Kind::kNsAttr;
      t.offset = cur().offset;
      t.name = ExpectName().value;
      Next();  // the dot
      t.attr = ExpectName().value;
      return t;
    }
    if (name_only) {
      Target t;
      t.offset = cur().offset;
      t.name = ExpectName().value;
      return t;
    }
    const size_t offset = cur().offset;
    ExprPtr e = with_tuple ? ParseTuple(true, true, extra_end, false) : ParsePrimary();
    return ToTarget(*e, offset);
  }

  Target ToTarget(const Expr& e, size_t offset) {
    Target t;
    t.offset = e.offset;
    if (e.kind == Expr::Kind::kName) {
      if (e.name == "true" || e.name == "false" || e.name == "none" || e.name == "True" ||
          e.name == "False" || e.name == "None") {
        FailAt(offset, "can't assign to 'const'");
      }
      t.name = e.name;
      return t;
    }
    if (e.kind == Expr::Kind::kTuple) {
      t.kind = Target::Kind::kTuple;
      for (const auto& i : e.items) t.items.push_back(ToTarget(*i, offset));
      return t;
    }
    FailAt(offset, "can't assign to this expression");
  }

  bool IsTupleEnd(const std::vector<std::string>& extra_end) {
    const Token& t = cur();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd ||
        t.type == TokenType::kEof || IsOp(t, ")")) {
      return true;
    }
    if (t.type == TokenType::kName) {
      return std::find(extra_end.begin(), extra_end.end(), t.value) != extra_end.end();
    }
    return false;
  }

  ExprPtr ParseTuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                     bool explicit_parens) {
    const size_t offset = cur().offset;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      if (simplified) {
        args.push_back(ParsePrimary());
      } else {
        args.push_back(ParseExpression(with_condexpr));
      }
      if (IsOp(cur(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) {
        FailAt(cur().offset, absl::StrCat("Expected an expression, got '", Describe(cur()), "'"));
      }
    }
    auto e = NewExpr(Expr::Kind::kTuple, offset);
    e->items = std::move(args);
    return e;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    // Nesting is bounded so that a hostile template cannot exhaust the C++ stack.
    if (++nesting_ > kMaxNesting) FailAt(cur().offset, "expression nested too deeply");
    ExprPtr e = with_condexpr ? ParseCondExpr() : ParseOr();
    --nesting_;
    return e;
  }

  ExprPtr ParseCondExpr() {
    const size_t offset = cur().offset;
    ExprPtr expr1 = ParseOr();
    while (SkipName("if")) {
      auto e = NewExpr(Expr::Kind::kCond, offset);
      e->a = ParseOr();
      e->b = std::move(expr1);
      if (SkipName("else")) e->c = ParseCondExpr();
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr Binary(const char* op, ExprPtr left, ExprPtr right, size_t offset) {
    auto e = NewExpr(Expr::Kind::kBinary, offset);
    e->name = op;
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  ExprPtr ParseOr() {
    const size_t offset = cur().offset;
    ExprPtr left = ParseAnd();
    while (SkipName("or")) left = Binary("or", std::move(left), ParseAnd(), offset);
    return left;
  }

  ExprPtr ParseAnd() {
    const size_t offset = cur().offset;
    ExprPtr left = ParseNot();
    while (SkipName("and")) left = Binary("and", std::move(left), ParseNot(), offset);
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName(cur(), "not")) {
      if (++nesting_ > kMaxNesting) FailAt(cur().offset, "expression nested too deeply");
      auto e = NewExpr(Expr::Kind::kNot, Next().offset);
      e->a = ParseNot();
      --nesting_;
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const size_t offset = cur().offset;
    ExprPtr expr = ParseMath1();
    std::vector<std::pair<std::string, ExprPtr>> ops;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kOperator &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" || t.value == ">" ||
           t.value == ">=")) {
        const std::string op = Next().value;
        ops.emplace_back(op, ParseMath1());
      } else if (SkipName("in")) {
        ops.emplace_back("in", ParseMath1());
      } else if (IsName(cur(), "not") && IsName(look(), "in")) {
        Next();
        Next();
        ops.emplace_back("notin", ParseMath1());
      } else {
        break;
      }
    }
    if (ops.empty()) return expr;
    auto e = NewExpr(Expr::Kind::kCompare, offset);
    e->a = std::move(expr);
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr ParseMath1() {
    const size_t offset = cur().offset;
    ExprPtr left = ParseConcat();
    while (IsOp(cur(), "+") || IsOp(cur(), "-")) {
      const std::string op = Next().value;
      left = Binary(op.c_str(), std::move(left), ParseConcat(), offset);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    const size_t offset = cur().offset;
    std::vector<ExprPtr> args;
    args.push_back(ParseMath2());
    while (SkipOp("~")) args.push_back(ParseMath2());
    if (args.size() == 1) return std::move(args[0]);
    auto e = NewExpr(Expr::Kind::kConcat, offset);
    e->items = std::move(args);
    return e;
  }

  ExprPtr ParseMath2() {
    const size_t offset = cur().offset;
    ExprPtr left = ParsePow();
    while (IsOp(cur(), "*") || IsOp(cur(), "/") || IsOp(cur(), "//") || IsOp(cur(), "%")) {
      const std::string op = Next().value;
      left = Binary(op.c_str(), std::move(left), ParsePow(), offset);
    }
    return left;
  }

  ExprPtr ParsePow() {
    const size_t offset = cur().offset;
    ExprPtr left = ParseUnary(true);
    while (SkipOp("**")) left = Binary("**", std::move(left), ParseUnary(true), offset);
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    const size_t offset = cur().offset;
    ExprPtr node;
    if (IsOp(cur(), "-") || IsOp(cur(), "+")) {
      if (++nesting_ > kMaxNesting) FailAt(offset, "expression nested too deeply");
      const bool neg = IsOp(cur(), "-");
      Next();
      node = NewExpr(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, offset);
      node->a = ParseUnary(false);
      --nesting_;
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = cur();
    const size_t offset = t.offset;
    if (t.type == TokenType::kName) {
      ExprPtr e;
      if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
        e = NewExpr(Expr::Kind::kConst, offset);
        e->value = Value(t.value == "true" || t.value == "True");
      } else if (t.value == "none" || t.value == "None") {
        e = NewExpr(Expr::Kind::kConst, offset);
        e->value = Value::None();
      } else {
        e = NewExpr(Expr::Kind::kName, offset);
        e->name = t.value;
      }
      Next();
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string buf;
      while (cur().type == TokenType::kString) buf += Next().value;
      auto e = NewExpr(Expr::Kind::kConst, offset);
      e->value = Value(std::move(buf));
      return e;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      auto e = NewExpr(Expr::Kind::kConst, offset);
      e->value = t.type == TokenType::kInteger ? Value(t.int_value) : Value(t.float_value);
      Next();
      return e;
    }
    if (IsOp(t, "(")) {
      Next();
      ExprPtr e = ParseTuple(false, true, {}, true);
      ExpectOp(")");
      return e;
    }
    if (IsOp(t, "[")) {
      Next();
      auto e = NewExpr(Expr::Kind::kList, offset);
      while (!IsOp(cur(), "]")) {
        if (!e->items.empty()) ExpectOp(",");
        if (IsOp(cur(), "]")) break;
        e->items.push_back(ParseExpression(true));
      }
      ExpectOp("]");
      return e;
    }
    if (IsOp(t, "{")) {
      Next();
      auto e = NewExpr(Expr::Kind::kDict, offset);
      while (!IsOp(cur(), "}")) {
        if (!e->items.empty()) ExpectOp(",");
        if (IsOp(cur(), "}")) break;
        e->items.push_back(ParseExpression(true));
        ExpectOp(":");
        e->items.push_back(ParseExpression(true));
      }
      ExpectOp("}");
      return e;
    }
    FailAt(offset, absl::StrCat("unexpected '", Describe(t), "'"));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(cur(), ".") || IsOp(cur(), "[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp(cur(), "(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp(cur(), "|")) {
        node = ParseFilter(std::move(node), false);
      } else if (IsName(cur(), "is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp(cur(), "(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const Token& t = Next();
    if (t.value == ".") {
      const Token& attr = Next();
      if (attr.type == TokenType::kName) {
        auto e = NewExpr(Expr::Kind::kGetattr, node->offset);
        e->a = std::move(node);
        e->name = attr.value;
        return e;
      }
      if (attr.type != TokenType::kInteger) FailAt(attr.offset, "expected name or number");
      auto e = NewExpr(Expr::Kind::kGetitem, node->offset);
      e->a = std::move(node);
      e->b = NewExpr(Expr::Kind::kConst, attr.offset);
      e->b->value = Value(attr.int_value);
      return e;
    }
    // "["
    std::vector<ExprPtr> args;
    while (!IsOp(cur(), "]")) {
      if (!args.empty()) ExpectOp(",");
      args.push_back(ParseSubscribed());
    }
    ExpectOp("]");
    auto e = NewExpr(Expr::Kind::kGetitem, node->offset);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = NewExpr(Expr::Kind::kTuple, t.offset);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprPtr ParseSubscribed() {
    const size_t offset = cur().offset;
    ExprPtr start;
    if (IsOp(cur(), ":")) {
      Next();
    } else {
      ExprPtr node = ParseExpression(true);
      if (!IsOp(cur(), ":")) return node;
      Next();
      start = std::move(node);
    }
    auto e = NewExpr(Expr::Kind::kSlice, offset);
    e->a = std::move(start);
    if (IsOp(cur(), ":")) {
      // stop omitted
    } else if (!IsOp(cur(), "]") && !IsOp(cur(), ",")) {
      e->b = ParseExpression(true);
    }
    if (IsOp(cur(), ":")) {
      Next();
      if (!IsOp(cur(), "]") && !IsOp(cur(), ",")) e->c = ParseExpression(true);
    }
    return e;
  }

  void ParseCallArgs(Expr* e) {
    const Token& lparen = ExpectOp("(");
    bool require_comma = false;
    const auto ensure = [&](bool ok) {
      if (!ok) FailAt(lparen.offset, "invalid syntax for function call expression");
    };
    while (!IsOp(cur(), ")")) {
      if (require_comma) {
        ExpectOp(",");
        if (IsOp(cur(), ")")) break;
      }
      if (IsOp(cur(), "*")) {
        ensure(!e->dyn_args && !e->dyn_kwargs);
        Next();
        e->dyn_args = ParseExpression(true);
      } else if (IsOp(cur(), "**")) {
        ensure(!e->dyn_kwargs);
        Next();
        e->dyn_kwargs = ParseExpression(true);
      } else if (cur().type == TokenType::kName && IsOp(look(), "=")) {
        ensure(!e->dyn_kwargs);
        const std::string key = Next().value;
        Next();
        e->kwargs.emplace_back(key, ParseExpression(true));
      } else {
        ensure(!e->dyn_args && !e->dyn_kwargs && e->kwargs.empty());
        e->items.push_back(ParseExpression(true));
      }
      require_comma = true;
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr node) {
    auto e = NewExpr(Expr::Kind::kCall, node->offset);
    e->a = std::move(node);
    ParseCallArgs(e.get());
    return e;
  }

  ExprPtr ParseFilter(ExprPtr node, bool start_inline) {
    while (IsOp(cur(), "|") || start_inline) {
      if (!start_inline) Next();
      const Token& name = ExpectName();
      auto e = NewExpr(Expr::Kind::kFilter, name.offset);
      e->name = name.value;
      while (IsOp(cur(), ".")) {
        Next();
        e->name += "." + ExpectName().value;
      }
      e->a = std::move(node);
      if (IsOp(cur(), "(")) ParseCallArgs(e.get());
      node = std::move(e);
      start_inline = false;
    }
    return node;
  }

  ExprPtr ParseTest(ExprPtr node) {
    const Token& is = Next();
    const bool negated = SkipName("not");
    auto e = NewExpr(Expr::Kind::kTest, is.offset);
    e->name = ExpectName().value;
    while (IsOp(cur(), ".")) {
      Next();
      e->name += "." + ExpectName().value;
    }
    e->a = std::move(node);
    const Token& t = cur();
    if (IsOp(t, "(")) {
      ParseCallArgs(e.get());
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat || IsOp(t, "(") ||
                IsOp(t, "[") || IsOp(t, "{")) &&
               !IsName(t, "else") && !IsName(t, "or") && !IsName(t, "and")) {
      if (IsName(t, "is")) FailAt(t.offset, "You cannot chain multiple tests with is");
      ExprPtr arg = ParsePostfix(ParsePrimary());
      e->items.push_back(std::move(arg));
    }
    if (!negated) return e;
    auto n = NewExpr(Expr::Kind::kNot, is.offset);
    n->a = std::move(e);
    return n;
  }

  static constexpr int kMaxNesting = 200;
  std::vector<Token> t_;  // the token stream (ends with kEof)
  int nesting_ = 0;       // expressions being parsed inside one another
  int block_depth_ = 0;   // statement blocks being parsed inside one another
  size_t pos_ = 0;        // current token
  int loop_depth_ = 0;    // for-loops around the current point (inside one macro)
};

// What Jinja checks when it compiles a template, before any of it runs:
// - an unknown filter or test is an error unless it sits inside an `if` (test or
//   branches) or an inline if-expression, without a for / macro / call / filter /
//   with / set block in between (Jinja's "soft frames");
// - the optimizer folds constant expressions, and a constant dict literal with an
//   unhashable constant key fails right there (even in a branch never taken).
class CompileChecks {
 public:
  // The one folding failure Jinja does not turn into "fold at run time instead".
  struct UnhashableKey {
    TemplateError error;
  };

  void Run(Body& body) {
    try {
      Statements(body, false);
    } catch (const UnhashableKey& u) {
      throw u.error;
    }
  }

  void Statements(Body& body, bool soft) {
    for (StmtPtr& s : body) Statement(*s, soft);
  }

 private:
  void Statement(Stmt& s, bool soft) {
    switch (s.kind) {
      case Stmt::Kind::kData:
      case Stmt::Kind::kBreak:
      case Stmt::Kind::kContinue:
        return;
      case Stmt::Kind::kOutput:
        s.const_output = IsConst(*s.expr);
        return Expression(s.expr.get(), soft);
      case Stmt::Kind::kAssign:
        return Expression(s.expr.get(), soft);
      case Stmt::Kind::kIf:
        Expression(s.expr.get(), true);
        Statements(s.body, true);
        return Statements(s.else_body, true);
      case Stmt::Kind::kFor:
        Expression(s.expr.get(), soft);
        Expression(s.test.get(), false);
        Statements(s.body, false);
        return Statements(s.else_body, false);
      case Stmt::Kind::kAssignBlock:
      case Stmt::Kind::kFilterBlock:
        Expression(s.expr.get(), false);
        return Statements(s.body, false);
      case Stmt::Kind::kMacro:
      case Stmt::Kind::kCallBlock:
        if (s.kind == Stmt::Kind::kCallBlock) Expression(s.expr.get(), soft);
        for (const ExprPtr& d : s.signature->defaults) Expression(d.get(), false);
        return Statements(s.body, false);
      case Stmt::Kind::kWith:
        for (ExprPtr& v : s.values) Expression(v.get(), soft);
        return Statements(s.body, false);
      case Stmt::Kind::kScope:
        return Statements(s.body, false);
    }
  }

  // Jinja's optimizer runs on the subtree of these node kinds (its @optimizeconst
  // visitors); a dict literal is only folded when it sits under one of them.
  static bool TriggersFolding(Expr::Kind k) {
    switch (k) {
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos:
      case Expr::Kind::kNot:
      case Expr::Kind::kBinary:
      case Expr::Kind::kConcat:
      case Expr::Kind::kCompare:
      case Expr::Kind::kGetattr:
      case Expr::Kind::kGetitem:
      case Expr::Kind::kFilter:
      case Expr::Kind::kTest:
      case Expr::Kind::kCond:
      case Expr::Kind::kCall:
        return true;
      default:
        return false;
    }
  }

  // Whether Jinja's as_const succeeds on `e` (approximately: filters and tests that
  // need the context - map, select, reject, selectattr, rejectattr - never fold).
  static bool IsConst(const Expr& e) {
    const auto all = [](const Expr& x) {
      for (const Expr* p : {x.a.get(), x.b.get(), x.c.get(), x.d.get()}) {
        if (p != nullptr && !IsConst(*p)) return false;
      }
      for (const ExprPtr& i : x.items) {
        if (!IsConst(*i)) return false;
      }
      for (const auto& kv : x.kwargs) {
        if (!IsConst(*kv.second)) return false;
      }
      for (const auto& op : x.ops) {
        if (!IsConst(*op.second)) return false;
      }
      return !x.dyn_args && !x.dyn_kwargs;
    };
    switch (e.kind) {
      case Expr::Kind::kConst:
        return true;
      case Expr::Kind::kName:
      case Expr::Kind::kCall:
        return false;
      case Expr::Kind::kCond:
        return e.c != nullptr && all(e);
      case Expr::Kind::kFilter:
        if (e.a == nullptr || !Interpreter::HasFilter(e.name)) return false;
        if (e.name == "map" || e.name == "select" || e.name == "reject" || e.name == "selectattr" ||
            e.name == "rejectattr") {
          return false;
        }
        return all(e);
      case Expr::Kind::kTest:
        return Interpreter::HasTest(e.name) && all(e);
      default:
        return all(e);
    }
  }

  void Expression(Expr* e, bool soft, bool folding = false) {
    if (e == nullptr) return;
    if (e->kind == Expr::Kind::kBinary && e->name == "**" && IsConst(*e->a) && !IsConst(*e->b)) {
      e->negative_const_base = true;
    }
    if (e->kind == Expr::Kind::kCond) soft = true;
    folding = folding || TriggersFolding(e->kind);
    Expression(e->a.get(), soft, folding);
    Expression(e->b.get(), soft, folding);
    Expression(e->c.get(), soft, folding);
    Expression(e->d.get(), soft, folding);
    for (ExprPtr& i : e->items) Expression(i.get(), soft, folding);
    for (auto& kv : e->kwargs) Expression(kv.second.get(), soft, folding);
    Expression(e->dyn_args.get(), soft, folding);
    Expression(e->dyn_kwargs.get(), soft, folding);
    for (auto& op : e->ops) Expression(op.second.get(), soft, folding);
    if (e->kind == Expr::Kind::kFilter && !soft && !Interpreter::HasFilter(e->name)) {
      FailAt(e->offset, absl::StrCat("No filter named '", e->name, "'."));
    }
    if (e->kind == Expr::Kind::kTest && !soft && !Interpreter::HasTest(e->name)) {
      FailAt(e->offset, absl::StrCat("No test named '", e->name, "'."));
    }
    if (e->kind == Expr::Kind::kDict && folding) Const(*e);
  }

  static bool Hashable(const Value& v) {
    if (v.kind() == Value::Kind::kList || v.kind() == Value::Kind::kDict) return false;
    if (v.kind() == Value::Kind::kTuple) {
      for (const Value& i : v.list_value()) {
        if (!Hashable(i)) return false;
      }
    }
    return true;
  }

  // Jinja's as_const: the value when `e` folds to a constant.
  std::optional<Value> Const(const Expr& e) {
    try {
      switch (e.kind) {
        case Expr::Kind::kConst:
          return e.value;
        case Expr::Kind::kList:
        case Expr::Kind::kTuple: {
          std::vector<Value> items;
          for (const ExprPtr& i : e.items) {
            std::optional<Value> v = Const(*i);
            if (!v) return std::nullopt;
            items.push_back(*std::move(v));
          }
          return e.kind == Expr::Kind::kList ? Value::MakeList(std::move(items)) : Value::MakeTuple(std::move(items));
        }
        case Expr::Kind::kDict: {
          Dict d;
          for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
            std::optional<Value> k = Const(*e.items[i]);
            if (!k) return std::nullopt;
            std::optional<Value> v = Const(*e.items[i + 1]);
            if (!v) return std::nullopt;
            if (!Hashable(*k)) {
              const Value* bad = &*k;
              while (bad->kind() == Value::Kind::kTuple) {
                for (const Value& x : bad->list_value()) {
                  if (!Hashable(x)) {
                    bad = &x;
                    break;
                  }
                }
              }
              throw UnhashableKey{TemplateError{absl::StrCat("unhashable type: '", bad->TypeName(), "'"),
                                                e.items[i]->offset}};
            }
            d.Set(*std::move(k), *std::move(v));
          }
          return Value::MakeDict(std::move(d));
        }
        case Expr::Kind::kNot: {
          std::optional<Value> v = Const(*e.a);
          if (!v) return std::nullopt;
          return Value(!v->Truthy());
        }
        case Expr::Kind::kNeg:
        case Expr::Kind::kPos:
        case Expr::Kind::kBinary:
        case Expr::Kind::kConcat:
        case Expr::Kind::kCompare: {
          // Folding these only matters for what they contain (done above) and for
          // keys built from them: evaluate with a throwaway interpreter.
          std::vector<const Expr*> parts = {e.a.get(), e.b.get()};
          for (const ExprPtr& i : e.items) parts.push_back(i.get());
          for (const auto& op : e.ops) parts.push_back(op.second.get());
          for (const Expr* p : parts) {
            if (p != nullptr && !Const(*p)) return std::nullopt;
          }
          RenderOptions options;
          Interpreter interp(options);
          auto scope = std::make_shared<Scope>(nullptr);
          return interp.Eval(e, scope);
        }
        default:
          return std::nullopt;
      }
    } catch (const UnhashableKey&) {
      throw;
    } catch (const TemplateError&) {
      return std::nullopt;  // Jinja's Impossible: left for run time
    }
  }
};

}  // namespace

Body Parse(std::vector<Token> tokens) {
  Body body = Parser(std::move(tokens)).ParseTemplate();
  CompileChecks().Run(body);
  return body;
}

}  // namespace echokv::jinja::internal
