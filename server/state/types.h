// The plain values of the durable state store (server/state/): what a session's manifest
// holds, what one segment (one acknowledged turn) holds, the model fingerprint, and the
// kinds of errors that recovery reports. No torch here: tensors travel as raw bytes plus a
// dtype and a shape, filled by the engine. The byte layouts are in docs/ARCHITECTURE.md
// ("Durable session state").
//
//   state::SavedSession meta;               // the engine fills it
//   meta.id = id; meta.memory = state::MemoryMode::kTiered; meta.tokens = tokens;
//   state::NewSegment seg{/*token_begin=*/0, /*token_end=*/int64_t(tokens.size())};
//   seg.blobs.push_back({"cold.k.0", state::DType::kFloat32, {G, m, d}, bytes_view});
//   ECHOKV_RETURN_IF_ERROR(store->WriteTurn(meta, seg));
#ifndef ECHOKV_SERVER_STATE_TYPES_H_
#define ECHOKV_SERVER_STATE_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include <nlohmann/json.hpp>

namespace echokv::state {

// Element type of a blob. The numeric values are part of the on-disk format (never
// renumber; append new ones).
enum class DType : uint8_t {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kBool = 9,
};

// Bytes per element; 0 for a value that is not a DType.
size_t DTypeSize(DType dtype);
// "float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64", "bool".
absl::string_view DTypeName(DType dtype);
// Inverse of DTypeName; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);
// True when `raw` (a byte read from a file) is one of the enumerators.
bool IsKnownDType(uint8_t raw);

// The session's memory mode (docs/SESSION_MEMORY.md): "tiered" or "evict".
enum class MemoryMode { kTiered, kEvict };
absl::string_view MemoryModeName(MemoryMode mode);  // "tiered" / "evict"
absl::StatusOr<MemoryMode> MemoryModeFromName(absl::string_view name);

// 128-bit fingerprint of the model a session belongs to (see fingerprint.h). A store
// only loads and imports sessions whose fingerprint equals its own.
struct ModelFingerprint {
  uint64_t low = 0;
  uint64_t high = 0;

  bool operator==(const ModelFingerprint& o) const { return low == o.low && high == o.high; }
  bool operator!=(const ModelFingerprint& o) const { return !(*this == o); }
  // 32 lowercase hex digits, high word first.
  std::string ToHex() const;
  static absl::StatusOr<ModelFingerprint> FromHex(absl::string_view hex);
};

// Everything about a session that is not KV bytes; the engine fills it on every turn and
// the store writes it into the session's manifest. The store checks its fields
// (Validate) but does not interpret compression_config.
struct SavedSession {
  std::string id;                  // IsValidSessionId (session_id.h)
  std::string tenant;              // opaque, may be empty (at most 1024 bytes)
  MemoryMode memory = MemoryMode::kTiered;
  nlohmann::json compression_config = nlohmann::json::object();  // an object, opaque
  absl::Time created = absl::UnixEpoch();
  absl::Time last_used = absl::UnixEpoch();
  absl::Duration ttl = absl::InfiniteDuration();  // idle expiry; infinite = never
  std::vector<int32_t> tokens;     // the whole token history
  int64_t next_position = 0;       // position of the next token (>= 0)

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

// Where one named blob lies inside a segment's payload (read back from the header).
struct BlobInfo {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the payload; a multiple of 64
  uint64_t bytes = 0;   // = prod(shape) * DTypeSize(dtype)
};

// One blob to write: a non-owning view of bytes the caller keeps alive during WriteTurn.
struct BlobView {
  std::string name;            // 1..255 bytes of [A-Za-z0-9._:/-], unique in the segment
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // rank <= 8, every dim >= 0
  absl::string_view data;      // exactly prod(shape) * DTypeSize(dtype) bytes
};

// The output of one mutation (turn). Blob names are the engine's business; the store
// keeps them in order and never interprets them.
struct NewSegment {
  int64_t token_begin = 0;  // the turn's token range [token_begin, token_end)
  int64_t token_end = 0;
  // True: this segment holds everything needed (a full snapshot), so the manifest drops
  // every earlier segment and their files are removed once the new manifest is in place.
  bool supersedes_earlier = false;
  std::vector<BlobView> blobs;
};

// One segment as listed in a manifest, with its blob table (from the segment header).
struct SegmentInfo {
  uint64_t seq = 0;           // 1, 2, 3, ... per session; never reused
  int64_t token_begin = 0;
  int64_t token_end = 0;
  bool supersedes_earlier = false;
  uint64_t payload_bytes = 0;
  uint64_t file_bytes = 0;    // header + payload
  uint64_t payload_xxh3 = 0;  // XXH3-64 of the payload
  uint64_t header_xxh3 = 0;   // XXH3-64 of the fixed header (its own checksum field)
  std::vector<BlobInfo> blobs;

