// The durable state store: every session's manifest and segments under one directory,
// written so that an acknowledged turn survives kill -9 and a failed one leaves nothing
// behind. Torch-free and model-free: the engine hands it plain structs and raw bytes
// (types.h). Layout, byte formats and recovery rules: docs/ARCHITECTURE.md ("Durable
// session state").
//
//   state::StoreOptions options;
//   options.dir = "/var/lib/echokv";  options.model = fingerprint;  // fingerprint.h
//   ECHOKV_ASSIGN_OR_RETURN(auto store, state::StateStore::Create(options));
//   state::RecoveryResult found = store->OpenAll();      // at start: manifests, errors
//   ECHOKV_RETURN_IF_ERROR(store->WriteTurn(meta, segment));   // acknowledged when OK
//   ECHOKV_ASSIGN_OR_RETURN(auto reader, store->OpenSession(id));  // payloads verified
//   ECHOKV_RETURN_IF_ERROR(reader->Read(0, "cold.k.0", offset, dst));  // chunked reads
//
// Threads: every method may be called from any thread. Calls for different sessions run
// in parallel; calls for one session are serialized by a per-session lock. OpenAll must
// run alone (at start, before other calls).
#ifndef ECHOKV_SERVER_STATE_STORE_H_
#define ECHOKV_SERVER_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/state/file_ops.h"
#include "server/state/observer.h"
#include "server/state/types.h"

namespace echokv::state {

class SnapshotExporter;
class SnapshotImporter;

// --fsync always|none.
enum class FsyncPolicy {
  kAlways,  // fsync segment, manifest and directory before a write returns OK
  kNone,    // never fsync: survives a process crash (kill -9), not a power loss
};
absl::string_view FsyncPolicyName(FsyncPolicy policy);  // "always" / "none"
absl::StatusOr<FsyncPolicy> FsyncPolicyFromName(absl::string_view name);

struct StoreOptions {
  std::string dir;                    // created (with parents) when missing
  ModelFingerprint model;             // this server's model (fingerprint.h)
  FsyncPolicy fsync = FsyncPolicy::kAlways;
  StateLimits limits;
  FileOps* file_ops = nullptr;        // not owned; nullptr = the real POSIX calls
  StateObserver* observer = nullptr;  // not owned; nullptr = none

  absl::Status Validate() const;      // names the bad field
};

// What OpenAll found.
struct RecoveryResult {
  std::vector<SessionManifest> sessions;  // every valid session (blob tables filled), by id
  std::vector<StateError> errors;         // every refused session; its files are untouched
  // Never-acknowledged leftovers that were removed: staging directories of creates and
  // imports, half-deleted sessions, segment files no manifest lists, manifest temp files.
  std::vector<std::string> removed;
  // Entries under sessions/ that are not session ids (left alone).
  std::vector<std::string> ignored;
};

// Read access to one session's segments, payload checksums verified. Holds the segment
// files open (one descriptor per segment: write a superseding segment now and then so a
// session does not collect thousands), so it keeps reading the same bytes even after a
// later superseding turn removed them. Thread-safe (pread); must not outlive its store.
class SessionReader {
 public:
  ~SessionReader();
  SessionReader(const SessionReader&) = delete;
  SessionReader& operator=(const SessionReader&) = delete;

  // The manifest as on disk (meta, model, segments with blob tables), oldest segment first.
  const SessionManifest& manifest() const { return manifest_; }

  // Copies bytes [offset, offset + dst.size()) of blob `blob` of segment number
  // `segment` (an index into manifest().segments) into dst. Reads through the page cache;
  // nothing else of the file is read. OUT_OF_RANGE past the blob's end, NOT_FOUND for an
  // unknown blob or segment index.
  absl::Status Read(size_t segment, absl::string_view blob, uint64_t offset,
                    absl::Span<char> dst) const;
  // The whole blob.
  absl::StatusOr<std::string> ReadAll(size_t segment, absl::string_view blob) const;

