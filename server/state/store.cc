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


absl::string_view FsyncPolicyName(FsyncPolicy policy) {
  switch (policy) {
    case FsyncPolicy::kAlways: return "always";
    case FsyncPolicy::kNone: return "none";
  }
  return "unknown";
}

absl::StatusOr<FsyncPolicy> FsyncPolicyFromName(absl::string_view name) {
  if (name == "always") return FsyncPolicy::kAlways;
  if (name == "none") return FsyncPolicy::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("fsync policy \"", name, "\" is neither \"always\" nor \"none\""));
}

absl::Status StoreOptions::Validate() const {
  if (dir.empty()) return absl::InvalidArgumentError("dir: empty");
  if (fsync != FsyncPolicy::kAlways && fsync != FsyncPolicy::kNone) {
    return absl::InvalidArgumentError("fsync: not a FsyncPolicy");
  }
  if (limits.max_segments == 0) return absl::InvalidArgumentError("limits.max_segments: 0");
  if (limits.max_blobs == 0) return absl::InvalidArgumentError("limits.max_blobs: 0");
  return absl::OkStatus();
}

// ---------------- StateStore: setup ----------------

StateStore::StateStore(StoreOptions options)
    : options_(std::move(options)), ops_(options_.file_ops ? options_.file_ops : &posix_) {}

StateStore::~StateStore() {
  if (lock_fd_ >= 0) ops_->Close(lock_fd_);  // releases the flock
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Create(const StoreOptions& options) {
  ECHOKV_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<StateStore> store(new StateStore(options));
  absl::Status status = store->Open();
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("state dir ", options.dir, ": ", status.message()));
  }
  return store;
}

absl::Status StateStore::Open() {
  // mkdir -p
  const std::string& dir = options_.dir;
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    int rc = ops_->Mkdir(prefix, 0755);
    if (rc < 0 && -rc != EEXIST) return ErrnoToStatus(-rc, "create directory", prefix);
  }
  struct stat st;
  if (int rc = ops_->Stat(dir, -1, &st); rc < 0) return ErrnoToStatus(-rc, "stat", dir);
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError("not a directory");

  const std::string lock_path = Join(dir, kLockFile);
  int fd = ops_->Open(lock_path, O_RDWR | O_CREAT, 0644);
  if (fd < 0) return ErrnoToStatus(-fd, "create", lock_path);
  lock_fd_ = fd;
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) < 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("in use by another process (", lock_path, " is locked)"));
    }
    return ErrnoToStatus(errno, "lock", lock_path);
  }

  const std::string format_path = Join(dir, kFormatFile);
  struct stat format_stat;
  int format_rc = ops_->Stat(format_path, -1, &format_stat);
  if (format_rc == 0) {
    auto format = ReadWholeFile(format_path, 4096, ErrorKind::kBadManifest);
    nlohmann::json j;
    if (format.ok()) j = nlohmann::json::parse(*format, nullptr, /*allow_exceptions=*/false);
    if (!format.ok() || j.is_discarded() || !j.is_object() || !j.contains("format") ||
        j["format"] != std::string(kFormatName) || !j.contains("version") ||
        !j["version"].is_number_integer()) {
      return absl::FailedPreconditionError(absl::StrCat(
          format_path, " is not an echokv state FORMAT file",
          format.ok() ? "" : absl::StrCat(" (", format.status().message(), ")")));
    }
    if (j["version"].get<int64_t>() != kLayoutVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(format_path, ": layout version ", j["version"].get<int64_t>(),
                       " is not supported (this build reads version ", kLayoutVersion, ")"));
    }
  } else if (-format_rc == ENOENT) {
    // A new directory.
    const std::string tmp = format_path + ".tmp";
    std::string text = FormatFileText();
    absl::string_view parts[] = {text};
    uint64_t bytes = 0;
    ECHOKV_RETURN_IF_ERROR(WriteFileParts(tmp, parts, &bytes));
    if (int rc = ops_->Rename(tmp, format_path, false); rc < 0) {
      Cleanup(tmp);
      return ErrnoToStatus(-rc, "rename", tmp);
    }
    ECHOKV_RETURN_IF_ERROR(MaybeFsyncDir(dir));
  } else {
    return ErrnoToStatus(-format_rc, "stat", format_path);
  }

  const std::string sessions = SessionsDir();
  if (int rc = ops_->Mkdir(sessions, 0755); rc < 0 && -rc != EEXIST) {
    return ErrnoToStatus(-rc, "create directory", sessions);
  }
  // Write probe: an existing directory on a read-only or full file system fails here, at
  // start, rather than at the first acknowledged turn.
  return ProbeWritable();
}

