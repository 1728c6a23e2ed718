#include "model/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

using Json = nlohmann::json;

// The reference implementation's limit on the header length.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Deepest nesting a valid header has: object > tensor object > shape array.
constexpr int kMaxHeaderDepth = 3;
// model.safetensors.index.json files are a few hundred KB at most.
constexpr int64_t kMaxIndexBytes = 64 << 20;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// Thrown by the header parse callback to abort parsing; never leaves this file.
struct HeaderError {
  std::string message;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TypeName(const Json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a floating-point number";
  if (v.is_array() || v.is_object()) return std::string("an ") + v.type_name();
  return std::string("a ") + v.type_name();
}

bool IsValidUtf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      uint8_t cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Reject overlong forms, surrogates and code points beyond U+10FFFF.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

// Every dtype string of the reference implementation (echokv loads three of them).
bool IsKnownDtype(const std::string& s) {
  static const char* const kKnown[] = {"BOOL",    "F4",      "F6_E2M3", "F6_E3M2", "U8",
                                       "I8",      "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
                                       "U16",     "F16",     "BF16",    "I32",     "U32",
                                       "F32",     "F64",     "I64",     "U64",     "C64"};
  for (const char* k : kKnown) {
    if (s == k) return true;
  }
  return false;
}

bool ParseDtype(const std::string& s, DType* out) {
  if (s == "F32") {
    *out = DType::kF32;
  } else if (s == "F16") {
    *out = DType::kF16;
  } else if (s == "BF16") {
    *out = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

// A non-negative JSON integer as uint64; false for anything else.
bool ToU64(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

// prod(shape) * elem_size, or false on overflow (checked after every multiply, like the
// reference, so a later zero dimension does not hide an overflow).
bool CheckedByteSize(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(elem_size), out);
}

// Parses the header; duplicate keys (at any level) and nesting deeper than a valid header
// are rejected while parsing, before any large structure is built.
absl::StatusOr<Json> ParseHeader(const char* begin, const char* end) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto callback = [&keys](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
          throw HeaderError{
              absl::StrCat(depth <= 1 ? "duplicate tensor name '" : "duplicate key '",
                           parsed.get<std::string>(), "' in the header")};
        }
        break;
      case Json::parse_event_t::array_start:
      case Json::parse_event_t::array_end:
      case Json::parse_event_t::value:
        break;
    }
    if (depth > kMaxHeaderDepth) throw HeaderError{"header JSON is nested too deeply"};
    return true;
  };
  try {
    return Json::parse(begin, end, callback);
  } catch (const HeaderError& e) {
    return absl::InvalidArgumentError(e.message);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("header is not valid JSON: ", e.what()));
  }
}

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;  // owned descriptor, or -1
};

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool EndsWith(const std::string& s, absl::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(),
                                                suffix.data(), suffix.size()) == 0;
}

absl::StatusOr<std::string> ReadIndexFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
  }
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (st.st_size > kMaxIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", st.st_size,
                                                   " bytes, over the ", kMaxIndexBytes,
                                                   "-byte limit for an index file"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t r = read(fd, &text[done], text.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::DataLossError(absl::StrCat("error reading ", path));
    done += static_cast<size_t>(r);
  }
  return text;
}

// A shard file name from the index: a plain file name inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

