// Memory for large read-mostly buffers (model weights) on transparent huge pages.
//
// Decode streams every weight once per token: 160 MB for a 40M-parameter float32 model,
// 40,000 4-KiB pages, each a TLB miss (a two-dimensional page walk under a hypervisor).
// On 2-MiB pages the same stream touches 80. Measured on the 2-core bench machine
// (docs/benchmarks/JOURNAL.md "Register-tiled decode products, prefetch, weights on huge
// pages"): 40M decode at
// 512 positions, 2 threads, +12-15 %. The kernel's THP mode here is usually "madvise",
// so a plain malloc never gets huge pages; this asks for them explicitly.
//
//   HugePageBuffer buf = HugePageBuffer::Allocate(bytes);   // zero-filled, 2-MiB aligned
//   if (!buf.ok()) ...                                       // mmap failed
//   std::memcpy(buf.data(), src, bytes);
#ifndef ECHOKV_COMMON_HUGE_PAGES_H_
#define ECHOKV_COMMON_HUGE_PAGES_H_

#include <cstddef>

namespace echokv {

class HugePageBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  // `bytes` > 0 of zero-filled memory starting on a 2-MiB boundary; the range is
  // madvise(MADV_HUGEPAGE)d (advised() says whether the kernel accepted it: not on
  // kernels without THP). ok() is false only when the mapping failed.
  static HugePageBuffer Allocate(size_t bytes);

  HugePageBuffer() = default;
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();

  bool ok() const { return data_ != nullptr; }
  void* data() const { return data_; }
  size_t size() const { return size_; }
  bool advised() const { return advised_; }

  // Hands the mapping to the caller, who frees it with Free(data, size) (e.g. from a
  // tensor's deleter); the buffer is empty afterwards.
  void* Release();
  static void Free(void* data, size_t size);

 private:
  void Reset();
  void* data_ = nullptr;  // 2-MiB aligned start of the usable range
  size_t size_ = 0;       // bytes asked for
  bool advised_ = false;
};

}  // namespace echokv

#endif  // ECHOKV_COMMON_HUGE_PAGES_H_
