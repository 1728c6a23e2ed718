#include "server/state/snapshot.h"

#include <errno.h>
#include <fcntl.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/state/session_id.h"

namespace echokv::state {
namespace {

std::string Join(absl::string_view a, absl::string_view b) { return absl::StrCat(a, "/", b); }

// The largest manifest file `limits` allow.
uint64_t MaxManifestBytes(const StateLimits& limits) {
  return internal::kManifestFixedBytes + internal::AlignUp(limits.max_manifest_json_bytes, 4) +
         4 * limits.max_tokens + 8;
}

}  // namespace

// ---------------- export ----------------

SnapshotExporter::SnapshotExporter(FileOps* ops, StateObserver* observer, size_t chunk_bytes,
                                   std::vector<Part> parts)
    : ops_(ops), observer_(observer), chunk_bytes_(std::max<size_t>(chunk_bytes, 1)),
      parts_(std::move(parts)) {
  for (const Part& p : parts_) total_bytes_ += p.size;
}

SnapshotExporter::~SnapshotExporter() {
  for (Part& p : parts_) {
    if (p.fd >= 0) ops_->Close(p.fd);
  }
}

absl::StatusOr<bool> SnapshotExporter::Next(std::string* chunk) {
  if (!status_.ok()) return status_;
  chunk->clear();
  while (chunk->size() < chunk_bytes_ && index_ < parts_.size()) {
    Part& part = parts_[index_];
    const bool trailer = index_ + 1 == parts_.size();
    if (trailer && offset_ == 0) {
      part.bytes = internal::EncodeSnapshotTrailer(emitted_, stream_hash_.Digest());
    }
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(part.size - offset_, chunk_bytes_ - chunk->size()));
    const size_t at = chunk->size();
    if (part.fd < 0) {
      chunk->append(part.bytes, static_cast<size_t>(offset_), n);
    } else {
      chunk->resize(at + n);
      size_t done = 0;
      while (done < n) {
        int64_t r = ops_->Pread(part.fd, chunk->data() + at + done, n - done, offset_ + done);
        if (r < 0) {
          status_ = WithErrorKind(ErrnoToStatus(static_cast<int>(-r), "read", part.path), ErrorKind::kIo);
          if (observer_) observer_->OnStateError(ErrorKind::kIo);
          return status_;
        }
        if (r == 0) {
          status_ = internal::KindError(ErrorKind::kTruncated,
                                        absl::StrCat(part.path, ": ended at byte ", offset_ + done));
          if (observer_) observer_->OnStateError(ErrorKind::kTruncated);
          return status_;
        }
        done += static_cast<size_t>(r);
      }
      // The payload part of these bytes feeds the segment's payload checksum.
      if (offset_ == 0) payload_hash_ = std::make_unique<internal::Xxh3Stream>();
      uint64_t end = offset_ + n;
      if (end > part.payload_offset) {
        uint64_t from = std::max(offset_, part.payload_offset);
        payload_hash_->Update(absl::string_view(chunk->data() + at + (from - offset_), end - from));
      }
    }
    if (!trailer) {
      stream_hash_.Update(absl::string_view(chunk->data() + at, n));
      emitted_ += n;
    }
    offset_ += n;
    if (offset_ == part.size) {
      if (part.fd >= 0) {
        if (!internal::ChecksumMatches(payload_hash_->Digest(), part.payload_xxh3)) {
          status_ = internal::KindError(ErrorKind::kChecksum,
                                        absl::StrCat(part.path, ": payload checksum mismatch"));
          if (observer_) observer_->OnStateError(ErrorKind::kChecksum);
          return status_;
        }
        ops_->Close(part.fd);
        part.fd = -1;
        part.bytes.clear();
      }
      ++index_;
      offset_ = 0;
    }
  }
  return !chunk->empty();
}