absl::Status WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = errno;
      return absl::ErrnoToStatus(err, "write failed");
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto fail = [&path](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
  };

  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open safetensors file ", path));
  }
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) return fail("not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return fail(absl::StrCat("file is ", file_size,
                             " bytes, too short for the 8-byte header length"));
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  void* map = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot mmap ", path));
  }
  file->map_ = map;
  file->map_size_ = file_size;
  const uint8_t* base = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > kMaxHeaderBytes) {
    return fail(absl::StrCat("header length ", header_len, " exceeds the ", kMaxHeaderBytes,
                             "-byte limit"));
  }
  if (8 + header_len > file_size) {
    return fail(absl::StrCat("header length ", header_len, " extends beyond the end of the file (",
                             file_size, " bytes)"));
  }
  const uint8_t* header = base + 8;
  if (!IsValidUtf8(header, header_len)) return fail("header is not valid UTF-8");
  const char* header_chars = reinterpret_cast<const char*>(header);
  absl::StatusOr<Json> parsed = ParseHeader(header_chars, header_chars + header_len);
  if (!parsed.ok()) return fail(parsed.status().message());
  const Json& root = *parsed;
  if (!root.is_object()) {
    return fail(absl::StrCat("header must be a JSON object, got ", TypeName(root)));
  }

  const uint64_t data_len = file_size - 8 - header_len;
  const uint8_t* data = header + header_len;
  struct Range {
    uint64_t begin;
    uint64_t end;
    size_t index;  // into tensors
  };
  std::vector<TensorView> tensors;
  std::vector<Range> ranges;
  tensors.reserve(root.size());
  ranges.reserve(root.size());

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const Json& info = it.value();
    if (name == "__metadata__") {
      if (info.is_null()) continue;
      if (!info.is_object()) {
        return fail(absl::StrCat("__metadata__ must be an object of strings, got ",
                                 TypeName(info)));
      }
      for (auto m = info.begin(); m != info.end(); ++m) {
        if (!m.value().is_string()) {
          return fail(absl::StrCat("__metadata__ value of '", m.key(),
                                   "' must be a string, got ", TypeName(m.value())));
        }
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tfail = [&](absl::string_view message) {
      return fail(absl::StrCat("tensor '", name, "': ", message));
    };
    if (!info.is_object()) {
      return tfail(absl::StrCat("entry must be an object, got ", TypeName(info)));
    }
    TensorView view;
    view.name = name;

    auto dtype_it = info.find("dtype");
    if (dtype_it == info.end()) return tfail("missing 'dtype'");
    if (!dtype_it->is_string()) {
      return tfail(absl::StrCat("'dtype' must be a string, got ", TypeName(*dtype_it)));
    }
    const std::string dtype = dtype_it->get<std::string>();
    if (!ParseDtype(dtype, &view.dtype)) {
      if (IsKnownDtype(dtype)) {
        return tfail(absl::StrCat("dtype ", dtype,
                                  " is not supported (echokv loads F32, F16 and BF16)"));
      }
      return tfail(absl::StrCat("unknown dtype '", dtype, "'"));
    }

    auto shape_it = info.find("shape");
    if (shape_it == info.end()) return tfail("missing 'shape'");
    if (!shape_it->is_array()) {
      return tfail(absl::StrCat("'shape' must be an array, got ", TypeName(*shape_it)));
    }
    view.shape.reserve(shape_it->size());
    for (const Json& dim : *shape_it) {
      uint64_t d;
      if (!ToU64(dim, &d)) {
        return tfail(absl::StrCat("'shape' entries must be non-negative integers, got ",
                                  dim.dump()));
      }
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return tfail(absl::StrCat("shape dimension ", d, " is too large"));
      }
      view.shape.push_back(static_cast<int64_t>(d));
    }

    auto offsets_it = info.find("data_offsets");
    if (offsets_it == info.end()) return tfail("missing 'data_offsets'");
    if (!offsets_it->is_array() || offsets_it->size() != 2) {
      return tfail(absl::StrCat("'data_offsets' must be [begin, end], got ", offsets_it->dump()));
    }
    uint64_t begin, end;
    if (!ToU64((*offsets_it)[0], &begin) || !ToU64((*offsets_it)[1], &end)) {
      return tfail(absl::StrCat("'data_offsets' must be non-negative integers, got ",
                                offsets_it->dump()));
    }
    if (begin > end) {
      return tfail(absl::StrCat("data_offsets [", begin, ", ", end, "] end before they begin"));
    }
    if (end > data_len) {
      return tfail(absl::StrCat("data_offsets [", begin, ", ", end,
                                "] extend beyond the data area (", data_len, " bytes)"));
    }
    uint64_t nbytes;
    if (!CheckedByteSize(view.shape, DTypeSize(view.dtype), &nbytes)) {
      return tfail(absl::StrCat("shape ", ShapeString(view.shape), " of ", dtype,
                                " overflows when computing its byte size"));
    }
    if (nbytes != end - begin) {
      return tfail(absl::StrCat("shape ", ShapeString(view.shape), " of ", dtype, " needs ",
                                nbytes, " bytes but data_offsets [", begin, ", ", end,
                                "] span ", end - begin));
    }
    view.data = data + begin;
    view.nbytes = static_cast<size_t>(nbytes);
    ranges.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(view));
  }

  // Sorted by offsets, the ranges must tile [0, data_len) exactly.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const std::string* previous = nullptr;
  for (const Range& r : ranges) {
    const std::string& name = tensors[r.index].name;
    if (r.begin > expected) {
      return fail(absl::StrCat("gap of ", r.begin - expected, " bytes before tensor '", name,
                               "' (data_offsets begin at ", r.begin, ", previous data ends at ",
                               expected, ")"));
    }
    if (r.begin < expected) {
      return fail(absl::StrCat("tensor '", name, "' (data_offsets [", r.begin, ", ", r.end,
                               "]) overlaps tensor '", previous ? *previous : std::string(),
                               "' which ends at ", expected));
    }
    expected = r.end;
    previous = &name;
  }
  if (expected != data_len) {
    return fail(absl::StrCat(data_len - expected, " trailing bytes after the last tensor (data "
                             "area is ", data_len, " bytes, tensors cover ", expected, ")"));
  }

  file->tensors_.reserve(tensors.size());
  for (const Range& r : ranges) file->tensors_.push_back(std::move(tensors[r.index]));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  for (const TensorView& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------
// Checkpoint

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory not found: ", dir));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  auto add_all = [&ckpt](const SafetensorsFile& file) -> absl::Status {
    for (const TensorView& t : file.tensors()) {
      auto [it, inserted] = ckpt->index_.emplace(t.name, &t);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' appears in both ",
                                                       file.path(), " and another shard"));
      }
    }
    return absl::OkStatus();
  };

  const std::string single = dir + "/" + kSingleFile;
  if (IsRegularFile(single)) {
    ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single));
    ECHOKV_RETURN_IF_ERROR(add_all(*file));
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }

  const std::string index_path = dir + "/" + kIndexFile;
  if (IsRegularFile(index_path)) {
    auto ifail = [&index_path](absl::string_view message) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", message));
    };
    ECHOKV_ASSIGN_OR_RETURN(std::string text, ReadIndexFile(index_path));
    Json index;
    try {
      index = Json::parse(text);
    } catch (const Json::exception& e) {
      return ifail(absl::StrCat("invalid JSON: ", e.what()));
    }
    if (!index.is_object()) return ifail("expected a JSON object");
    auto wm = index.find("weight_map");
    if (wm == index.end()) return ifail("missing 'weight_map'");
    if (!wm->is_object()) {
      return ifail(absl::StrCat("'weight_map' must be an object, got ", TypeName(*wm)));
    }
    if (wm->empty()) return ifail("'weight_map' is empty");
    // shard file name -> tensor names the index assigns to it.
    std::map<std::string, std::set<std::string>> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return ifail(absl::StrCat("weight_map entry for tensor '", it.key(),
                                  "' must be a file name string, got ", TypeName(it.value())));
      }
      const std::string shard = it.value().get<std::string>();
      if (!IsPlainFileName(shard)) {
        return ifail(absl::StrCat("weight_map maps tensor '", it.key(), "' to shard '", shard,
                                  "', which is not a plain file name inside the checkpoint "
                                  "directory"));
      }
      shards[shard].insert(it.key());
    }
    for (const auto& [shard, names] : shards) {
      const std::string shard_path = dir + "/" + shard;
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
      if (!file.ok()) {
        return absl::Status(file.status().code(),
                            absl::StrCat("shard '", shard, "' named by ", index_path, ": ",
                                         file.status().message()));
      }
      for (const std::string& name : names) {
        if ((*file)->Find(name) == nullptr) {
          return ifail(absl::StrCat("weight_map maps tensor '", name, "' to shard '", shard,
                                    "', which does not contain it"));
        }
      }
      for (const TensorView& t : (*file)->tensors()) {
        if (names.count(t.name) == 0) {
          return ifail(absl::StrCat("shard '", shard, "' holds tensor '", t.name,
                                    "', which the weight_map does not assign to it"));
        }
      }
      ECHOKV_RETURN_IF_ERROR(add_all(**file));
      ckpt->files_.push_back(*std::move(file));
    }
    return ckpt;
  }

  // No safetensors: say so plainly when the directory holds a pickle checkpoint.
  std::vector<std::string> pickles;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (EndsWith(name, ".bin") || EndsWith(name, ".pt") || EndsWith(name, ".pth")) {
        pickles.push_back(name);
      }
    }
    closedir(d);
  }
  if (!pickles.empty()) {
    std::sort(pickles.begin(), pickles.end());
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": pickle checkpoints are not supported (found ", pickles.front(),
        "; convert to safetensors, e.g. model.save_pretrained(dir, safe_serialization=True))"));
  }
  return absl::NotFoundError(absl::StrCat(dir, ": no ", kSingleFile, " or ", kIndexFile));
}

