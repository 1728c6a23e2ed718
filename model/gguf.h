// A strict reader for GGUF files (llama.cpp's model format), versions 2 and 3.
// Torch-free.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count;
// the metadata (u64-length key, u32 value type, value: scalars, u64-length strings,
// arrays of u32 element type + u64 count + elements, arrays nested); the tensor table
// (name, u32 rank, u64 dims[rank] with dims[0] the contiguous one, u32 ggml type, u64
// offset from the data section); then the data section at the next multiple of
// `general.alignment` (default 32). Version 1 used 32-bit counts and is refused.
// Version 3 only added big-endian files (the magic stays, every number is byte-swapped,
// so the version reads as 0x03000000 here): they are refused by name.
//
// Every rule is checked before anything is used, and errors name the key or tensor:
// sizes and counts within the file and without overflow, strings and keys non-empty
// where required, unique keys and tensor names, rank 1..4, dims >= 1, a ggml type id,
// rows a whole number of blocks, offsets aligned, tensor bytes inside the data section
// and not overlapping, `general.alignment` a u32 power of two. Files are mmap'ed
// read-only; `Parse` reads a buffer the caller keeps alive (tests, fuzzing).
//
//   ECHOKV_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open("/models/SmolLM2.gguf"));
//   ECHOKV_ASSIGN_OR_RETURN(std::string arch, gguf->GetString("general.architecture"));
//   const GgufTensor* t = gguf->FindTensor("blk.0.attn_q.weight");
//   absl::string_view bytes = gguf->TensorBytes(*t);   // valid while gguf lives
#ifndef ECHOKV_MODEL_GGUF_H_
#define ECHOKV_MODEL_GGUF_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace echokv::model {

// GGUF metadata value types (gguf_type).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", ..., "array".
absl::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars keep their type; numeric arrays stay a view of the
// file's bytes (a 100 MB uint8 array costs nothing to hold), read with the *At
// accessors; arrays of strings and of arrays are decoded.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  uint64_t u = 0;      // unsigned integers and bool (0/1)
  int64_t i = 0;       // signed integers
  double f = 0;        // float32 / float64 (float32 converted exactly)
  std::string s;       // string

  // Arrays.
  GgufValueType element_type = GgufValueType::kUint8;
  uint64_t count = 0;                // elements
  absl::string_view raw;             // numeric and bool elements, little-endian, packed
  std::vector<std::string> strings;  // string elements
  std::vector<GgufValue> arrays;     // array elements

  bool is_integer() const { return IsIntegerType(type); }
  bool is_float() const { return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64; }
  // Element `k` of a numeric / bool array (k < count): integers (and bools) as int64
  // (uint64 values above INT64_MAX wrap: use UintAt), floats as double.
  int64_t IntAt(uint64_t k) const;
  uint64_t UintAt(uint64_t k) const;
  double FloatAt(uint64_t k) const;

  static bool IsIntegerType(GgufValueType t);
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the contiguous (innermost) one
  uint32_t type = 0;          // ggml type id (model/ggml_types.h)
  uint64_t offset = 0;        // from the start of the data section
  uint64_t nbytes = 0;
  int64_t elements = 0;
  // The row-major shape with the outermost dim first (the reverse of dims), as a
  // Hugging Face / PyTorch tensor of the same memory has it.
  std::vector<int64_t> shape() const { return std::vector<int64_t>(dims.rbegin(), dims.rend()); }
};

class GgufFile {
 public:
  // Maps and parses `path`. Errors carry the path.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes the caller keeps alive as long as the result.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(absl::string_view bytes);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }
  // Every byte before the data section: the header, the metadata and the tensor table.
  absl::string_view header_bytes() const { return bytes_.substr(0, data_offset_); }

  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }  // file order
  const GgufValue* Find(absl::string_view key) const;

  // Typed reads; errors name the key and say what it holds instead. GetUint accepts
  // any integer type holding a value >= 0; GetFloat float32/float64.
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  // An array whose elements are `element` (any integer type when `element` is kInt64
  // or kUint64; empty arrays match every request); errors name the key.
  absl::StatusOr<const GgufValue*> GetArray(absl::string_view key, GgufValueType element) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // file order
  const GgufTensor* FindTensor(absl::string_view name) const;
  // The tensor's bytes (inside the mapping or the parsed buffer).
  absl::string_view TensorBytes(const GgufTensor& tensor) const;

 private:
  GgufFile() = default;
  absl::Status ParseAll();

  std::string path_;               // "" for Parse
  void* map_ = nullptr;            // mmap base (nullptr for Parse or empty files)
  size_t map_size_ = 0;
  absl::string_view bytes_;        // the whole file
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::map<std::string, size_t, std::less<>> key_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// True when `path` names a regular file whose first four bytes are "GGUF".
bool IsGgufFile(const std::string& path);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_GGUF_H_