absl::Status StateStore::ProbeWritable() {
  const std::string probe = Join(SessionsDir(), FreshName(kStagingPrefix, "probe"));
  absl::string_view probe_parts[] = {"probe"};
  uint64_t bytes = 0;
  absl::Status probe_status = WriteFileParts(probe, probe_parts, &bytes);
  if (!probe_status.ok()) {
    absl::Status out(probe_status.code(), absl::StrCat("not writable: ", probe_status.message()));
    probe_status.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
    return out;
  }
  Cleanup(probe);
  return absl::OkStatus();
}

std::string StateStore::SessionsDir() const { return Join(options_.dir, kSessionsDir); }

std::string StateStore::SessionDir(absl::string_view id) const { return Join(SessionsDir(), id); }

std::string StateStore::SegmentFileName(uint64_t seq) { return absl::StrCat("seg-", seq, ".ekv"); }

std::string StateStore::FreshName(absl::string_view prefix, absl::string_view id) {
  uint64_t n;
  {
    absl::MutexLock l(&mu_);
    n = ++name_counter_;
  }
  return absl::StrCat(prefix, id, "-", getpid(), "-", absl::ToUnixNanos(absl::Now()), "-", n);
}

// ---------------- file helpers ----------------

absl::Status StateStore::WriteFileParts(const std::string& path,
                                        absl::Span<const absl::string_view> parts,
                                        uint64_t* bytes_written) {
  int fd = ops_->Open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoToStatus(-fd, "create", path);
  bool open = true;
  auto fail = [&](int err, absl::string_view what) {
    if (open) ops_->Close(fd);
    ops_->Unlink(path);  // best effort: the file was never referenced
    return ErrnoToStatus(err, what, path);
  };
  for (absl::string_view part : parts) {
    while (!part.empty()) {
      int64_t n = ops_->Write(fd, part.data(), std::min(part.size(), kMaxWrite));
      if (n < 0) return fail(static_cast<int>(-n), "write");
      if (n == 0) return fail(EIO, "write");
      part.remove_prefix(static_cast<size_t>(n));
      *bytes_written += static_cast<uint64_t>(n);
    }
  }
  if (options_.fsync == FsyncPolicy::kAlways) {
    if (int rc = ops_->Fsync(fd); rc < 0) return fail(-rc, "fsync");
  }
  open = false;
  if (int rc = ops_->Close(fd); rc < 0) return fail(-rc, "close");
  return absl::OkStatus();
}

absl::Status StateStore::FsyncDir(const std::string& path) {
  int fd = ops_->Open(path, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return ErrnoToStatus(-fd, "open directory", path);
  int rc = ops_->Fsync(fd);
  int close_rc = ops_->Close(fd);
  if (rc < 0) return ErrnoToStatus(-rc, "fsync directory", path);
  if (close_rc < 0) return ErrnoToStatus(-close_rc, "close directory", path);
  return absl::OkStatus();
}

absl::Status StateStore::MaybeFsyncDir(const std::string& path) {
  if (options_.fsync == FsyncPolicy::kNone) return absl::OkStatus();
  return FsyncDir(path);
}

absl::StatusOr<std::string> StateStore::ReadWholeFile(const std::string& path, uint64_t max_bytes,
                                                      ErrorKind missing_kind) {
  int fd = ops_->Open(path, O_RDONLY, 0);
  if (fd < 0) {
    if (-fd == ENOENT) {
      return internal::KindError(missing_kind, absl::StrCat(path, ": no such file"));
    }
    return IoError(-fd, "open", path);
  }
  absl::Cleanup closer = [&] { ops_->Close(fd); };
  struct stat st;
  if (int rc = ops_->Stat(path, fd, &st); rc < 0) return IoError(-rc, "stat", path);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return internal::KindError(ErrorKind::kBadManifest,
                               absl::StrCat(path, ": ", size, " bytes is over the limit of ",
                                            max_bytes));
  }
  std::string out(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    int64_t n = ops_->Pread(fd, out.data() + done, std::min<uint64_t>(size - done, kMaxWrite), done);
    if (n < 0) return IoError(static_cast<int>(-n), "read", path);
    if (n == 0) break;  // shrank while reading: decoders see it as truncated
    done += static_cast<uint64_t>(n);
  }
  out.resize(done);
  return out;
}

