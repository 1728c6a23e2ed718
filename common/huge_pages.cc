#include "common/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <utility>

namespace echokv {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

// The mapping is sized up to whole huge pages plus one more, so that a 2-MiB aligned
// start exists inside it; the unaligned head and the tail are unmapped at once, so
// Free only needs the aligned start and the requested size.
HugePageBuffer HugePageBuffer::Allocate(size_t bytes) {
  HugePageBuffer b;
  if (bytes == 0) return b;
  const size_t usable = RoundUp(bytes, kHugePage);
  const size_t total = usable + kHugePage;
  void* raw = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return b;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + total;
  if (end > aligned + usable) munmap(reinterpret_cast<void*>(aligned + usable), end - (aligned + usable));
  b.data_ = reinterpret_cast<void*>(aligned);
  b.size_ = bytes;
  b.advised_ = madvise(b.data_, usable, MADV_HUGEPAGE) == 0;
  return b;
}

void HugePageBuffer::Free(void* data, size_t size) {
  if (data != nullptr) munmap(data, RoundUp(size, kHugePage));
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      advised_(std::exchange(other.advised_, false)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    advised_ = std::exchange(other.advised_, false);
  }
  return *this;
}

HugePageBuffer::~HugePageBuffer() { Reset(); }

void* HugePageBuffer::Release() {
  size_ = 0;
  advised_ = false;
  return std::exchange(data_, nullptr);
}

void HugePageBuffer::Reset() {
  Free(data_, size_);
  data_ = nullptr;
  size_ = 0;
  advised_ = false;
}

}  // namespace echokv
