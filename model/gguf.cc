#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/ggml_types.h"

namespace echokv::model {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr int kMaxRank = 4;           // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;     // arrays of arrays (no real file nests more than 2)
constexpr char kAlignmentKey[] = "general.alignment";
constexpr uint64_t kMaxNestedArrays = 1 << 20;  // arrays inside arrays, in the whole file

// How many bytes one element of a value type takes at least (strings: their length
// field; arrays: type + count), to bound counts before allocating.
uint64_t MinValueBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 1;
}

bool IsValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

std::string Quoted(absl::string_view s) {
  // Names come from the file: show at most 64 bytes, escaped.
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (s.size() > 64) out += "...";
  return out + "'";
}

// A bounds-checked little-endian cursor over the file.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " at byte ", pos_, " needs ", n, " bytes but the file has ",
                                                     remaining(), " left (truncated?)"));
    }
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    ECHOKV_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));  // little-endian host (x86-64, arm64)
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<absl::string_view> ReadBytes(uint64_t n, absl::string_view what) {
    ECHOKV_RETURN_IF_ERROR(Need(n, what));
    absl::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  absl::StatusOr<absl::string_view> ReadString(absl::string_view what) {
    ECHOKV_ASSIGN_OR_RETURN(uint64_t n, Read<uint64_t>(what));
    if (n > remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a string of ", n, " bytes at byte ", pos_, " runs past the end of the file"));
    }
    absl::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  absl::string_view bytes_;
  uint64_t pos_ = 0;
};


absl::Status ReadArray(Reader* r, const std::string& key, int depth, uint64_t* nested_budget, GgufValue* out) {
  if (depth >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", Quoted(key), ": arrays nested deeper than ",
                                                   kMaxArrayDepth));
  }
  ECHOKV_ASSIGN_OR_RETURN(uint32_t et, r->Read<uint32_t>(absl::StrCat("metadata ", Quoted(key), " array type")));
  if (!IsValueType(et)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", Quoted(key), ": array element type ", et, " is not a GGUF value type"));
  }
  ECHOKV_ASSIGN_OR_RETURN(uint64_t n, r->Read<uint64_t>(absl::StrCat("metadata ", Quoted(key), " array length")));
  const GgufValueType element = static_cast<GgufValueType>(et);
  if (n > r->remaining() / MinValueBytes(element)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", Quoted(key), ": an array of ", n, " ",
                                                   GgufValueTypeName(element), " values cannot fit in the ",
                                                   r->remaining(), " bytes left"));
  }
  out->element_type = element;
  out->count = n;
  if (element == GgufValueType::kString) {
    out->strings.resize(n);
    for (uint64_t k = 0; k < n; ++k) {
      ECHOKV_ASSIGN_OR_RETURN(absl::string_view s, r->ReadString(absl::StrCat("metadata ", Quoted(key))));
      out->strings[k] = std::string(s);
    }
    return absl::OkStatus();
  }
  if (element == GgufValueType::kArray) {
    if (n > *nested_budget) {
      return absl::InvalidArgumentError(absl::StrCat("metadata ", Quoted(key), ": more than ", kMaxNestedArrays,
                                                     " nested arrays in the file"));
    }
    *nested_budget -= n;
    out->arrays.resize(n);
    for (uint64_t k = 0; k < n; ++k) {
      out->arrays[k].type = GgufValueType::kArray;
      ECHOKV_RETURN_IF_ERROR(ReadArray(r, key, depth + 1, nested_budget, &out->arrays[k]));
    }
    return absl::OkStatus();
  }
  const uint64_t bytes = n * MinValueBytes(element);
  ECHOKV_ASSIGN_OR_RETURN(out->raw, r->ReadBytes(bytes, absl::StrCat("metadata ", Quoted(key))));
  if (element == GgufValueType::kBool) {
    for (char c : out->raw) {
      if (static_cast<unsigned char>(c) > 1) {
        return absl::InvalidArgumentError(absl::StrCat("metadata ", Quoted(key), ": a bool must be 0 or 1, got ",
                                                       static_cast<unsigned char>(c)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadValue(Reader* r, GgufValueType type, const std::string& key, uint64_t* nested_budget,
                       GgufValue* out) {
  out->type = type;
  const std::string what = absl::StrCat("metadata ", Quoted(key));
  switch (type) {
    case GgufValueType::kUint8: {
      ECHOKV_ASSIGN_OR_RETURN(out->u, r->Read<uint8_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kInt8: {
      ECHOKV_ASSIGN_OR_RETURN(out->i, r->Read<int8_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kUint16: {
      ECHOKV_ASSIGN_OR_RETURN(out->u, r->Read<uint16_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kInt16: {
      ECHOKV_ASSIGN_OR_RETURN(out->i, r->Read<int16_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kUint32: {
      ECHOKV_ASSIGN_OR_RETURN(out->u, r->Read<uint32_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kInt32: {
      ECHOKV_ASSIGN_OR_RETURN(out->i, r->Read<int32_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kUint64: {
      ECHOKV_ASSIGN_OR_RETURN(out->u, r->Read<uint64_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kInt64: {
      ECHOKV_ASSIGN_OR_RETURN(out->i, r->Read<int64_t>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kFloat32: {
      ECHOKV_ASSIGN_OR_RETURN(float f, r->Read<float>(what));
      out->f = f;
      return absl::OkStatus();
    }
    case GgufValueType::kFloat64: {
      ECHOKV_ASSIGN_OR_RETURN(out->f, r->Read<double>(what));
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      ECHOKV_ASSIGN_OR_RETURN(uint8_t b, r->Read<uint8_t>(what));
      if (b > 1) return absl::InvalidArgumentError(absl::StrCat(what, ": a bool must be 0 or 1, got ", b));
      out->u = b;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      ECHOKV_ASSIGN_OR_RETURN(absl::string_view s, r->ReadString(what));
      out->s = std::string(s);
      return absl::OkStatus();
    }
    case GgufValueType::kArray:
      return ReadArray(r, key, 0, nested_budget, out);
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": unknown value type"));
}

std::string DimsString(const std::vector<int64_t>& dims) { return absl::StrCat("[", absl::StrJoin(dims, ", "), "]"); }

}  // namespace

absl::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool GgufValue::IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

namespace {
bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
template <typename T>
T LoadAt(absl::string_view raw, uint64_t k) {
  T v;
  std::memcpy(&v, raw.data() + k * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

int64_t GgufValue::IntAt(uint64_t k) const {
  switch (element_type) {
    case GgufValueType::kUint8:
    case GgufValueType::kBool: return LoadAt<uint8_t>(raw, k);
    case GgufValueType::kInt8: return LoadAt<int8_t>(raw, k);
    case GgufValueType::kUint16: return LoadAt<uint16_t>(raw, k);
    case GgufValueType::kInt16: return LoadAt<int16_t>(raw, k);
    case GgufValueType::kUint32: return LoadAt<uint32_t>(raw, k);
    case GgufValueType::kInt32: return LoadAt<int32_t>(raw, k);
    case GgufValueType::kUint64: return static_cast<int64_t>(LoadAt<uint64_t>(raw, k));
    case GgufValueType::kInt64: return LoadAt<int64_t>(raw, k);
    case GgufValueType::kFloat32: return static_cast<int64_t>(LoadAt<float>(raw, k));
    case GgufValueType::kFloat64: return static_cast<int64_t>(LoadAt<double>(raw, k));
    default: return 0;
  }
}

uint64_t GgufValue::UintAt(uint64_t k) const {
  if (element_type == GgufValueType::kUint64) return LoadAt<uint64_t>(raw, k);
  return static_cast<uint64_t>(IntAt(k));
}

double GgufValue::FloatAt(uint64_t k) const {
  switch (element_type) {
    case GgufValueType::kFloat32: return LoadAt<float>(raw, k);
    case GgufValueType::kFloat64: return LoadAt<double>(raw, k);
    default: return static_cast<double>(IntAt(k));
  }
}

bool IsGgufFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {0, 0, 0, 0};
  const ssize_t n = pread(fd, magic, 4, 0);
  close(fd);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(absl::string_view bytes) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->bytes_ = bytes;
  ECHOKV_RETURN_IF_ERROR(f->ParseAll());
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(why) : absl::FailedPreconditionError(why);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
    }
    f->map_ = map;
    f->map_size_ = size;
    f->bytes_ = absl::string_view(static_cast<const char*>(map), size);
  }
  close(fd);
  absl::Status s = f->ParseAll();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return f;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

absl::Status GgufFile::ParseAll() {
  Reader r(bytes_);
  if (bytes_.size() < 4 || bytes_.substr(0, 4) != "GGUF") {
    return absl::InvalidArgumentError("not a GGUF file (the first 4 bytes are not \"GGUF\")");
  }
  r.Read<uint32_t>("magic").IgnoreError();
  ECHOKV_ASSIGN_OR_RETURN(version_, r.Read<uint32_t>("version"));
  if (version_ == 1) {
    return absl::InvalidArgumentError("GGUF version 1 (32-bit counts, 2023) is not supported; convert the file again");
  }
  if ((version_ & 0xFFFFu) == 0 && version_ != 0) {
    return absl::InvalidArgumentError("a big-endian GGUF file is not supported (the version reads byte-swapped)");
  }
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF version ", version_, " is not supported (2 and 3 are)"));
  }
  ECHOKV_ASSIGN_OR_RETURN(uint64_t n_tensors, r.Read<uint64_t>("tensor count"));
  ECHOKV_ASSIGN_OR_RETURN(uint64_t n_kv, r.Read<uint64_t>("metadata count"));
  // A key-value pair takes at least 8 (key length) + 1 (key) + 4 (type) + 1 bytes; a
  // tensor entry 8 + 1 + 4 + 8 + 4 + 8.
  if (n_kv > r.remaining() / 14) {
    return absl::InvalidArgumentError(
        absl::StrCat("the header claims ", n_kv, " metadata entries, more than the file can hold"));
  }
  if (n_tensors > r.remaining() / 33) {
    return absl::InvalidArgumentError(
        absl::StrCat("the header claims ", n_tensors, " tensors, more than the file can hold"));
  }

  metadata_.resize(n_kv);
  uint64_t nested_budget = kMaxNestedArrays;
  for (uint64_t k = 0; k < n_kv; ++k) {
    ECHOKV_ASSIGN_OR_RETURN(absl::string_view key, r.ReadString(absl::StrCat("metadata entry ", k, " key")));
    if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("metadata entry ", k, " has an empty key"));
    GgufKeyValue& kv = metadata_[k];
    kv.key = std::string(key);
    if (key_index_.count(kv.key) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("metadata key ", Quoted(key), " appears twice"));
    }
    ECHOKV_ASSIGN_OR_RETURN(uint32_t type, r.Read<uint32_t>(absl::StrCat("metadata ", Quoted(key), " type")));
    if (!IsValueType(type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata ", Quoted(key), ": value type ", type, " is not a GGUF value type"));
    }
    ECHOKV_RETURN_IF_ERROR(ReadValue(&r, static_cast<GgufValueType>(type), kv.key, &nested_budget, &kv.value));
    key_index_.emplace(kv.key, k);
  }

  if (const GgufValue* a = Find(kAlignmentKey); a != nullptr) {
    if (a->type != GgufValueType::kUint32) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'general.alignment' must be a uint32, got a ",
                                                     GgufValueTypeName(a->type)));
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata 'general.alignment' must be a power of two, got ", a->u));
    }
    alignment_ = static_cast<uint32_t>(a->u);
  } else {
    alignment_ = kDefaultAlignment;
  }

  tensors_.resize(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensor& info = tensors_[t];
    ECHOKV_ASSIGN_OR_RETURN(absl::string_view name, r.ReadString(absl::StrCat("tensor entry ", t, " name")));
    if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("tensor entry ", t, " has an empty name"));
    info.name = std::string(name);
    const std::string q = absl::StrCat("tensor ", Quoted(name));
    if (tensor_index_.count(info.name) != 0) return absl::InvalidArgumentError(absl::StrCat(q, " appears twice"));
    ECHOKV_ASSIGN_OR_RETURN(uint32_t rank, r.Read<uint32_t>(q + " rank"));
    if (rank < 1 || rank > kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat(q, ": rank ", rank, " is outside [1, ", kMaxRank, "]"));
    }
    int64_t elements = 1;
    for (uint32_t j = 0; j < rank; ++j) {
      ECHOKV_ASSIGN_OR_RETURN(uint64_t dim, r.Read<uint64_t>(q + " dims"));
      if (dim < 1 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(q, ": dimension ", j, " is ", dim, " (must be >= 1)"));
      }
      if (elements > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dim)) {
        return absl::InvalidArgumentError(absl::StrCat(q, ": the element count overflows 64 bits"));
      }
      elements *= static_cast<int64_t>(dim);
      info.dims.push_back(static_cast<int64_t>(dim));
    }
    info.elements = elements;
    ECHOKV_ASSIGN_OR_RETURN(info.type, r.Read<uint32_t>(q + " type"));
    const GgmlTypeInfo* type = FindGgmlType(info.type);
    if (type == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(q, ": type id ", info.type, " is not a GGML type"));
    }
    if (info.dims[0] % type->block_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(q, " ", DimsString(info.dims), ": its rows of ", info.dims[0],
                                                     " values are not a whole number of ", type->name,
                                                     " blocks of ", type->block_size));
    }
    int64_t row_bytes = 0;
    if (!GgmlRowBytes(*type, info.dims[0], &row_bytes) ||
        (elements / info.dims[0]) > std::numeric_limits<int64_t>::max() / std::max<int64_t>(row_bytes, 1)) {
      return absl::InvalidArgumentError(absl::StrCat(q, ": the byte size overflows 64 bits"));
    }
    info.nbytes = static_cast<uint64_t>(row_bytes) * static_cast<uint64_t>(elements / info.dims[0]);
    ECHOKV_ASSIGN_OR_RETURN(info.offset, r.Read<uint64_t>(q + " offset"));
    if (info.offset % alignment_ != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(q, ": offset ", info.offset, " is not a multiple of the alignment ", alignment_));
    }
    tensor_index_.emplace(info.name, t);
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  const uint64_t pad = (alignment_ - header_end % alignment_) % alignment_;
  data_offset_ = header_end + pad;
  if (n_tensors == 0) {
    data_offset_ = std::min<uint64_t>(data_offset_, bytes_.size());
    return absl::OkStatus();
  }
  if (data_offset_ > bytes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the data section would start at byte ", data_offset_, ", past the end of the ",
                     bytes_.size(), "-byte file"));
  }
  const uint64_t data_bytes = bytes_.size() - data_offset_;
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (const GgufTensor& t : tensors_) {
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(t.name), " ", DimsString(t.dims), " (",
                                                     FindGgmlType(t.type)->name, ", ", t.nbytes,
                                                     " bytes at data offset ", t.offset,
                                                     ") runs past the end of the file's ", data_bytes,
                                                     "-byte data section"));
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensor& prev = tensors_[order[i - 1]];
    const GgufTensor& cur = tensors_[order[i]];
    if (prev.offset + prev.nbytes > cur.offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(cur.name), " (data offset ", cur.offset,
                                                     ") overlaps tensor ", Quoted(prev.name), " (bytes ",
                                                     prev.offset, "..", prev.offset + prev.nbytes, ")"));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

namespace {
absl::Status Missing(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("metadata '", key, "' is missing"));
}
absl::Status WrongType(absl::string_view key, absl::string_view want, const GgufValue& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("metadata '", key, "' must be ", want, ", got a ", GgufValueTypeName(v.type)));
}
}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kString) return WrongType(key, "a string", *v);
  return v->s;
}

absl::StatusOr<uint64_t> GgufFile::GetUint(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!v->is_integer()) return WrongType(key, "an integer", *v);
  if (IsSigned(v->type)) {
    if (v->i < 0) {
      return absl::InvalidArgumentError(absl::StrCat("metadata '", key, "' must be >= 0, got ", v->i));
    }
    return static_cast<uint64_t>(v->i);
  }
  return v->u;
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (!v->is_float()) return WrongType(key, "a float32 or float64", *v);
  return v->f;
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kBool) return WrongType(key, "a bool", *v);
  return v->u != 0;
}

absl::StatusOr<const GgufValue*> GgufFile::GetArray(absl::string_view key, GgufValueType element) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kArray) return WrongType(key, "an array", *v);
  const bool want_int = element == GgufValueType::kInt64 || element == GgufValueType::kUint64;
  const bool ok = v->count == 0 || (want_int ? GgufValue::IsIntegerType(v->element_type) : v->element_type == element);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", key, "' must be an array of ",
                                                   want_int ? "integers" : GgufValueTypeName(element),
                                                   ", got an array of ", GgufValueTypeName(v->element_type)));
  }
  return v;
}

const GgufTensor* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::string_view GgufFile::TensorBytes(const GgufTensor& tensor) const {
  return bytes_.substr(data_offset_ + tensor.offset, tensor.nbytes);
}

}  // namespace echokv::model
