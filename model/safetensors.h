// A small, strict reader and writer for the safetensors format (no torch in here).
//
// Validation follows the reference implementation: 8-byte little-endian header
// length <= 100 MB and within the file, valid JSON object header, dtype/shape/
// data_offsets per tensor, byte ranges in bounds, contiguous, non-overlapping,
// covering the data area exactly (no trailing bytes), prod(shape)*sizeof(dtype)
// == range length (overflow-checked), unique names. Files are mmap'ed read-only.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open("/models/qwen2-7b"));
//   const TensorView* w = ckpt->Find("model.embed_tokens.weight");
//   // w->dtype, w->shape, w->data (w->nbytes bytes, valid while ckpt lives)
#ifndef ECHOKV_MODEL_SAFETENSORS_H_
#define ECHOKV_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace echokv::model {

// Element types echokv loads. Others (I8, F64, ...) are rejected by name.
enum class DType { kF32, kF16, kBF16 };

absl::string_view DTypeName(DType dtype);     // "F32", "F16", "BF16"
size_t DTypeSize(DType dtype);                // 4, 2, 2

// One tensor of a mapped file. `data` points into the mapping.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// One mapped .safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* Find(absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;                              // file this mapping came from
  void* map_ = nullptr;                           // mmap base (nullptr for empty files)
  size_t map_size_ = 0;                           // bytes mapped
  std::vector<TensorView> tensors_;               // in data-offset order
  std::map<std::string, std::string> metadata_;   // the header's __metadata__
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json naming
// shards. Pickle checkpoints (*.bin, *.pt, *.pth) are refused with a clear message.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const TensorView* Find(absl::string_view name) const;
  std::vector<std::string> Names() const;  // sorted

 private:
  Checkpoint() = default;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;   // one per shard
  std::map<std::string, const TensorView*, std::less<>> index_;  // name -> view in files_
};

// A tensor to write: `bytes` must hold prod(shape) * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Writes a single .safetensors file (tensors in the given order, no padding beyond
// the 8-byte alignment of the header that the reference writer also applies).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_SAFETENSORS_H_