absl::StatusOr<std::unique_ptr<SnapshotExporter>> StateStore::Export(absl::string_view id,
                                                                      size_t chunk_bytes) {
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
  const std::string manifest_path = Join(dir, "manifest");
  auto report = [&](absl::Status status) {
    if (std::optional<ErrorKind> kind = ErrorKindOf(status)) ReportError(*kind);
    return status;
  };
  auto manifest_bytes = ReadWholeFile(manifest_path, MaxManifestBytes(options_.limits), ErrorKind::kBadManifest);
  if (!manifest_bytes.ok()) return report(manifest_bytes.status());
  auto manifest = internal::DecodeManifest(*manifest_bytes, options_.model, options_.limits, manifest_path);
  if (!manifest.ok()) return report(manifest.status());
  bool same = manifest->segments.size() == slot->segments.size();
  for (size_t i = 0; same && i < slot->segments.size(); ++i) {
    same = manifest->segments[i].seq == slot->segments[i].seq &&
           manifest->segments[i].header_xxh3 == slot->segments[i].header_xxh3;
  }
  if (!same) {
    return report(internal::KindError(
        ErrorKind::kBadManifest, absl::StrCat(manifest_path, ": changed on disk behind the store")));
  }

  std::vector<SnapshotExporter::Part> parts(1);
  parts.emplace_back();
  parts[1].size = manifest_bytes->size();
  parts[1].bytes = *std::move(manifest_bytes);
  absl::Cleanup close_fds = [&] {
    for (auto& p : parts) {
      if (p.fd >= 0) ops_->Close(p.fd);
    }
  };
  for (const SegmentInfo& seg : slot->segments) {
    SnapshotExporter::Part part;
    part.path = Join(dir, SegmentFileName(seg.seq));
    int fd = ops_->Open(part.path, O_RDONLY, 0);
    if (fd < 0) {
      if (-fd == ENOENT) {
        return report(internal::KindError(ErrorKind::kMissingSegment,
                                          absl::StrCat(part.path, ": listed by the manifest but missing")));
      }
      return report(WithErrorKind(ErrnoToStatus(-fd, "open", part.path), ErrorKind::kIo));
    }
    part.fd = fd;
    part.size = seg.file_bytes;
    part.payload_offset = seg.file_bytes - seg.payload_bytes;
    part.payload_xxh3 = seg.payload_xxh3;
    parts.push_back(std::move(part));
  }
  internal::SnapshotHeader header;
  header.model = options_.model;
  header.manifest_bytes = parts[1].size;
  header.segment_count = slot->segments.size();
  parts[0].bytes = internal::EncodeSnapshotHeader(header);
  parts[0].size = parts[0].bytes.size();
  SnapshotExporter::Part trailer;
  trailer.size = internal::kSnapshotTrailerBytes;
  parts.push_back(std::move(trailer));
  std::move(close_fds).Cancel();
  return std::unique_ptr<SnapshotExporter>(
      new SnapshotExporter(ops_, options_.observer, chunk_bytes, std::move(parts)));
}

// ---------------- import ----------------

std::unique_ptr<SnapshotImporter> StateStore::BeginImport() {
  return std::unique_ptr<SnapshotImporter>(new SnapshotImporter(this));
}

SnapshotImporter::SnapshotImporter(StateStore* store) : store_(store) {}

SnapshotImporter::~SnapshotImporter() {
  if (!committed_) Abort();
}

void SnapshotImporter::Abort() {
  if (fd_ >= 0) {
    store_->ops_->Close(fd_);
    fd_ = -1;
  }
  if (!staging_name_.empty()) {
    store_->RemoveTree(staging_);
    absl::MutexLock l(&store_->mu_);
    store_->staging_.erase(staging_name_);
    staging_name_.clear();
  }
}

absl::Status SnapshotImporter::Fail(absl::Status status) {
  status_ = status;
  Abort();
  return status;
}

std::string SnapshotImporter::Where() const {
  switch (stage_) {
    case Stage::kHeader: return "the stream header";
    case Stage::kManifest: return "the manifest";
    case Stage::kSegmentFixed: return absl::StrCat("the header of segment ", segment_ + 1, " of ", manifest_.segments.size());
    case Stage::kSegmentTable: return absl::StrCat("the blob table of segment ", segment_ + 1, " of ", manifest_.segments.size());
    case Stage::kSegmentPayload: return absl::StrCat("the payload of segment ", segment_ + 1, " of ", manifest_.segments.size());
    case Stage::kTrailer: return "the trailer";
    case Stage::kDone: return "the end";
  }
  return "?";
}

