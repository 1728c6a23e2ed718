// StateStore recovery at start (OpenAll): docs/ARCHITECTURE.md "Recovery rules".
#include "server/state/store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "server/state/format.h"
#include "server/state/session_id.h"
#include "server/state/snapshot.h"
#include "server/state/store_internal.h"

namespace echokv::state {

using namespace store_internal;  // NOLINT: this file is part of StateStore

// ---------------- recovery ----------------

absl::Status StateStore::LoadSegmentHeader(int fd, const std::string& path, SegmentInfo* info) {
  struct stat st;
  if (int rc = ops_->Stat(path, fd, &st); rc < 0) return IoError(-rc, "stat", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string fixed_bytes(std::min<uint64_t>(size, internal::kSegmentFixedBytes), '\0');
  int64_t n = ops_->Pread(fd, fixed_bytes.data(), fixed_bytes.size(), 0);
  if (n < 0) return IoError(static_cast<int>(-n), "read", path);
  fixed_bytes.resize(static_cast<size_t>(n));
  ECHOKV_ASSIGN_OR_RETURN(internal::SegmentFixed fixed,
                          internal::DecodeSegmentFixed(fixed_bytes, options_.model, options_.limits, path));
  const char* mismatch = nullptr;
  if (fixed.header_xxh3 != info->header_xxh3) mismatch = "header checksum";
  else if (fixed.seq != info->seq) mismatch = "seq";
  else if (fixed.token_begin != info->token_begin || fixed.token_end != info->token_end) mismatch = "token range";
  else if (((fixed.flags & internal::kSegmentFlagSupersedes) != 0) != info->supersedes_earlier) mismatch = "supersedes flag";
  else if (fixed.payload_bytes != info->payload_bytes || fixed.file_bytes() != info->file_bytes) mismatch = "length";
  else if (fixed.payload_xxh3 != info->payload_xxh3) mismatch = "payload checksum";
  if (mismatch != nullptr) {
    return internal::KindError(ErrorKind::kChecksum,
                               absl::StrCat(path, ": header does not match the manifest (", mismatch, ")"));
  }
  if (size < fixed.file_bytes()) {
    return internal::KindError(ErrorKind::kTruncated,
                               absl::StrCat(path, ": ", size, " bytes, the header says ", fixed.file_bytes()));
  }
  if (size > fixed.file_bytes()) {
    return internal::KindError(ErrorKind::kChecksum,
                               absl::StrCat(path, ": ", size - fixed.file_bytes(),
                                            " bytes after the end the header gives"));
  }
  std::string table(fixed.payload_offset - internal::kSegmentFixedBytes, '\0');
  size_t done = 0;
  while (done < table.size()) {
    n = ops_->Pread(fd, table.data() + done, table.size() - done, internal::kSegmentFixedBytes + done);
    if (n < 0) return IoError(static_cast<int>(-n), "read", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  table.resize(done);
  ECHOKV_ASSIGN_OR_RETURN(info->blobs, internal::DecodeBlobTable(table, fixed, path));
  return absl::OkStatus();
}

absl::Status StateStore::VerifyPayload(int fd, const std::string& path, const SegmentInfo& info) {
  internal::Xxh3Stream hash;
  std::string buffer(std::min<uint64_t>(kReadChunk, std::max<uint64_t>(info.payload_bytes, 1)), '\0');
  uint64_t pos = info.file_bytes - info.payload_bytes;
  uint64_t left = info.payload_bytes;
  while (left > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    int64_t n = ops_->Pread(fd, buffer.data(), want, pos);
    if (n < 0) return IoError(static_cast<int>(-n), "read", path);
    if (n == 0) {
      return internal::KindError(ErrorKind::kTruncated, absl::StrCat(path, ": ended at byte ", pos));
    }
    hash.Update(absl::string_view(buffer.data(), static_cast<size_t>(n)));
    pos += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
  }
  if (!internal::ChecksumMatches(hash.Digest(), info.payload_xxh3)) {
    return internal::KindError(ErrorKind::kChecksum, absl::StrCat(path, ": payload checksum mismatch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionManifest> StateStore::LoadSession(const std::string& id,
                                                        std::vector<std::string>* removed,
                                                        std::string* fault_path) {
  const std::string dir = SessionDir(id);
  const std::string manifest_path = Join(dir, kManifestName);
  *fault_path = manifest_path;
  const StateLimits& limits = options_.limits;
  const uint64_t max_manifest = internal::kManifestFixedBytes +
                                internal::AlignUp(limits.max_manifest_json_bytes, 4) +
                                4 * limits.max_tokens + 8;
  ECHOKV_ASSIGN_OR_RETURN(std::string bytes,
                          ReadWholeFile(manifest_path, max_manifest, ErrorKind::kBadManifest));
  ECHOKV_ASSIGN_OR_RETURN(SessionManifest manifest,
                          internal::DecodeManifest(bytes, options_.model, limits, manifest_path));
  if (manifest.meta.id != id) {
    return internal::KindError(ErrorKind::kBadManifest,
                               absl::StrCat(manifest_path, ": manifest is for session \"",
                                            manifest.meta.id.substr(0, 100), "\""));
  }
  for (SegmentInfo& seg : manifest.segments) {
    const std::string path = Join(dir, SegmentFileName(seg.seq));
    *fault_path = path;
    int fd = ops_->Open(path, O_RDONLY, 0);
    if (fd < 0) {
      if (-fd == ENOENT) {
        return internal::KindError(ErrorKind::kMissingSegment,
                                   absl::StrCat(path, ": listed by the manifest but missing"));
      }
      return IoError(-fd, "open", path);
    }
    absl::Status status = LoadSegmentHeader(fd, path, &seg);
    ops_->Close(fd);
    ECHOKV_RETURN_IF_ERROR(status);
  }
  // The session is good: remove what no acknowledged state refers to.
  std::vector<std::string> names;
  if (ops_->ListDir(dir, &names) == 0) {
    for (const std::string& name : names) {
      uint64_t seq;
      bool leftover = name == kManifestTmp || name == kManifestPrev;
      if (ParseSegmentFileName(name, &seq)) {
        leftover = std::none_of(manifest.segments.begin(), manifest.segments.end(),
                                [&](const SegmentInfo& s) { return s.seq == seq; });
      }
      if (leftover) {
        Cleanup(Join(dir, name));
        removed->push_back(Join(dir, name));
      }
    }
  }
  return manifest;
}

RecoveryResult StateStore::OpenAll() {
  RecoveryResult result;
  const std::string sessions = SessionsDir();
  std::vector<std::string> names;
  if (int rc = ops_->ListDir(sessions, &names); rc < 0) {
    result.errors.push_back({ErrorKind::kIo, "", sessions, IoError(-rc, "list", sessions)});
    ReportError(ErrorKind::kIo);
    return result;
  }
  std::sort(names.begin(), names.end());
  absl::flat_hash_set<std::string> staging;
  {
    absl::MutexLock l(&mu_);
    staging = staging_;
  }
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots;
  for (const std::string& name : names) {
    const std::string path = Join(sessions, name);
    if (absl::StartsWith(name, kStagingPrefix) || absl::StartsWith(name, kDeletedPrefix)) {
      if (staging.contains(name)) continue;
      RemoveTree(path);
      result.removed.push_back(path);
      continue;
    }
    if (!IsValidSessionId(name)) {
      result.ignored.push_back(path);
      continue;
    }
    struct stat st;
    if (int rc = ops_->Stat(path, -1, &st); rc < 0 || !S_ISDIR(st.st_mode)) {
      absl::Status status = rc < 0 ? IoError(-rc, "stat", path)
                                   : internal::KindError(ErrorKind::kBadManifest,
                                                         absl::StrCat(path, ": not a directory"));
      ErrorKind kind = rc < 0 ? ErrorKind::kIo : ErrorKind::kBadManifest;
      result.errors.push_back({kind, name, path, status});
      ReportError(kind);
      continue;
    }
    std::string fault_path;
    absl::StatusOr<SessionManifest> manifest = LoadSession(name, &result.removed, &fault_path);
    if (!manifest.ok()) {
      ErrorKind kind = ErrorKindOf(manifest.status()).value_or(ErrorKind::kIo);
      result.errors.push_back({kind, name, fault_path, manifest.status()});
      ReportError(kind);
      continue;
    }
    auto slot = std::make_shared<Slot>();
    {
      absl::MutexLock l(&slot->mu);
      slot->exists = true;
      slot->segments = manifest->segments;
      slot->verified.assign(manifest->segments.size(), false);
    }
    slots[name] = std::move(slot);
    result.sessions.push_back(*std::move(manifest));
  }
  absl::MutexLock l(&mu_);
  slots_ = std::move(slots);
  return result;
}


}  // namespace echokv::state