void StateStore::Cleanup(const std::string& path) {
  int rc = ops_->Unlink(path);
  if (rc < 0 && -rc != ENOENT && options_.observer) {
    options_.observer->OnCleanupFailed(ErrnoToStatus(-rc, "remove", path));
  }
}

void StateStore::RemoveTree(const std::string& path) {
  std::vector<std::string> names;
  int rc = ops_->ListDir(path, &names);
  if (rc == -ENOTDIR) return Cleanup(path);  // a write probe's file left by a crash
  if (rc < 0) {
    if (-rc != ENOENT && options_.observer) {
      options_.observer->OnCleanupFailed(ErrnoToStatus(-rc, "list", path));
    }
    return;
  }
  for (const std::string& name : names) Cleanup(Join(path, name));
  rc = ops_->Rmdir(path);
  if (rc < 0 && -rc != ENOENT && options_.observer) {
    options_.observer->OnCleanupFailed(ErrnoToStatus(-rc, "remove directory", path));
  }
}

void StateStore::ReportError(ErrorKind kind) {
  if (options_.observer) options_.observer->OnStateError(kind);
}

void StateStore::ReportWrite(WriteOp op, absl::Time start, uint64_t bytes,
                             const absl::Status& status) {
  if (options_.observer) {
    options_.observer->OnWrite({op, std::max(absl::ZeroDuration(), absl::Now() - start), bytes,
                                status.code()});
  }
}

std::shared_ptr<StateStore::Slot> StateStore::FindSlot(absl::string_view id) const {
  absl::MutexLock l(&mu_);
  auto it = slots_.find(id);
  return it == slots_.end() ? nullptr : it->second;
}