absl::Status SnapshotImporter::Feed(absl::string_view chunk) {
  if (!status_.ok()) return status_;
  if (committed_) return absl::FailedPreconditionError("snapshot: Feed after Finish");
  received_ += chunk.size();
  const uint64_t limit = store_->options_.limits.max_snapshot_bytes;
  if (received_ > limit) {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat("snapshot: more than the limit of ", limit, " bytes")));
  }
  while (!chunk.empty()) {
    if (stage_ == Stage::kDone) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("snapshot: ", chunk.size(), " bytes after its end")));
    }
    if (stage_ == Stage::kSegmentPayload) {
      absl::string_view take = chunk.substr(0, static_cast<size_t>(std::min<uint64_t>(payload_left_, chunk.size())));
      chunk.remove_prefix(take.size());
      payload_hash_->Update(take);
      stream_hash_.Update(take);
      hashed_ += take.size();
      payload_left_ -= take.size();
      if (absl::Status s = WriteToSegment(take); !s.ok()) return Fail(s);
      if (payload_left_ == 0) {
        if (absl::Status s = FinishSegment(); !s.ok()) return Fail(s);
      }
      continue;
    }
    size_t take = static_cast<size_t>(std::min<uint64_t>(need_ - pending_.size(), chunk.size()));
    pending_.append(chunk.data(), take);
    chunk.remove_prefix(take);
    if (pending_.size() < need_) continue;
    if (stage_ != Stage::kTrailer) {
      stream_hash_.Update(pending_);
      hashed_ += pending_.size();
    }
    if (absl::Status s = OnPart(); !s.ok()) return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status SnapshotImporter::OnPart() {
  const StateLimits& limits = store_->options_.limits;
  const ModelFingerprint& model = store_->options_.model;
  std::string part = std::move(pending_);
  pending_.clear();
  switch (stage_) {
    case Stage::kHeader: {
      ECHOKV_ASSIGN_OR_RETURN(header_, internal::DecodeSnapshotHeader(part, model));
      // Sizes past the limits: RESOURCE_EXHAUSTED (a session too big for this server);
      // impossible ones: INVALID_ARGUMENT. Either way before anything is allocated.
      if (header_.manifest_bytes < internal::kManifestFixedBytes || header_.segment_count == 0) {
        return absl::InvalidArgumentError(absl::StrCat("snapshot: header declares a manifest of ",
                                                       header_.manifest_bytes, " bytes and ",
                                                       header_.segment_count, " segments"));
      }
      if (header_.manifest_bytes > MaxManifestBytes(limits)) {
        return absl::ResourceExhaustedError(absl::StrCat("snapshot: a manifest of ", header_.manifest_bytes,
                                                         " bytes is over the limit of ",
                                                         MaxManifestBytes(limits)));
      }
      if (header_.segment_count > limits.max_segments) {
        return absl::ResourceExhaustedError(absl::StrCat("snapshot: ", header_.segment_count,
                                                         " segments is over the limit of ", limits.max_segments));
      }
      stage_ = Stage::kManifest;
      need_ = header_.manifest_bytes;
      return absl::OkStatus();
    }
    case Stage::kManifest: {
      auto manifest = internal::DecodeManifest(part, model, limits, "snapshot manifest");
      if (!manifest.ok()) {
        // A stream's own parts disagreeing is corruption, whatever the file kinds say.
        if (ErrorKindOf(manifest.status()) == ErrorKind::kTruncated) {
          return absl::DataLossError(manifest.status().message());
        }
        return manifest.status();
      }
      manifest_ = *std::move(manifest);
      if (manifest_.segments.size() != header_.segment_count) {
        return absl::DataLossError(absl::StrCat("snapshot: the header says ", header_.segment_count,
                                                " segments, the manifest lists ", manifest_.segments.size()));
      }
      uint64_t total = internal::kSnapshotHeaderBytes + header_.manifest_bytes + internal::kSnapshotTrailerBytes;
      for (const SegmentInfo& s : manifest_.segments) {
        if (s.file_bytes < internal::kSegmentFixedBytes || s.payload_bytes > s.file_bytes - internal::kSegmentFixedBytes ||
            s.file_bytes > limits.max_snapshot_bytes) {
          return absl::DataLossError(absl::StrCat("snapshot manifest: segment ", s.seq, " has impossible lengths"));
        }
        total += s.file_bytes;
      }
      if (total > limits.max_snapshot_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("snapshot: ", total, " bytes is over the limit of ",
                                                         limits.max_snapshot_bytes));
      }
      expected_total_ = total;
      // Everything from here on goes into a staging directory that only Finish renames
      // into place (OpenAll leaves it alone while registered, removes it after a crash).
      staging_name_ = store_->FreshName(".tmp-", "import");
      staging_ = Join(store_->SessionsDir(), staging_name_);
      {
        absl::MutexLock l(&store_->mu_);
        store_->staging_.insert(staging_name_);
      }
      if (int rc = store_->ops_->Mkdir(staging_, 0755); rc < 0) {
        absl::MutexLock l(&store_->mu_);
        store_->staging_.erase(staging_name_);
        staging_name_.clear();
        return ErrnoToStatus(-rc, "create directory", staging_);
      }
      return StartSegment();
    }
    case Stage::kSegmentFixed: {
      SegmentInfo& info = manifest_.segments[segment_];
      const std::string what = absl::StrCat("snapshot segment ", info.seq);
      auto fixed = internal::DecodeSegmentFixed(part, model, limits, what);
      if (!fixed.ok()) return fixed.status();
      fixed_ = *fixed;
      if (fixed_.header_xxh3 != info.header_xxh3 || fixed_.seq != info.seq ||
          fixed_.token_begin != info.token_begin || fixed_.token_end != info.token_end ||
          ((fixed_.flags & internal::kSegmentFlagSupersedes) != 0) != info.supersedes_earlier ||
          fixed_.payload_bytes != info.payload_bytes || fixed_.file_bytes() != info.file_bytes ||
          fixed_.payload_xxh3 != info.payload_xxh3) {
        return absl::DataLossError(absl::StrCat(what, ": header does not match the manifest"));
      }
      segment_path_ = Join(staging_, StateStore::SegmentFileName(info.seq));
      int fd = store_->ops_->Open(segment_path_, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) return ErrnoToStatus(-fd, "create", segment_path_);
      fd_ = fd;
      ECHOKV_RETURN_IF_ERROR(WriteToSegment(part));
      stage_ = Stage::kSegmentTable;
      need_ = fixed_.payload_offset - internal::kSegmentFixedBytes;
      if (need_ == 0) return OnSegmentTable();
      return absl::OkStatus();
    }
    case Stage::kSegmentTable: {
      pending_ = std::move(part);
      absl::Status s = OnSegmentTable();
      return s;
    }
    case Stage::kTrailer: {
      ECHOKV_RETURN_IF_ERROR(internal::CheckSnapshotTrailer(part, hashed_, stream_hash_.Digest()));
      stage_ = Stage::kDone;
      return absl::OkStatus();
    }
    case Stage::kSegmentPayload:
    case Stage::kDone:
      break;
  }
  return absl::InternalError("snapshot: parser in an impossible state");
}

