// The one rendering of an untrusted client string inside an error message or a log
// line (docs/SECURITY.md, "Input validation"): at most 40 bytes of it, quoted, with
// every byte outside printable ASCII (and the quote and backslash) as \xNN, and the
// full length after a cut. A 1 MB policy name gives a 60-byte message.
//
//   return absl::InvalidArgumentError(absl::StrCat("compression.policy ", EchoPrefix(name), " is unknown"));
//   // compression.policy 'echokv\x00xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...(1048576 bytes)' is unknown
#ifndef ECHOKV_COMMON_ECHO_H_
#define ECHOKV_COMMON_ECHO_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace echokv {

inline constexpr size_t kMaxEchoBytes = 40;

// '<at most kMaxEchoBytes bytes, escaped>' plus "...(N bytes)" inside the quotes when cut.
std::string EchoPrefix(absl::string_view untrusted);

}  // namespace echokv

#endif  // ECHOKV_COMMON_ECHO_H_