std::vector<std::string> StateStore::SessionIds() const {
  std::vector<std::pair<std::string, std::shared_ptr<Slot>>> slots;
  {
    absl::MutexLock l(&mu_);
    slots.assign(slots_.begin(), slots_.end());
  }
  std::vector<std::string> ids;
  for (const auto& [id, slot] : slots) {
    absl::MutexLock sl(&slot->mu);  // never under mu_ (lock order: slot, then store)
    if (slot->exists && !slot->deleted) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool StateStore::Contains(absl::string_view id) const {
  std::shared_ptr<Slot> slot = FindSlot(id);
  if (slot == nullptr) return false;
  absl::MutexLock l(&slot->mu);
  return slot->exists && !slot->deleted;
}

// ---------------- writes ----------------

absl::Status StateStore::ReplaceManifest(const std::string& dir, absl::string_view bytes,
                                         uint64_t* bytes_written) {
  const std::string tmp = Join(dir, kManifestTmp);
  const std::string manifest = Join(dir, kManifestName);
  const std::string prev = Join(dir, kManifestPrev);
  absl::string_view parts[] = {bytes};
  ECHOKV_RETURN_IF_ERROR(WriteFileParts(tmp, parts, bytes_written));
  const bool always = options_.fsync == FsyncPolicy::kAlways;
  if (always) {
    // Keep the old manifest reachable until the directory fsync succeeded, so that a
    // failed fsync can put it back.
    ops_->Unlink(prev);  // a leftover of an earlier failed cleanup, if any
    if (int rc = ops_->Link(manifest, prev); rc < 0) {
      Cleanup(tmp);
      return ErrnoToStatus(-rc, "link", prev);
    }
  }
  if (int rc = ops_->Rename(tmp, manifest, false); rc < 0) {
    Cleanup(tmp);
    if (always) Cleanup(prev);
    return ErrnoToStatus(-rc, "rename", tmp);
  }
  if (always) {
    absl::Status synced = FsyncDir(dir);
    if (!synced.ok()) {
      if (int rc = ops_->Rename(prev, manifest, false); rc < 0) {
        return absl::Status(synced.code(),
                            absl::StrCat(synced.message(), "; putting the old manifest back failed: ",
                                         ErrnoToStatus(-rc, "rename", prev).message()));
      }
      return synced;
    }
    Cleanup(prev);
  }
  return absl::OkStatus();
}

absl::Status StateStore::CommitStaging(const std::string& staging, absl::string_view id) {
  const std::string target = SessionDir(id);
  if (int rc = ops_->Rename(staging, target, /*no_replace=*/true); rc < 0) {
    if (-rc == EEXIST || -rc == ENOTEMPTY) {
      return absl::AlreadyExistsError(
          absl::StrCat("session ", id, " already has a directory on disk (", target,
                       "; a session that recovery refused stays until removed by hand)"));
    }
    return ErrnoToStatus(-rc, "rename", staging);
  }
  absl::Status synced = MaybeFsyncDir(SessionsDir());
  if (!synced.ok()) {
    if (int rc = ops_->Rename(target, staging, false); rc < 0) {
      return absl::Status(synced.code(),
                          absl::StrCat(synced.message(), "; moving ", target, " back failed: ",
                                       ErrnoToStatus(-rc, "rename", target).message()));
    }
    return synced;
  }
  return absl::OkStatus();
}

absl::Status StateStore::CheckManifestSize(absl::string_view bytes, absl::string_view id) const {
  const uint64_t json = internal::GetU64(bytes.data() + 32);
  if (json > options_.limits.max_manifest_json_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("session ", id, ": manifest JSON of ", json,
                                                   " bytes is over the limit of ",
                                                   options_.limits.max_manifest_json_bytes,
                                                   " (compression config too large?)"));
  }
  return absl::OkStatus();
}

absl::Status StateStore::WriteTurn(const SavedSession& meta, const NewSegment& segment) {
  absl::Time start = absl::Now();
  uint64_t bytes = 0;
  absl::Status status = DoWriteTurn(meta, segment, &bytes);
  ReportWrite(WriteOp::kTurn, start, bytes, status);
  return status;
}

absl::Status StateStore::DoWriteTurn(const SavedSession& meta, const NewSegment& segment,
                                     uint64_t* bytes) {
  if (absl::Status v = meta.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("session meta: ", v.message()));
  }
  const std::string& id = meta.id;
  const int64_t tokens = static_cast<int64_t>(meta.tokens.size());
  if (meta.tokens.size() > options_.limits.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("session ", id, ": tokens: ", tokens,
                                                   " is over the limit of ", options_.limits.max_tokens));
  }
  if (segment.token_begin < 0 || segment.token_begin > segment.token_end || segment.token_end != tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", id, ": segment token range [", segment.token_begin, ", ", segment.token_end,
        ") must satisfy 0 <= token_begin <= token_end == tokens.size() (", tokens, ")"));
  }
  if (segment.blobs.size() > options_.limits.max_blobs) {
    return absl::InvalidArgumentError(absl::StrCat("session ", id, ": segment.blobs: ", segment.blobs.size(),
                                                   " is over the limit of ", options_.limits.max_blobs));
  }

  // The slot: existing, or a new one that only becomes visible as existing on success.
  std::shared_ptr<Slot> slot;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto& entry = slots_[id];
      if (entry == nullptr) entry = std::make_shared<Slot>();
      slot = entry;
    }
    slot->mu.Lock();
    if (!slot->deleted) break;
    slot->mu.Unlock();  // deleted between lookup and lock: look again
  }
  // Lock order everywhere: a slot's mu before the store's mu_.
  absl::Cleanup unlock = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { slot->mu.Unlock(); };
  const bool is_new = !slot->exists;
  absl::Cleanup forget_new = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (slot->exists) return;
    slot->deleted = true;
    absl::MutexLock l(&mu_);
    auto it = slots_.find(id);
    if (it != slots_.end() && it->second == slot) slots_.erase(it);
  };
  if (slot->bad) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id, " failed verification; it takes no writes"));
  }
  const int64_t prev_end = is_new ? 0 : slot->segments.back().token_end;
  if (!segment.supersedes_earlier && segment.token_begin != prev_end) {
    return absl::InvalidArgumentError(absl::StrCat("session ", id, ": segment.token_begin is ",
                                                   segment.token_begin, "; the session's segments end at ",
                                                   prev_end));
  }
  if (!segment.supersedes_earlier && slot->segments.size() + 1 > options_.limits.max_segments) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", id, " has ", slot->segments.size(),
        " segments, the limit; write a segment that supersedes earlier ones"));
  }

  internal::SegmentFixed fixed;
  fixed.flags = segment.supersedes_earlier ? internal::kSegmentFlagSupersedes : 0;
  fixed.model = options_.model;
  fixed.seq = is_new ? 1 : slot->segments.back().seq + 1;
  fixed.token_begin = segment.token_begin;
  fixed.token_end = segment.token_end;
  std::vector<BlobInfo> layout;
  {
    auto header = internal::EncodeSegmentHeader(segment.blobs, &fixed, &layout);
    if (!header.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("session ", id, ": segment: ", header.status().message()));
    }
  }
  // Payload = blobs at their 64-byte aligned offsets, zero padding between.
  std::vector<absl::string_view> parts;
  parts.reserve(1 + 2 * segment.blobs.size());
  parts.emplace_back();  // the header, below
  internal::Xxh3Stream payload_hash;
  uint64_t pos = 0;
  for (size_t i = 0; i < segment.blobs.size(); ++i) {
    if (layout[i].offset > pos) {
      absl::string_view pad(kZeros, layout[i].offset - pos);
      payload_hash.Update(pad);
      parts.push_back(pad);
    }
    payload_hash.Update(segment.blobs[i].data);
    parts.push_back(segment.blobs[i].data);
    pos = layout[i].offset + layout[i].bytes;
  }
  fixed.payload_xxh3 = payload_hash.Digest();
  ECHOKV_ASSIGN_OR_RETURN(std::string header, internal::EncodeSegmentHeader(segment.blobs, &fixed, &layout));
  parts[0] = header;
  // Never write what recovery would refuse.
  if (fixed.table_bytes > options_.limits.max_blob_table_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("session ", id, ": segment blob table of ", fixed.table_bytes,
                                                   " bytes is over the limit of ",
                                                   options_.limits.max_blob_table_bytes));
  }

  SegmentInfo info;
  info.seq = fixed.seq;
  info.token_begin = fixed.token_begin;
  info.token_end = fixed.token_end;
  info.supersedes_earlier = segment.supersedes_earlier;
  info.payload_bytes = fixed.payload_bytes;
  info.file_bytes = fixed.file_bytes();
  info.payload_xxh3 = fixed.payload_xxh3;
  info.header_xxh3 = fixed.header_xxh3;
  info.blobs = std::move(layout);

  SessionManifest manifest;
  manifest.model = options_.model;
  if (!segment.supersedes_earlier) manifest.segments = slot->segments;
  manifest.segments.push_back(info);
  {
    // EncodeManifest copies meta; a SessionManifest holding a reference would avoid it,
    // but the meta is small next to the segment (tokens: 4 bytes each).
    manifest.meta = meta;
  }
  auto manifest_bytes = internal::EncodeManifest(manifest);
  if (!manifest_bytes.ok()) return manifest_bytes.status();
  ECHOKV_RETURN_IF_ERROR(CheckManifestSize(*manifest_bytes, id));

  const std::string dir = is_new ? Join(SessionsDir(), FreshName(kStagingPrefix, id)) : SessionDir(id);
  if (is_new) {
    if (int rc = ops_->Mkdir(dir, 0755); rc < 0) return ErrnoToStatus(-rc, "create directory", dir);
  }
  const std::string seg_path = Join(dir, SegmentFileName(fixed.seq));
  absl::Status status = WriteFileParts(seg_path, parts, bytes);
  if (status.ok()) {
    if (is_new) {
      absl::string_view mparts[] = {*manifest_bytes};
      status = WriteFileParts(Join(dir, kManifestName), mparts, bytes);
      if (status.ok()) status = MaybeFsyncDir(dir);
      if (status.ok()) status = CommitStaging(dir, id);
    } else {
      status = ReplaceManifest(dir, *manifest_bytes, bytes);
    }
  }
  if (!status.ok()) {
    if (is_new) {
      RemoveTree(dir);
    } else {
      Cleanup(seg_path);
    }
    return status;
  }
  // Acknowledged. Superseded files are no longer referenced: remove them.
  if (segment.supersedes_earlier) {
    for (const SegmentInfo& old : slot->segments) Cleanup(Join(dir, SegmentFileName(old.seq)));
    slot->segments.clear();
    slot->verified.clear();
  }
  slot->segments.push_back(std::move(info));
  slot->verified.push_back(true);  // written from memory by this process
  slot->exists = true;
  return absl::OkStatus();
}

