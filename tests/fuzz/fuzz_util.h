// Helpers shared by the libFuzzer targets of tests/fuzz (scripts/fuzz.sh).
#ifndef ECHOKV_TESTS_FUZZ_FUZZ_UTIL_H_
#define ECHOKV_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace echokv::fuzz {

// The real test data (../shared beside the checkout): $ECHOKV_TEST_DATA, else the path
// the build saw. Targets that load real tokenizers or templates abort without it, so a
// run never silently fuzzes less than it says.
inline std::string TestData() {
  const char* env = std::getenv("ECHOKV_TEST_DATA");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(ECHOKV_FUZZ_DEFAULT_DATA);
}

// The first byte selects what the rest of the input feeds (one target, several parsers).
struct Selected {
  uint8_t selector = 0;
  absl::string_view rest;
};
inline Selected Select(const uint8_t* data, size_t size) {
  if (size == 0) return {};
  return {data[0], absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)};
}

// Splits at the first NUL byte: (before, after); after is empty when there is none.
inline std::pair<absl::string_view, absl::string_view> SplitAtNul(absl::string_view s) {
  const size_t nul = s.find('\0');
  if (nul == absl::string_view::npos) return {s, absl::string_view()};
  return {s.substr(0, nul), s.substr(nul + 1)};
}

// A broken invariant: report it so libFuzzer records the input, then abort.
[[noreturn]] inline void Violation(const std::string& what) {
  std::fprintf(stderr, "echokv-fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace echokv::fuzz

#endif  // ECHOKV_TESTS_FUZZ_FUZZ_UTIL_H_
