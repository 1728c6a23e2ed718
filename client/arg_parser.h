// A small typed parser for one subcommand's flags (echokv-cli has a flag set per
// subcommand, so the global absl flag registry does not fit). Accepts `--name=value`,
// `--name value`, `--flag` / `--no-flag` for booleans, and `_` for `-` in names; `--`
// ends the flags. Unknown flags and bad values are errors naming the flag.
//
//   echokv::client::ArgParser parser("generate SESSION");
//   std::optional<int64_t> max_tokens;
//   parser.AddInt("max-tokens", &max_tokens, "tokens to generate");
//   std::vector<std::string> positional;
//   ECHOKV_RETURN_IF_ERROR(parser.Parse(args, &positional));
#ifndef ECHOKV_CLIENT_ARG_PARSER_H_
#define ECHOKV_CLIENT_ARG_PARSER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace echokv::client {

class ArgParser {
 public:
  // `synopsis` heads Usage(), e.g. "create (--text T | --file F | ...) [flags]".
  explicit ArgParser(std::string synopsis);

  // Each Add* registers `--name`; the target stays untouched unless the flag is given.
  void AddString(const std::string& name, std::optional<std::string>* out,
                 const std::string& help);
  // Repeatable: every occurrence appends.
  void AddStringList(const std::string& name, std::vector<std::string>* out,
                     const std::string& help);
  void AddInt(const std::string& name, std::optional<int64_t>* out, const std::string& help);
  void AddDouble(const std::string& name, std::optional<double>* out,
                 const std::string& help);
  // `--name`, `--name=true|false|1|0`, `--no-name`.
  void AddBool(const std::string& name, std::optional<bool>* out, const std::string& help);

  // Parses `args` (the words after the subcommand). Non-flag words go to `positional`.
  // Errors: INVALID_ARGUMENT naming the flag ("unknown flag --x", "--budget: 'abc' is
  // not an integer", "--text needs a value").
  absl::Status Parse(const std::vector<std::string>& args,
                     std::vector<std::string>* positional) const;

  // Synopsis plus one line per flag.
  std::string Usage() const;

 private:
  using Target = std::variant<std::optional<std::string>*, std::vector<std::string>*,
                              std::optional<int64_t>*, std::optional<double>*,
                              std::optional<bool>*>;
  struct Flag {
    std::string name;  // without dashes, '-' separated
    Target target;
    std::string help;
  };

  const Flag* Find(const std::string& name) const;
  static bool IsBool(const Flag* flag);
  static absl::Status Assign(const Flag& flag, const std::string& value);

  std::string synopsis_;     // first line of Usage()
  std::vector<Flag> flags_;  // in registration order (Usage() order)
};

}  // namespace echokv::client

#endif  // ECHOKV_CLIENT_ARG_PARSER_H_