absl::Status StateStore::UpdateSession(const SavedSession& meta) {
  absl::Time start = absl::Now();
  uint64_t bytes = 0;
  absl::Status status = DoUpdate(meta, &bytes);
  ReportWrite(WriteOp::kUpdate, start, bytes, status);
  return status;
}

absl::Status StateStore::DoUpdate(const SavedSession& meta, uint64_t* bytes) {
  if (absl::Status v = meta.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("session meta: ", v.message()));
  }
  std::shared_ptr<Slot> slot = FindSlot(meta.id);
  if (slot == nullptr) return absl::NotFoundError(absl::StrCat("session ", meta.id, " is not in the store"));
  absl::MutexLock l(&slot->mu);
  if (slot->deleted || !slot->exists) {
    return absl::NotFoundError(absl::StrCat("session ", meta.id, " is not in the store"));
  }
  if (slot->bad) {
    return absl::FailedPreconditionError(absl::StrCat("session ", meta.id, " failed verification; it takes no writes"));
  }
  if (static_cast<uint64_t>(slot->segments.back().token_end) != meta.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", meta.id, ": tokens has ", meta.tokens.size(), " entries; the segments cover ",
        slot->segments.back().token_end, " (UpdateSession cannot change the token history)"));
  }
  SessionManifest manifest;
  manifest.meta = meta;
  manifest.model = options_.model;
  manifest.segments = slot->segments;
  ECHOKV_ASSIGN_OR_RETURN(std::string manifest_bytes, internal::EncodeManifest(manifest));
  ECHOKV_RETURN_IF_ERROR(CheckManifestSize(manifest_bytes, meta.id));
  return ReplaceManifest(SessionDir(meta.id), manifest_bytes, bytes);
}

