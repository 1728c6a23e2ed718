// Byte layouts of the state store's files and snapshot stream (internal; the table is in
// docs/ARCHITECTURE.md, "Durable session state"). Everything is little-endian; checksums
// are XXH3-64 (seed 0) from Debian's libxxhash. Decoders check lengths before reading,
// attach an ErrorKind (types.h) to every error, and never allocate more than the
// StateLimits allow.
//
//   std::string bytes = internal::EncodeManifest(manifest);
//   auto back = internal::DecodeManifest(bytes, fingerprint, limits);   // == manifest
#ifndef ECHOKV_SERVER_STATE_FORMAT_H_
#define ECHOKV_SERVER_STATE_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/state/types.h"

namespace echokv::state::internal {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr absl::string_view kSegmentMagic = "ECHOKVSG";
inline constexpr absl::string_view kManifestMagic = "ECHOKVMF";
inline constexpr absl::string_view kSnapshotMagic = "ECHOKVSN";
inline constexpr absl::string_view kTrailerMagic = "ECHOKVEN";

inline constexpr size_t kSegmentFixedBytes = 128;
inline constexpr size_t kManifestFixedBytes = 64;
inline constexpr size_t kSnapshotHeaderBytes = 64;
inline constexpr size_t kSnapshotTrailerBytes = 32;
inline constexpr uint64_t kBlobAlignment = 64;  // payload offsets (and the payload start)
inline constexpr uint32_t kMaxRank = 8;
inline constexpr size_t kMaxBlobNameBytes = 255;
inline constexpr uint32_t kSegmentFlagSupersedes = 1;

uint64_t Xxh3(absl::string_view bytes);

// Whether a checksum stored in the bytes matches the one computed over them. Fuzzing
// builds (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, tests/fuzz) accept any value, so
// mutated inputs reach the parsers behind the checksums instead of all stopping at the
// first one. Every read path compares through here.
inline bool ChecksumMatches(uint64_t computed, uint64_t stored) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  return true;
#else
  return computed == stored;
#endif
}
uint64_t AlignUp(uint64_t n, uint64_t a);

// Streaming XXH3-64 (wraps XXH3_state_t).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(absl::string_view bytes);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t*, owned
};

// A status with the code that goes with `kind` (see ErrorKindOf) and the kind attached.
absl::Status KindError(ErrorKind kind, absl::string_view message);

// OK, or INVALID_ARGUMENT naming the blob, for a blob name of 1..255 bytes of
// [A-Za-z0-9._:/-].
absl::Status ValidateBlobName(absl::string_view name);
// prod(shape) * DTypeSize(dtype), or INVALID_ARGUMENT on a negative dim, a rank over 8 or
// an overflow of 2^62.
absl::StatusOr<uint64_t> BlobBytes(DType dtype, const std::vector<int64_t>& shape);

// ---- segment file ----

// The fixed 128-byte header of a segment file.
struct SegmentFixed {
  uint32_t version = kFormatVersion;
  uint32_t flags = 0;
  ModelFingerprint model;
  uint64_t seq = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  uint32_t blob_count = 0;
  uint32_t table_bytes = 0;
  uint64_t payload_offset = 0;  // AlignUp(128 + table_bytes, 64)
  uint64_t payload_bytes = 0;
  uint64_t payload_xxh3 = 0;
  uint64_t table_xxh3 = 0;
  uint64_t header_xxh3 = 0;  // of bytes [0, 120)

  uint64_t file_bytes() const { return payload_offset + payload_bytes; }
};

// Lays the blobs out (64-byte aligned, in order) and returns the whole header: fixed part,
// blob table and zero padding up to payload_offset. `fixed` gets every derived field
// (blob_count, table_bytes, payload_offset, payload_bytes, table_xxh3, header_xxh3);
// the caller sets version/flags/model/seq/tokens and payload_xxh3 beforehand. `layout`
// receives each blob's BlobInfo.
absl::StatusOr<std::string> EncodeSegmentHeader(const std::vector<BlobView>& blobs,
                                                SegmentFixed* fixed,
                                                std::vector<BlobInfo>* layout);

