// StateStore reads: SessionReader and OpenSession.
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

// ---------------- SessionReader ----------------

SessionReader::SessionReader(FileOps* ops, SessionManifest manifest, std::vector<int> fds,
                             std::vector<std::string> paths)
    : ops_(ops), manifest_(std::move(manifest)), fds_(std::move(fds)), paths_(std::move(paths)) {}

SessionReader::~SessionReader() {
  for (int fd : fds_) ops_->Close(fd);
}

absl::Status SessionReader::Read(size_t segment, absl::string_view blob, uint64_t offset,
                                 absl::Span<char> dst) const {
  if (segment >= manifest_.segments.size()) {
    return absl::NotFoundError(absl::StrCat("session ", manifest_.meta.id, " has no segment index ",
                                            segment));
  }
  const SegmentInfo& seg = manifest_.segments[segment];
  const BlobInfo* info = seg.FindBlob(blob);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(paths_[segment], " has no blob \"", blob, "\""));
  }
  if (offset > info->bytes || dst.size() > info->bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("blob \"", blob, "\" of ", paths_[segment], " has ",
                                              info->bytes, " bytes; asked for ", dst.size(),
                                              " at offset ", offset));
  }
  uint64_t pos = (seg.file_bytes - seg.payload_bytes) + info->offset + offset;
  size_t done = 0;
  while (done < dst.size()) {
    int64_t n = ops_->Pread(fds_[segment], dst.data() + done,
                            std::min(dst.size() - done, kMaxWrite), pos + done);
    if (n < 0) return IoError(static_cast<int>(-n), "read", paths_[segment]);
    if (n == 0) {
      return internal::KindError(ErrorKind::kTruncated,
                                 absl::StrCat(paths_[segment], ": ended at byte ", pos + done,
                                              " while reading blob \"", blob, "\""));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SessionReader::ReadAll(size_t segment, absl::string_view blob) const {
  if (segment >= manifest_.segments.size()) {
    return absl::NotFoundError(absl::StrCat("session ", manifest_.meta.id, " has no segment index ",
                                            segment));
  }
  const BlobInfo* info = manifest_.segments[segment].FindBlob(blob);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(paths_[segment], " has no blob \"", blob, "\""));
  }
  std::string out(info->bytes, '\0');
  ECHOKV_RETURN_IF_ERROR(Read(segment, blob, 0, absl::Span<char>(out.data(), out.size())));
  return out;
}

absl::StatusOr<SessionReader::BlobRef> SessionReader::FindLatest(absl::string_view blob) const {
  for (size_t i = manifest_.segments.size(); i-- > 0;) {
    if (const BlobInfo* info = manifest_.segments[i].FindBlob(blob)) return BlobRef{i, info};
  }
  return absl::NotFoundError(
      absl::StrCat("session ", manifest_.meta.id, ": no segment has blob \"", blob, "\""));
}

std::vector<SessionReader::BlobRef> SessionReader::FindAll(absl::string_view blob) const {
  std::vector<BlobRef> refs;
  for (size_t i = 0; i < manifest_.segments.size(); ++i) {
    if (const BlobInfo* info = manifest_.segments[i].FindBlob(blob)) refs.push_back({i, info});
  }
  return refs;
}


// ---------------- reads ----------------

absl::StatusOr<std::unique_ptr<SessionReader>> StateStore::OpenSession(absl::string_view id) {
  std::shared_ptr<Slot> slot = FindSlot(id);
  if (slot == nullptr) return absl::NotFoundError(absl::StrCat("session ", id, " is not in the store"));
  absl::MutexLock l(&slot->mu);
  if (slot->deleted || !slot->exists) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is not in the store"));
  }
  if (slot->bad) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id, " failed verification earlier"));
  }
  const std::string dir = SessionDir(id);
  std::vector<int> fds;
  absl::Cleanup close_fds = [&] {
    for (int fd : fds) ops_->Close(fd);
  };
  auto refuse = [&](absl::Status status) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::optional<ErrorKind> kind = ErrorKindOf(status);
    if (kind) ReportError(*kind);
    if (kind && *kind != ErrorKind::kIo) slot->bad = true;
    return status;
  };
  const std::string manifest_path = Join(dir, kManifestName);
  const StateLimits& limits = options_.limits;
  const uint64_t max_manifest = internal::kManifestFixedBytes +
                                internal::AlignUp(limits.max_manifest_json_bytes, 4) +
                                4 * limits.max_tokens + 8;
  auto bytes = ReadWholeFile(manifest_path, max_manifest, ErrorKind::kBadManifest);
  if (!bytes.ok()) return refuse(bytes.status());
  auto manifest = internal::DecodeManifest(*bytes, options_.model, limits, manifest_path);
  if (!manifest.ok()) return refuse(manifest.status());
  bool same = manifest->meta.id == id && manifest->segments.size() == slot->segments.size();
  for (size_t i = 0; same && i < slot->segments.size(); ++i) {
    const SegmentInfo& a = manifest->segments[i];
    const SegmentInfo& b = slot->segments[i];
    same = a.seq == b.seq && a.header_xxh3 == b.header_xxh3 && a.payload_xxh3 == b.payload_xxh3 &&
           a.file_bytes == b.file_bytes;
  }
  if (!same) {
    return refuse(internal::KindError(
        ErrorKind::kBadManifest,
        absl::StrCat(manifest_path, ": changed on disk behind the store (segments differ)")));
  }
  std::vector<std::string> paths;
  for (size_t i = 0; i < slot->segments.size(); ++i) {
    const SegmentInfo& seg = slot->segments[i];
    manifest->segments[i].blobs = seg.blobs;
    const std::string path = Join(dir, SegmentFileName(seg.seq));
    int fd = ops_->Open(path, O_RDONLY, 0);
    if (fd < 0) {
      if (-fd == ENOENT) {
        return refuse(internal::KindError(ErrorKind::kMissingSegment,
                                          absl::StrCat(path, ": listed by the manifest but missing")));
      }
      return refuse(IoError(-fd, "open", path));
    }
    fds.push_back(fd);
    paths.push_back(path);
    struct stat st;
    if (int rc = ops_->Stat(path, fd, &st); rc < 0) return refuse(IoError(-rc, "stat", path));
    if (static_cast<uint64_t>(st.st_size) != seg.file_bytes) {
      ErrorKind kind = static_cast<uint64_t>(st.st_size) < seg.file_bytes ? ErrorKind::kTruncated
                                                                           : ErrorKind::kChecksum;
      return refuse(internal::KindError(kind, absl::StrCat(path, ": ", st.st_size, " bytes, expected ",
                                                           seg.file_bytes)));
    }
    if (!slot->verified[i]) {
      absl::Status verified = VerifyPayload(fd, path, seg);
      if (!verified.ok()) return refuse(verified);
      slot->verified[i] = true;
    }
  }
  std::move(close_fds).Cancel();
  return std::unique_ptr<SessionReader>(
      new SessionReader(ops_, *std::move(manifest), std::move(fds), std::move(paths)));
}


}  // namespace echokv::state
