// Session snapshots for ExportSession / ImportSession: one self-describing byte stream =
// a 64-byte stream header, the session's manifest file, each segment file (all in the
// on-disk formats), and a 32-byte trailer with a checksum of everything before it
// (docs/ARCHITECTURE.md, "Snapshot stream"). Produced in chunks and parsed incrementally,
// so a large session streams without ever being one buffer in memory.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto exporter, store->Export(id));
//   std::string chunk;
//   for (;;) {
//     ECHOKV_ASSIGN_OR_RETURN(bool more, exporter->Next(&chunk));
//     if (!more) break;
//     writer->Write(chunk);
//   }
//
//   auto importer = other_store->BeginImport();
//   while (reader->Read(&chunk)) ECHOKV_RETURN_IF_ERROR(importer->Feed(chunk));
//   ECHOKV_ASSIGN_OR_RETURN(state::SessionManifest m, importer->Finish(/*id=*/""));
//
// Import errors (nothing is created on any of them):
//   not a snapshot (bad magic), a truncated stream, bytes after the end, impossible
//   header fields, a bad target id                               -> INVALID_ARGUMENT
//   another model's fingerprint, an unknown format version      -> FAILED_PRECONDITION
//   a checksum mismatch anywhere, parts that disagree            -> DATA_LOSS
//   the target id exists                                         -> ALREADY_EXISTS
//   over StateLimits (snapshot bytes, manifest size, segments)   -> RESOURCE_EXHAUSTED
//   disk full / I/O error while writing                          -> RESOURCE_EXHAUSTED / INTERNAL
// Truncation is INVALID_ARGUMENT, not DATA_LOSS: every byte that arrived was checked and
// is intact, the client simply sent too few (an interrupted upload; resending the whole
// file fixes it). DATA_LOSS means bytes that arrived are wrong.
#ifndef ECHOKV_SERVER_STATE_SNAPSHOT_H_
#define ECHOKV_SERVER_STATE_SNAPSHOT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/state/format.h"
#include "server/state/store.h"
#include "server/state/types.h"

namespace echokv::state {

// Produces one session's snapshot (StateStore::Export). Holds the session's files open,
// so later turns or a delete do not change the stream. Not thread-safe; must not outlive
// its store.
class SnapshotExporter {
 public:
  ~SnapshotExporter();
  SnapshotExporter(const SnapshotExporter&) = delete;
  SnapshotExporter& operator=(const SnapshotExporter&) = delete;

  // Replaces *chunk with the next 1..chunk_bytes bytes and returns true, or returns false
  // (chunk empty) once the stream is complete. Segment payloads are checked against their
  // checksums as they are read: DATA_LOSS on a mismatch (the stream must be discarded).
  absl::StatusOr<bool> Next(std::string* chunk);
  // Length of the whole stream, known before the first chunk.
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  friend class StateStore;
  // One piece of the stream: bytes in memory, or a whole segment file.
  struct Part {
    std::string bytes;            // header, manifest or trailer
    int fd = -1;                  // a segment file (owned)
    std::string path;             // its path (messages)
    uint64_t size = 0;            // bytes of this part
    uint64_t payload_offset = 0;  // segment: where its payload starts
    uint64_t payload_xxh3 = 0;    // segment: expected payload checksum
  };
  SnapshotExporter(FileOps* ops, StateObserver* observer, size_t chunk_bytes,
                   std::vector<Part> parts);

  FileOps* ops_;                      // the store's; not owned
  StateObserver* observer_;           // may be null
  size_t chunk_bytes_;                // largest chunk Next returns
  std::vector<Part> parts_;           // header, manifest, segments..., trailer (built last)
  uint64_t total_bytes_ = 0;          // sum of part sizes
  size_t index_ = 0;                  // current part
  uint64_t offset_ = 0;               // bytes of the current part already returned
  uint64_t emitted_ = 0;              // bytes returned before the trailer
  internal::Xxh3Stream stream_hash_;  // of every byte before the trailer
  std::unique_ptr<internal::Xxh3Stream> payload_hash_;  // current segment's payload
  absl::Status status_;               // sticky error
};

// Parses a snapshot incrementally and recreates the session (StateStore::BeginImport).
// Segment payloads stream straight into a staging directory; memory stays bounded by
// StateLimits (manifest, one blob table) whatever the stream says. Destroying an importer
// that did not Finish removes everything it wrote. Not thread-safe; must not outlive its
// store.
class SnapshotImporter {
 public:
  ~SnapshotImporter();
  SnapshotImporter(const SnapshotImporter&) = delete;
  SnapshotImporter& operator=(const SnapshotImporter&) = delete;

  // Consumes the next bytes of the stream (chunks of any size, including empty). The
  // first error is sticky: later calls return it.
  absl::Status Feed(absl::string_view chunk);
  // The snapshot's manifest once its part of the stream has been parsed and checked
  // (blob tables fill in as segments arrive), else nullptr: lets the caller apply its
  // admission limits (sessions, cold bytes = TotalSegmentBytes()) early and drop the
  // importer to refuse.
  const SessionManifest* manifest() const {
    return stage_ > Stage::kManifest ? &manifest_ : nullptr;
  }
  // After the last chunk: checks that the stream was complete and commits the session
  // atomically as `id` (empty: the snapshot's own id). `edit`, when given, may change the
  // meta first (ttl, last_used, tenant, ...; not the id or the token history) or refuse
  // with a status that Finish returns (nothing is created). Returns the committed
  // manifest (blob tables filled); the store then knows the session (payloads verified).
  absl::StatusOr<SessionManifest> Finish(
      absl::string_view id = "", const std::function<absl::Status(SavedSession&)>& edit = nullptr);
  uint64_t bytes_received() const { return received_; }

 private:
  friend class StateStore;
  enum class Stage { kHeader, kManifest, kSegmentFixed, kSegmentTable, kSegmentPayload, kTrailer, kDone };
  explicit SnapshotImporter(StateStore* store);

  absl::Status Fail(absl::Status status);  // makes `status` sticky, removes staging
  void Abort();                            // closes the open file, removes staging
  absl::Status OnPart();                   // a buffered part is complete
  absl::Status StartSegment();
  absl::Status OnSegmentTable();
  absl::Status FinishSegment();
  absl::Status WriteToSegment(absl::string_view bytes);
  std::string Where() const;               // where in the stream we are, for messages

  StateStore* store_;                 // not owned
  absl::Status status_;               // sticky error
  Stage stage_ = Stage::kHeader;
  std::string pending_;               // bytes of the current buffered part
  uint64_t need_ = internal::kSnapshotHeaderBytes;  // bytes the current part needs
  uint64_t received_ = 0;             // bytes fed so far
  uint64_t hashed_ = 0;               // bytes before the trailer seen so far
  uint64_t expected_total_ = 0;       // stream length the header + manifest imply
  internal::Xxh3Stream stream_hash_;  // of every byte before the trailer
  internal::SnapshotHeader header_;
  SessionManifest manifest_;          // decoded manifest (blob tables filled as we go)
  size_t segment_ = 0;                // index of the segment being read
  internal::SegmentFixed fixed_;      // its fixed header
  std::unique_ptr<internal::Xxh3Stream> payload_hash_;  // its payload so far
  uint64_t payload_left_ = 0;         // its payload bytes still to come
  int fd_ = -1;                       // its staging file
  std::string segment_path_;          // that file's path
  std::string staging_name_;          // name of the staging dir under sessions/ ("" = none)
  std::string staging_;               // its path
  bool committed_ = false;            // Finish succeeded
};

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_SNAPSHOT_H_