absl::Status SnapshotImporter::StartSegment() {
  if (segment_ == manifest_.segments.size()) {
    stage_ = Stage::kTrailer;
    need_ = internal::kSnapshotTrailerBytes;
  } else {
    stage_ = Stage::kSegmentFixed;
    need_ = internal::kSegmentFixedBytes;
  }
  return absl::OkStatus();
}

absl::Status SnapshotImporter::OnSegmentTable() {
  std::string table = std::move(pending_);
  pending_.clear();
  SegmentInfo& info = manifest_.segments[segment_];
  auto blobs = internal::DecodeBlobTable(table, fixed_, absl::StrCat("snapshot segment ", info.seq));
  if (!blobs.ok()) return blobs.status();
  info.blobs = *std::move(blobs);
  ECHOKV_RETURN_IF_ERROR(WriteToSegment(table));
  stage_ = Stage::kSegmentPayload;
  payload_left_ = fixed_.payload_bytes;
  payload_hash_ = std::make_unique<internal::Xxh3Stream>();
  if (payload_left_ == 0) return FinishSegment();
  return absl::OkStatus();
}

absl::Status SnapshotImporter::WriteToSegment(absl::string_view bytes) {
  while (!bytes.empty()) {
    int64_t n = store_->ops_->Write(fd_, bytes.data(), bytes.size());
    if (n < 0) return ErrnoToStatus(static_cast<int>(-n), "write", segment_path_);
    if (n == 0) return ErrnoToStatus(EIO, "write", segment_path_);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status SnapshotImporter::FinishSegment() {
  const SegmentInfo& info = manifest_.segments[segment_];
  if (!internal::ChecksumMatches(payload_hash_->Digest(), info.payload_xxh3)) {
    return absl::DataLossError(absl::StrCat("snapshot segment ", info.seq, ": payload checksum mismatch"));
  }
  if (store_->options_.fsync == FsyncPolicy::kAlways) {
    if (int rc = store_->ops_->Fsync(fd_); rc < 0) return ErrnoToStatus(-rc, "fsync", segment_path_);
  }
  int fd = fd_;
  fd_ = -1;
  if (int rc = store_->ops_->Close(fd); rc < 0) return ErrnoToStatus(-rc, "close", segment_path_);
  ++segment_;
  return StartSegment();
}

absl::StatusOr<SessionManifest> SnapshotImporter::Finish(
    absl::string_view id, const std::function<absl::Status(SavedSession&)>& edit) {
  if (!status_.ok()) return status_;
  if (committed_) return absl::FailedPreconditionError("snapshot: Finish called twice");
  absl::Time start = absl::Now();
  if (stage_ != Stage::kDone) {
    std::string total = expected_total_ ? absl::StrCat(" of ", expected_total_) : "";
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "snapshot is truncated: it ended after ", received_, total, " bytes, inside ", Where())));
  }
  std::string target(id.empty() ? absl::string_view(manifest_.meta.id) : id);
  if (absl::Status s = ValidateSessionId(target); !s.ok()) return Fail(s);
  if (store_->Contains(target)) {
    return Fail(absl::AlreadyExistsError(absl::StrCat("session ", target, " already exists")));
  }
  manifest_.meta.id = target;
  if (edit) {
    const size_t tokens = manifest_.meta.tokens.size();
    if (absl::Status s = edit(manifest_.meta); !s.ok()) return Fail(s);
    if (manifest_.meta.id != target || manifest_.meta.tokens.size() != tokens) {
      return Fail(absl::InvalidArgumentError("snapshot: the edit may not change the id or the token history"));
    }
    if (absl::Status s = manifest_.meta.Validate(); !s.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("snapshot: edited meta: ", s.message())));
    }
  }
  uint64_t bytes = 0;
  absl::Status status;
  {
    auto manifest_bytes = internal::EncodeManifest(manifest_);
    status = manifest_bytes.status();
    if (status.ok()) {
      absl::string_view parts[] = {*manifest_bytes};
      status = store_->WriteFileParts(Join(staging_, "manifest"), parts, &bytes);
    }
  }
  if (status.ok()) status = store_->MaybeFsyncDir(staging_);
  if (status.ok()) status = store_->CommitStaging(staging_, target);
  if (!status.ok()) {
    store_->ReportWrite(WriteOp::kImport, start, received_, status);
    return Fail(status);
  }
  committed_ = true;
  {
    absl::MutexLock l(&store_->mu_);
    store_->staging_.erase(staging_name_);
  }
  auto slot = std::make_shared<StateStore::Slot>();
  {
    absl::MutexLock l(&slot->mu);
    slot->exists = true;
    slot->segments = manifest_.segments;
    slot->verified.assign(manifest_.segments.size(), true);  // checked while streaming
  }
  {
    absl::MutexLock l(&store_->mu_);
    store_->slots_[target] = std::move(slot);
  }
  store_->ReportWrite(WriteOp::kImport, start, received_, absl::OkStatus());
  return manifest_;
}

}  // namespace echokv::state
