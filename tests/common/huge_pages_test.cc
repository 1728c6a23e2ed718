// HugePageBuffer: 2-MiB aligned, zero-filled, writable memory that the kernel marks
// eligible for transparent huge pages (/proc/self/smaps "THPeligible"), freed cleanly.
#include "common/huge_pages.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace echokv {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// THPeligible of the smaps mapping that contains `p`; -1 when not found.
int ThpEligible(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::istringstream in(ReadFile("/proc/self/smaps"));
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

// The kernel's THP mode, e.g. "madvise"; empty without THP.
std::string ThpMode() {
  const std::string s = ReadFile("/sys/kernel/mm/transparent_hugepage/enabled");
  const size_t open = s.find('['), close = s.find(']');
  return open == std::string::npos || close == std::string::npos ? "" : s.substr(open + 1, close - open - 1);
}

TEST(HugePageBuffer, AlignedZeroedWritable) {
  const size_t bytes = 5 * HugePageBuffer::kHugePage + 123;
  HugePageBuffer b = HugePageBuffer::Allocate(bytes);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.size(), bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % HugePageBuffer::kHugePage, 0u);
  const unsigned char* c = static_cast<const unsigned char*>(b.data());
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; i += 4096) nonzero += c[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  std::memset(b.data(), 0x5a, bytes);
  EXPECT_EQ(c[bytes - 1], 0x5a);
}

TEST(HugePageBuffer, KernelMarksItEligible) {
  const std::string mode = ThpMode();
  if (mode.empty() || mode == "never") {
    // No THP on this kernel: the buffer is ordinary memory, which the other tests check.
    ASSERT_TRUE(HugePageBuffer::Allocate(HugePageBuffer::kHugePage).ok());
    return;
  }
  HugePageBuffer b = HugePageBuffer::Allocate(4 * HugePageBuffer::kHugePage);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b.advised());
  std::memset(b.data(), 1, b.size());
  // With mode "madvise" only an madvise(MADV_HUGEPAGE)d range is eligible: this fails
  // if Allocate stops advising.
  EXPECT_EQ(ThpEligible(b.data()), 1) << "THP mode " << mode;
}

TEST(HugePageBuffer, ReleaseHandsOverTheMapping) {
  HugePageBuffer b = HugePageBuffer::Allocate(1000);
  ASSERT_TRUE(b.ok());
  const size_t size = b.size();
  void* p = b.Release();
  EXPECT_FALSE(b.ok());
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[999] = 7;
  HugePageBuffer::Free(p, size);
  EXPECT_EQ(ThpEligible(p), -1);  // unmapped: no mapping contains it any more
}

TEST(HugePageBuffer, ZeroBytesIsEmptyAndMoveTransfers) {
  EXPECT_FALSE(HugePageBuffer::Allocate(0).ok());
  HugePageBuffer a = HugePageBuffer::Allocate(64);
  void* p = a.data();
  HugePageBuffer b = std::move(a);
  EXPECT_FALSE(a.ok());
  EXPECT_EQ(b.data(), p);
}

}  // namespace
}  // namespace echokv
