// Lets mains accept dashed flag names (--max-tokens) for Abseil flags, whose names
// are C++ identifiers (max_tokens). Only the name part before '=' is rewritten;
// values and positional arguments are untouched; "--" ends flag processing.
//
//   int main(int argc, char** argv) {
//     echokv::DashedFlagArgs args(argc, argv);
//     absl::ParseCommandLine(args.argc(), args.argv());
#ifndef ECHOKV_COMMON_FLAG_NAMES_H_
#define ECHOKV_COMMON_FLAG_NAMES_H_

#include <string>
#include <vector>

namespace echokv {

class DashedFlagArgs {
 public:
  DashedFlagArgs(int argc, char** argv);
  int argc() const { return static_cast<int>(ptrs_.size()) - 1; }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> storage_;  // rewritten arguments
  std::vector<char*> ptrs_;           // pointers into storage_, null-terminated
};

}  // namespace echokv

#endif  // ECHOKV_COMMON_FLAG_NAMES_H_
