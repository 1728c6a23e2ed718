// Internal: tokens of the Jinja lexer and the syntax tree the parser builds (the node
// kinds of jinja2/nodes.py that chat templates can reach).
#ifndef ECHOKV_JINJA_AST_H_
#define ECHOKV_JINJA_AST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace echokv::jinja::internal {

enum class TokenType {
  kData,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,  // value: the operator text ("+", "//", "[", ...)
  kEof,
};

struct Token {
  TokenType type;
  std::string value;  // data / name / unescaped string / operator
  int64_t int_value = 0;
  double float_value = 0;
  size_t offset = 0;  // byte offset into the (newline-normalised) source
};

// Splits `source` as Jinja2's lexer does with trim_blocks / lstrip_blocks on, keeping
// Jinja's rules for `-`/`+` whitespace control, raw blocks and comments. `source`
// is already newline-normalised. Throws TemplateError (with its offset).
std::vector<Token> Tokenize(const std::string& source, bool trim_blocks, bool lstrip_blocks);

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  // (fields are filled by the parser; CompileChecks sets the flags)
  enum class Kind {
    kConst,    // value
    kName,     // name
    kGetattr,  // a.name
    kGetitem,  // a[b]
    kSlice,    // a[b:c:d] (b, c, d may be null)
    kList,     // items
    kTuple,    // items
    kDict,     // items as key, value, key, value, ...
    kNeg,      // -a
    kPos,      // +a
    kNot,      // not a
    kBinary,   // a <name> b for + - * / // % ** and or
    kConcat,   // items joined with ~
    kCompare,  // a then ops: (op name, operand)
    kCond,     // b if a else c (c may be null)
    kCall,     // a(args, kwargs, *dyn_args, **dyn_kwargs)
    kFilter,   // a|name(args...); a null inside {% filter %}
    kTest,     // a is name(args...)
  };
  Kind kind;
  size_t offset = 0;  // where the node starts in the source
  Value value;
  std::string name;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
  std::vector<std::pair<std::string, ExprPtr>> ops;  // kCompare
  // kBinary "**" whose base Jinja folds to a constant while the exponent is not
  // constant: Jinja emits the constant as a bare literal ("-3 ** x"), which Python
  // parses as -(3 ** x). Reproduced for negative bases.
  bool negative_const_base = false;
};

// An assignment target: a name, a namespace attribute, or a tuple of targets.
struct Target {
  enum class Kind { kName, kNsAttr, kTuple };
  Kind kind = Kind::kName;
  std::string name;  // kName, kNsAttr (the namespace variable)
  std::string attr;  // kNsAttr
  std::vector<Target> items;
  size_t offset = 0;
};

struct MacroSignature {
  std::vector<std::string> args;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() args
  bool catch_varargs = false;     // the body refers to `varargs`
  bool catch_kwargs = false;      // the body refers to `kwargs`
  bool caller = false;            // the body refers to `caller`
};

struct Stmt {
  enum class Kind {
    kData,         // text
    kOutput,       // {{ expr }}
    kIf,           // expr; body; else_body (elif chains nest in else_body)
    kFor,          // target in expr [if test] body [else else_body]
    kAssign,       // set target = expr
    kAssignBlock,  // set target [| filter] body endset
    kMacro,        // name(signature) body
    kCallBlock,    // call(signature) expr body
    kFilterBlock,  // filter expr(body)
    kWith,         // with targets = values body
    kBreak,
    kContinue,
    kScope,        // a plain block rendered in place ({% generation %})
  };
  Kind kind;
  size_t offset = 0;
  std::string text;  // kData; kMacro: name
  ExprPtr expr;      // output / test / iterable / value / call / filter
  ExprPtr test;      // kFor's `if`
  Target target;
  std::vector<Target> targets;  // kWith
  std::vector<ExprPtr> values;  // kWith
  Body body, else_body;
  std::shared_ptr<MacroSignature> signature;  // kMacro, kCallBlock
  bool recursive = false;                    // kFor
  // kOutput: the expression is constant in Jinja's sense, so Jinja evaluates it at
  // compile time with its as_const rules (a slice of a non-sequence gives undefined
  // there instead of raising).
  bool const_output = false;
};

// Parses a token stream into a template body. Throws TemplateError (with its offset).
Body Parse(std::vector<Token> tokens);

}  // namespace echokv::jinja::internal

#endif  // ECHOKV_JINJA_AST_H_