absl::Status StateStore::DeleteSession(absl::string_view id) {
  absl::Time start = absl::Now();
  absl::Status status = DoDelete(id);
  ReportWrite(WriteOp::kDelete, start, 0, status);
  return status;
}

absl::Status StateStore::DoDelete(absl::string_view id) {
  std::shared_ptr<Slot> slot = FindSlot(id);
  if (slot == nullptr) return absl::NotFoundError(absl::StrCat("session ", id, " is not in the store"));
  absl::MutexLock l(&slot->mu);
  if (slot->deleted || !slot->exists) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is not in the store"));
  }
  const std::string dir = SessionDir(id);
  const std::string gone = Join(SessionsDir(), FreshName(kDeletedPrefix, id));
  if (int rc = ops_->Rename(dir, gone, false); rc < 0) return ErrnoToStatus(-rc, "rename", dir);
  absl::Status synced = MaybeFsyncDir(SessionsDir());
  if (!synced.ok()) {
    if (int rc = ops_->Rename(gone, dir, false); rc < 0) {
      return absl::Status(synced.code(), absl::StrCat(synced.message(), "; moving ", gone,
                                                      " back failed: ",
                                                      ErrnoToStatus(-rc, "rename", gone).message()));
    }
    return synced;
  }
  slot->deleted = true;
  {
    absl::MutexLock ml(&mu_);
    auto it = slots_.find(id);
    if (it != slots_.end() && it->second == slot) slots_.erase(it);
  }
  RemoveTree(gone);  // best effort; OpenAll removes what is left
  return absl::OkStatus();
}


}  // namespace echokv::state
