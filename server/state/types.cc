#include "server/state/types.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/state/session_id.h"

namespace echokv::state {
namespace {

constexpr absl::string_view kErrorKindPayloadUrl = "type.echokv.dev/echokv.state.ErrorKind";

bool ParseHexWord(absl::string_view s, uint64_t* out) {
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

bool IsKnownDType(uint8_t raw) { return raw >= 1 && raw <= 9; }

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (uint8_t raw = 1; raw <= 9; ++raw) {
    if (DTypeName(static_cast<DType>(raw)) == name) return static_cast<DType>(raw);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

absl::string_view MemoryModeName(MemoryMode mode) {
  switch (mode) {
    case MemoryMode::kTiered: return "tiered";
    case MemoryMode::kEvict: return "evict";
  }
  return "unknown";
}

absl::StatusOr<MemoryMode> MemoryModeFromName(absl::string_view name) {
  if (name == "tiered") return MemoryMode::kTiered;
  if (name == "evict") return MemoryMode::kEvict;
  return absl::InvalidArgumentError(
      absl::StrCat("memory mode \"", name, "\" is neither \"tiered\" nor \"evict\""));
}

std::string ModelFingerprint::ToHex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  uint64_t words[2] = {high, low};
  for (int w = 0; w < 2; ++w) {
    uint64_t v = words[w];
    for (int i = 15; i >= 0; --i, v >>= 4) s[16 * w + i] = kDigits[v & 0xf];
  }
  return s;
}

absl::StatusOr<ModelFingerprint> ModelFingerprint::FromHex(absl::string_view hex) {
  ModelFingerprint fp;
  if (hex.size() != 32 || !ParseHexWord(hex.substr(0, 16), &fp.high) ||
      !ParseHexWord(hex.substr(16), &fp.low)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model fingerprint \"", hex.substr(0, 64), "\" is not 32 lowercase hex digits"));
  }
  return fp;
}

absl::Status SavedSession::Validate() const {
  absl::Status id_ok = ValidateSessionId(id);
  if (!id_ok.ok()) return absl::InvalidArgumentError(absl::StrCat("id: ", id_ok.message()));
  if (tenant.size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("tenant: ", tenant.size(), " bytes, at most 1024"));
  }
  if (memory != MemoryMode::kTiered && memory != MemoryMode::kEvict) {
    return absl::InvalidArgumentError("memory: not a MemoryMode");
  }
  if (!compression_config.is_object()) {
    return absl::InvalidArgumentError("compression_config: must be a JSON object");
  }
  if (ttl < absl::ZeroDuration()) return absl::InvalidArgumentError("ttl: negative");
  if (next_position < 0) return absl::InvalidArgumentError("next_position: negative");
  return absl::OkStatus();
}

const BlobInfo* SegmentInfo::FindBlob(absl::string_view name) const {
  for (const BlobInfo& b : blobs) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

uint64_t SessionManifest::TotalSegmentBytes() const {
  uint64_t n = 0;
  for (const SegmentInfo& s : segments) n += s.file_bytes;
  return n;
}

absl::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kChecksum: return "checksum";
    case ErrorKind::kTruncated: return "truncated";
    case ErrorKind::kForeignModel: return "foreign_model";
    case ErrorKind::kUnknownVersion: return "unknown_version";
    case ErrorKind::kMissingSegment: return "missing_segment";
    case ErrorKind::kBadManifest: return "bad_manifest";
    case ErrorKind::kIo: return "io";
  }
  return "unknown";
}

std::optional<ErrorKind> ErrorKindOf(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  absl::optional<absl::Cord> payload = status.GetPayload(kErrorKindPayloadUrl);
  if (!payload) return std::nullopt;
  for (ErrorKind kind : kAllErrorKinds) {
    if (*payload == ErrorKindName(kind)) return kind;
  }
  return std::nullopt;
}

absl::Status WithErrorKind(absl::Status status, ErrorKind kind) {
  if (status.ok()) return status;
  status.SetPayload(kErrorKindPayloadUrl, absl::Cord(ErrorKindName(kind)));
  return status;
}

}  // namespace echokv::state