const TensorView* Checkpoint::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------------------
// Writer

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto fail = [&path](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
  };
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return fail(absl::StrCat("invalid tensor name '", t.name, "'"));
    }
    if (!seen.insert(t.name).second) return fail(absl::StrCat("duplicate tensor '", t.name, "'"));
    uint64_t nbytes;
    if (!CheckedByteSize(t.shape, DTypeSize(t.dtype), &nbytes)) {
      return fail(absl::StrCat("tensor '", t.name, "' has an invalid shape ",
                               ShapeString(t.shape)));
    }
    if (nbytes != t.bytes.size()) {
      return fail(absl::StrCat("tensor '", t.name, "' of shape ", ShapeString(t.shape), " ",
                               DTypeName(t.dtype), " needs ", nbytes, " bytes, got ",
                               t.bytes.size()));
    }
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = std::string(DTypeName(t.dtype));
    info["shape"] = t.shape;
    info["data_offsets"] = {offset, offset + nbytes};
    header[t.name] = std::move(info);
    offset += nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // Invalid UTF-8 in a name or metadata value.
    return fail(absl::StrCat("cannot encode the header: ", e.what()));
  }
  // The reference writer pads the header with spaces so the data starts 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(n >> (8 * i));

  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot create ", tmp));
  }
  absl::Status s = WriteAll(fd, reinterpret_cast<const char*>(len_bytes), 8);
  if (s.ok()) s = WriteAll(fd, header_text.data(), header_text.size());
  for (const TensorToWrite& t : tensors) {
    if (!s.ok()) break;
    s = WriteAll(fd, t.bytes.data(), t.bytes.size());
  }
  if (s.ok() && fsync(fd) != 0) {
    int err = errno;
    s = absl::ErrnoToStatus(err, "fsync failed");
  }
  if (close(fd) != 0 && s.ok()) {
    int err = errno;
    s = absl::ErrnoToStatus(err, "close failed");
  }
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    s = absl::ErrnoToStatus(err, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  if (!s.ok()) {
    unlink(tmp.c_str());
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace echokv::model