// Decodes the first 128 bytes of a segment (`bytes.size()` must be >= 128). Checks in
// this order: magic (kChecksum), version (kUnknownVersion), header checksum (kChecksum),
// reserved bytes and lengths (kChecksum), fingerprint == `expected` (kForeignModel).
// `what` names the file in messages.
absl::StatusOr<SegmentFixed> DecodeSegmentFixed(absl::string_view bytes,
                                                const ModelFingerprint& expected,
                                                const StateLimits& limits,
                                                absl::string_view what);
// Decodes the blob table + padding (bytes [128, payload_offset) of the file) of a decoded
// fixed header: table checksum, every entry, the canonical layout, zero padding.
absl::StatusOr<std::vector<BlobInfo>> DecodeBlobTable(absl::string_view bytes,
                                                      const SegmentFixed& fixed,
                                                      absl::string_view what);

// ---- manifest file ----

struct ManifestFixed {
  uint32_t version = kFormatVersion;
  ModelFingerprint model;
  uint64_t json_bytes = 0;
  uint64_t token_count = 0;

  uint64_t file_bytes() const { return kManifestFixedBytes + AlignUp(json_bytes, 4) + 4 * token_count + 8; }
};

// The whole manifest file for `manifest` (meta, model, segments; blob tables are not in
// the manifest, they live in the segment headers). INVALID_ARGUMENT when a string is not
// UTF-8 (JSON cannot hold it).
absl::StatusOr<std::string> EncodeManifest(const SessionManifest& manifest);
// The first 64 bytes: magic, version, header checksum, limits, fingerprint (as for
// segments).
absl::StatusOr<ManifestFixed> DecodeManifestFixed(absl::string_view bytes,
                                                  const ModelFingerprint& expected,
                                                  const StateLimits& limits,
                                                  absl::string_view what);
// The whole file: fixed header, size (kTruncated when short, kChecksum when longer), body
// checksum, JSON fields and segment list invariants (kBadManifest). Blob tables stay
// empty.
absl::StatusOr<SessionManifest> DecodeManifest(absl::string_view bytes,
                                               const ModelFingerprint& expected,
                                               const StateLimits& limits,
                                               absl::string_view what);

// Checks that `segments` are in increasing seq order with contiguous token ranges
// ending at `token_count` (kBadManifest otherwise).
absl::Status ValidateSegmentChain(const std::vector<SegmentInfo>& segments, uint64_t token_count,
                                  absl::string_view what);

// ---- snapshot stream ----

struct SnapshotHeader {
  uint32_t version = kFormatVersion;
  ModelFingerprint model;
  uint64_t manifest_bytes = 0;
  uint64_t segment_count = 0;
};
std::string EncodeSnapshotHeader(const SnapshotHeader& header);
// Magic (INVALID_ARGUMENT: not a snapshot), version (FAILED_PRECONDITION), checksum
// (DATA_LOSS), fingerprint (FAILED_PRECONDITION).
absl::StatusOr<SnapshotHeader> DecodeSnapshotHeader(absl::string_view bytes,
                                                    const ModelFingerprint& expected);
// Trailer: magic, bytes before it, XXH3-64 of all bytes before it, own checksum.
std::string EncodeSnapshotTrailer(uint64_t bytes_before, uint64_t stream_xxh3);
absl::Status CheckSnapshotTrailer(absl::string_view bytes, uint64_t bytes_before,
                                  uint64_t stream_xxh3);

// ---- little-endian helpers ----
void PutU16(std::string* out, uint16_t v);
void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
uint16_t GetU16(const char* p);
uint32_t GetU32(const char* p);
uint64_t GetU64(const char* p);

}  // namespace echokv::state::internal

#endif  // ECHOKV_SERVER_STATE_FORMAT_H_