  struct BlobRef {
    size_t segment = 0;            // index into manifest().segments
    const BlobInfo* blob = nullptr;
  };
  // The newest segment holding `blob` ("latest wins" blobs such as hot positions);
  // NOT_FOUND when none does.
  absl::StatusOr<BlobRef> FindLatest(absl::string_view blob) const;
  // Every segment holding `blob`, oldest first (per-turn blobs such as cold K of a layer).
  std::vector<BlobRef> FindAll(absl::string_view blob) const;

 private:
  friend class StateStore;
  SessionReader(FileOps* ops, SessionManifest manifest, std::vector<int> fds,
                std::vector<std::string> paths);

  FileOps* ops_;                    // the store's; not owned
  SessionManifest manifest_;        // what the reader serves
  std::vector<int> fds_;            // one open segment file per manifest_.segments entry
  std::vector<std::string> paths_;  // their paths (messages)
};

class StateStore {
 public:
  // Creates DIR (and DIR/sessions), writes DIR/FORMAT when new (refuses an unknown layout
  // version: FAILED_PRECONDITION), takes an exclusive lock on DIR/LOCK (a second store on
  // the same dir: FAILED_PRECONDITION) and checks that DIR is writable (a probe file).
  // Errors name the directory and the cause.
  static absl::StatusOr<std::unique_ptr<StateStore>> Create(const StoreOptions& options);
  ~StateStore();

  const StoreOptions& options() const { return options_; }

  // Recovery: scans DIR/sessions and reads every manifest and segment header (no
  // payloads). Valid sessions become known to the store (WriteTurn appends to them);
  // refused ones are reported with their kind and left untouched; leftovers of
  // unacknowledged work are removed (see RecoveryResult). Reports each error's kind to the
  // observer.
  RecoveryResult OpenAll();

  // Acknowledges one turn: writes segment seg-<seq>.ekv (seq = last + 1, 1 for a new
  // session) and atomically replaces the session's manifest with `meta` + the segment
  // list (all earlier segments dropped when segment.supersedes_earlier; their files are
  // removed afterwards). A session id the store does not know is created (its directory
  // appears atomically, ALREADY_EXISTS if one is on disk, e.g. a refused session).
  // Contract: segment.token_end == meta.tokens.size(), and unless it supersedes,
  // segment.token_begin == the previous segment's token_end (0 for a new session).
  // On any error the files are exactly as before. ENOSPC/EDQUOT -> RESOURCE_EXHAUSTED,
  // other I/O errors -> INTERNAL, bad input -> INVALID_ARGUMENT naming the field.
  absl::Status WriteTurn(const SavedSession& meta, const NewSegment& segment);

  // Replaces only the manifest's meta (timestamps, ttl, config; the token history must
  // keep its length). NOT_FOUND for an unknown session. Same atomicity as WriteTurn.
  absl::Status UpdateSession(const SavedSession& meta);

  // Removes the session's directory (DeleteSession, TTL expiry). Atomic: the directory
  // is first renamed out of sessions/ (then it is gone for recovery), then its files are
  // removed. NOT_FOUND for a session the store does not know.
  absl::Status DeleteSession(absl::string_view id);

  // Writes (fsyncs, with FsyncPolicy::kAlways) and removes a small file in DIR/sessions:
  // OK when the directory takes new files now. The error of the write otherwise (errno
  // attached, ErrnoOf), prefixed "not writable: ". Create runs it once; the engine runs
  // it to tell an unwritable state dir (health NOT_SERVING) from a full one.
  absl::Status ProbeWritable();

  // Opens a known session for reading: re-reads its manifest, checks it against what the
  // store knows, verifies every segment payload checksum not verified before (segments
  // this store wrote or imported count as verified). DATA_LOSS (kind attached, observer
  // told) on a mismatch; the files are left untouched and the session refuses writes
  // (FAILED_PRECONDITION) until deleted.
  absl::StatusOr<std::unique_ptr<SessionReader>> OpenSession(absl::string_view id);

  // Ids of the sessions the store knows, sorted.
  std::vector<std::string> SessionIds() const;
  bool Contains(absl::string_view id) const;

  // A snapshot stream of a known session (snapshot.h), read in chunks of at most
  // `chunk_bytes`. The stream is consistent even if the session changes meanwhile.
  absl::StatusOr<std::unique_ptr<SnapshotExporter>> Export(absl::string_view id,
                                                            size_t chunk_bytes = 1 << 20);
  // Starts an import (snapshot.h): feed chunks, then Finish(id) commits atomically.
  std::unique_ptr<SnapshotImporter> BeginImport();

