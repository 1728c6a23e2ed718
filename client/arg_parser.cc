#include "client/arg_parser.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"

namespace echokv::client {
namespace {

// Overload set for std::visit.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

std::string Normalize(const std::string& name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

}  // namespace

ArgParser::ArgParser(std::string synopsis) : synopsis_(std::move(synopsis)) {}

void ArgParser::AddString(const std::string& name, std::optional<std::string>* out,
                          const std::string& help) {
  flags_.push_back({Normalize(name), out, help});
}
void ArgParser::AddStringList(const std::string& name, std::vector<std::string>* out,
                              const std::string& help) {
  flags_.push_back({Normalize(name), out, help});
}
void ArgParser::AddInt(const std::string& name, std::optional<int64_t>* out,
                       const std::string& help) {
  flags_.push_back({Normalize(name), out, help});
}
void ArgParser::AddDouble(const std::string& name, std::optional<double>* out,
                          const std::string& help) {
  flags_.push_back({Normalize(name), out, help});
}
void ArgParser::AddBool(const std::string& name, std::optional<bool>* out,
                        const std::string& help) {
  flags_.push_back({Normalize(name), out, help});
}

const ArgParser::Flag* ArgParser::Find(const std::string& name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

absl::Status ArgParser::Assign(const Flag& flag, const std::string& value) {
  const std::string label = absl::StrCat("--", flag.name);
  return std::visit(
      Overloaded{
          [&](std::optional<std::string>* out) -> absl::Status {
            *out = value;
            return absl::OkStatus();
          },
          [&](std::vector<std::string>* out) -> absl::Status {
            out->push_back(value);
            return absl::OkStatus();
          },
          [&](std::optional<int64_t>* out) -> absl::Status {
            int64_t v = 0;
            if (!absl::SimpleAtoi(value, &v)) {
              return absl::InvalidArgumentError(
                  absl::StrCat(label, ": '", value, "' is not an integer"));
            }
            *out = v;
            return absl::OkStatus();
          },
          [&](std::optional<double>* out) -> absl::Status {
            double v = 0;
            if (!absl::SimpleAtod(value, &v)) {
              return absl::InvalidArgumentError(
                  absl::StrCat(label, ": '", value, "' is not a number"));
            }
            *out = v;
            return absl::OkStatus();
          },
          [&](std::optional<bool>* out) -> absl::Status {
            bool v = false;
            if (!absl::SimpleAtob(value, &v)) {
              return absl::InvalidArgumentError(
                  absl::StrCat(label, ": '", value, "' is not true or false"));
            }
            *out = v;
            return absl::OkStatus();
          },
      },
      flag.target);
}

absl::Status ArgParser::Parse(const std::vector<std::string>& args,
                              std::vector<std::string>* positional) const {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional->insert(positional->end(), args.begin() + i + 1, args.end());
      return absl::OkStatus();
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      positional->push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const std::string name = Normalize(body);
    const Flag* flag = Find(name);
    if (flag == nullptr && absl::StartsWith(name, "no-")) {
      const Flag* negated = Find(name.substr(3));
      if (negated != nullptr && IsBool(negated) && !value.has_value()) {
        *std::get<std::optional<bool>*>(negated->target) = false;
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", body));
    }
    if (!value.has_value()) {
      if (IsBool(flag)) {
        *std::get<std::optional<bool>*>(flag->target) = true;
        continue;
      }
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag->name, " needs a value"));
      }
      value = args[++i];
    }
    if (absl::Status s = Assign(*flag, *value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string ArgParser::Usage() const {
  std::string out = absl::StrCat("usage: echokv-cli [--server HOST:PORT] ", synopsis_, "\n");
  for (const Flag& flag : flags_) {
    const char* kind = std::visit(
        Overloaded{
            [](std::optional<std::string>*) { return " STRING"; },
            [](std::vector<std::string>*) { return " STRING (repeatable)"; },
            [](std::optional<int64_t>*) { return " INT"; },
            [](std::optional<double>*) { return " NUMBER"; },
            [](std::optional<bool>*) { return ""; },
        },
        flag.target);
    std::string head = absl::StrCat("  --", flag.name, kind);
    if (head.size() < 28) head.resize(28, ' ');
    absl::StrAppend(&out, head, " ", flag.help, "\n");
  }
  return out;
}

bool ArgParser::IsBool(const Flag* flag) {
  return std::holds_alternative<std::optional<bool>*>(flag->target);
}

}  // namespace echokv::client
