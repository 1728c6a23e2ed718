#include "common/echo.h"

#include "absl/strings/str_cat.h"

namespace echokv {

std::string EchoPrefix(absl::string_view untrusted) {
  std::string out = "'";
  for (size_t i = 0; i < untrusted.size() && i < kMaxEchoBytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(untrusted[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (untrusted.size() > kMaxEchoBytes) absl::StrAppend(&out, "...(", untrusted.size(), " bytes)");
  out.push_back('\'');
  return out;
}

}  // namespace echokv