 private:
  friend class SnapshotExporter;
  friend class SnapshotImporter;

  // One known session. Its fields are guarded by `mu`; the map entry by the store's mu_.
  struct Slot {
    absl::Mutex mu;
    bool exists ABSL_GUARDED_BY(mu) = false;  // on disk (false while its first WriteTurn runs)
    bool bad ABSL_GUARDED_BY(mu) = false;     // failed verification: refuses writes
    bool deleted ABSL_GUARDED_BY(mu) = false; // removed from the map by DeleteSession
    std::vector<SegmentInfo> segments ABSL_GUARDED_BY(mu);  // as in the manifest
    std::vector<bool> verified ABSL_GUARDED_BY(mu);         // payload checksum known good
  };

  explicit StateStore(StoreOptions options);
  // Create's work: directories, lock, FORMAT, write probe.
  absl::Status Open();

  std::string SessionsDir() const;
  std::string SessionDir(absl::string_view id) const;
  static std::string SegmentFileName(uint64_t seq);
  // A fresh name under sessions/ for a staging (".tmp-") or deleted (".del-") directory.
  std::string FreshName(absl::string_view prefix, absl::string_view id);

  // File helpers; each error names the path (ErrnoToStatus).
  absl::Status WriteFileParts(const std::string& path, absl::Span<const absl::string_view> parts,
                              uint64_t* bytes_written);
  absl::Status FsyncDir(const std::string& path);
  absl::Status MaybeFsyncDir(const std::string& path);
  absl::StatusOr<std::string> ReadWholeFile(const std::string& path, uint64_t max_bytes,
                                            ErrorKind missing_kind);
  // Removes a flat directory and its files; best effort, reports to OnCleanupFailed.
  void RemoveTree(const std::string& path);
  void Cleanup(const std::string& path);  // unlink, best effort

  // Reads and checks one session directory (manifest + segment headers).
  absl::StatusOr<SessionManifest> LoadSession(const std::string& id,
                                              std::vector<std::string>* removed,
                                              std::string* fault_path);
  // Reads segment `info`'s header from an open fd; fills info->blobs.
  absl::Status LoadSegmentHeader(int fd, const std::string& path, SegmentInfo* info);
  absl::Status VerifyPayload(int fd, const std::string& path, const SegmentInfo& info);

  absl::Status DoWriteTurn(const SavedSession& meta, const NewSegment& segment, uint64_t* bytes);
  absl::Status DoUpdate(const SavedSession& meta, uint64_t* bytes);
  absl::Status DoDelete(absl::string_view id);
  // Replaces an existing session's manifest atomically (tmp, fsync, rename, fsync dir;
  // rolled back when the directory fsync fails).
  absl::Status ReplaceManifest(const std::string& dir, absl::string_view bytes,
                               uint64_t* bytes_written);
  // INVALID_ARGUMENT when recovery would refuse the manifest `bytes` for its size.
  absl::Status CheckManifestSize(absl::string_view bytes, absl::string_view id) const;
  // Commits a staging directory holding a complete session as sessions/<id>.
  absl::Status CommitStaging(const std::string& staging, absl::string_view id);

  std::shared_ptr<Slot> FindSlot(absl::string_view id) const;
  void ReportError(ErrorKind kind);
  void ReportWrite(WriteOp op, absl::Time start, uint64_t bytes, const absl::Status& status);

  const StoreOptions options_;
  PosixFileOps posix_;       // used when options_.file_ops is null
  FileOps* ops_;             // options_.file_ops or &posix_
  int lock_fd_ = -1;         // DIR/LOCK, flock'ed for the store's lifetime
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  // Staging directory names of imports in progress (OpenAll leaves them alone).
  absl::flat_hash_set<std::string> staging_ ABSL_GUARDED_BY(mu_);
  uint64_t name_counter_ ABSL_GUARDED_BY(mu_) = 0;  // FreshName uniqueness
};

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_STORE_H_