  // The blob called `name`, or nullptr.
  const BlobInfo* FindBlob(absl::string_view name) const;
};

// A session as the store knows it: the engine's fields, the model it belongs to and the
// segments that make up its state, oldest first.
struct SessionManifest {
  SavedSession meta;
  ModelFingerprint model;
  std::vector<SegmentInfo> segments;

  uint64_t TotalSegmentBytes() const;  // sum of file_bytes
};

// Why a session (or a file) was refused. Names are metric label values.
enum class ErrorKind {
  kChecksum,        // a checksum or magic mismatch, or a segment that disagrees with the manifest
  kTruncated,       // a file or stream shorter than its header says
  kForeignModel,    // written for another model fingerprint
  kUnknownVersion,  // a format version this build does not read
  kMissingSegment,  // the manifest lists a segment file that is not there
  kBadManifest,     // missing manifest, bad JSON, a field out of range, wrong session id
  kIo,              // the operating system refused a read
};
// "checksum", "truncated", "foreign_model", "unknown_version", "missing_segment",
// "bad_manifest", "io".
absl::string_view ErrorKindName(ErrorKind kind);
inline constexpr ErrorKind kAllErrorKinds[] = {
    ErrorKind::kChecksum,       ErrorKind::kTruncated,      ErrorKind::kForeignModel,
    ErrorKind::kUnknownVersion, ErrorKind::kMissingSegment, ErrorKind::kBadManifest,
    ErrorKind::kIo};

// A status of the state store's readers carries its ErrorKind as a payload; this returns
// it (nullopt for OK or a status without one). Codes: checksum/truncated/missing_segment/
// bad_manifest -> DATA_LOSS, foreign_model/unknown_version -> FAILED_PRECONDITION,
// io -> INTERNAL (RESOURCE_EXHAUSTED for ENOSPC/EDQUOT).
std::optional<ErrorKind> ErrorKindOf(const absl::Status& status);
// `status` with `kind` attached (what ErrorKindOf returns).
absl::Status WithErrorKind(absl::Status status, ErrorKind kind);

// Size limits for what the store reads (from disk or from a snapshot stream): a damaged
// or malicious file cannot make it allocate more than these. Payloads are never held in
// memory whole (they stream to disk or are read in caller-sized chunks).
struct StateLimits {
  uint64_t max_manifest_json_bytes = 64ull << 20;  // the manifest's JSON part
  uint64_t max_tokens = 1ull << 28;                // token history length (4 B each)
  uint64_t max_segments = 1ull << 16;              // segments listed by one manifest
  uint32_t max_blob_table_bytes = 16u << 20;       // one segment header's blob table
  uint32_t max_blobs = 1u << 16;                   // blobs in one segment
  uint64_t max_snapshot_bytes = 1ull << 40;        // one imported snapshot, all of it
};

// One refused session found by recovery (StateStore::OpenAll).
struct StateError {
  ErrorKind kind = ErrorKind::kIo;
  std::string session_id;  // the directory name
  std::string path;        // the file at fault (or the session directory)
  absl::Status status;     // the reason, naming the file
};

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_TYPES_H_
