#include "server/state/file_ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace echokv::state {

absl::string_view FileOpName(FileOp op) {
  switch (op) {
    case FileOp::kOpenWrite: return "open_write";
    case FileOp::kOpenRead: return "open_read";
    case FileOp::kWrite: return "write";
    case FileOp::kPread: return "pread";
    case FileOp::kFsync: return "fsync";
    case FileOp::kClose: return "close";
    case FileOp::kRename: return "rename";
    case FileOp::kLink: return "link";
    case FileOp::kMkdir: return "mkdir";
    case FileOp::kUnlink: return "unlink";
    case FileOp::kRmdir: return "rmdir";
    case FileOp::kListDir: return "list_dir";
    case FileOp::kStat: return "stat";
  }
  return "unknown";
}

namespace {
constexpr char kErrnoPayloadUrl[] = "echokv.state/errno";
}  // namespace

absl::Status ErrnoToStatus(int err, absl::string_view what, absl::string_view path) {
  std::string message = absl::StrCat(what, " ", path, ": ", strerror(err), " (errno ", err, ")");
  absl::Status status =
      err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
  status.SetPayload(kErrnoPayloadUrl, absl::Cord(absl::StrCat(err)));
  return status;
}

std::optional<int> ErrnoOf(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  absl::optional<absl::Cord> payload = status.GetPayload(kErrnoPayloadUrl);
  int err = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &err)) return std::nullopt;
  return err;
}

// ---- PosixFileOps ----

int PosixFileOps::Open(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd < 0 ? -errno : fd;
}

int64_t PosixFileOps::Write(int fd, const void* data, size_t size) {
  ssize_t n;
  do {
    n = ::write(fd, data, size);
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : n;
}

int64_t PosixFileOps::Pread(int fd, void* data, size_t size, uint64_t offset) {
  ssize_t n;
  do {
    n = ::pread(fd, data, size, static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : n;
}

int PosixFileOps::Fsync(int fd) { return ::fsync(fd) < 0 ? -errno : 0; }

int PosixFileOps::Close(int fd) {
  // Linux closes the fd even when close() reports an error; never retry.
  return ::close(fd) < 0 ? -errno : 0;
}

int PosixFileOps::Rename(const std::string& from, const std::string& to, bool no_replace) {
  if (no_replace) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -errno;
    // A file system without RENAME_NOREPLACE: check, then rename (the store holds the
    // directory lock, so nobody else creates `to` in between).
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) return -EEXIST;
  }
  return ::rename(from.c_str(), to.c_str()) < 0 ? -errno : 0;
}

int PosixFileOps::Link(const std::string& from, const std::string& to) {
  return ::link(from.c_str(), to.c_str()) < 0 ? -errno : 0;
}

int PosixFileOps::Mkdir(const std::string& path, mode_t mode) {
  return ::mkdir(path.c_str(), mode) < 0 ? -errno : 0;
}

int PosixFileOps::Unlink(const std::string& path) {
  return ::unlink(path.c_str()) < 0 ? -errno : 0;
}

int PosixFileOps::Rmdir(const std::string& path) { return ::rmdir(path.c_str()) < 0 ? -errno : 0; }

int PosixFileOps::ListDir(const std::string& path, std::vector<std::string>* names) {
  names->clear();
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return -errno;
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    names->emplace_back(e->d_name);
  }
  int err = errno;
  ::closedir(dir);
  return err != 0 ? -err : 0;
}

int PosixFileOps::Stat(const std::string& path, int fd, struct stat* st) {
  int rc = fd >= 0 ? ::fstat(fd, st) : ::lstat(path.c_str(), st);
  return rc < 0 ? -errno : 0;
}

// ---- FaultInjectingFileOps ----

void FaultInjectingFileOps::FailAt(FileOp op, int nth, int err, bool partial) {
  armed_ = nth >= 1;
  fired_ = false;
  op_ = op;
  remaining_ = nth - 1;
  err_ = err;
  partial_ = partial;
  fail_next_write_ = false;
}

int FaultInjectingFileOps::Tick(FileOp op) {
  ++counts_[static_cast<int>(op)];
  if (!armed_ || op != op_) return 0;
  if (remaining_ > 0) {
    --remaining_;
    return 0;
  }
  armed_ = false;
  fired_ = true;
  return err_;
}

int FaultInjectingFileOps::Open(const std::string& path, int flags, mode_t mode) {
  int err = Tick((flags & O_CREAT) ? FileOp::kOpenWrite : FileOp::kOpenRead);
  return err ? -err : base_->Open(path, flags, mode);
}

int64_t FaultInjectingFileOps::Write(int fd, const void* data, size_t size) {
  if (fail_next_write_) {
    ++counts_[static_cast<int>(FileOp::kWrite)];
    fail_next_write_ = false;
    return -err_;
  }
  int err = Tick(FileOp::kWrite);
  if (err == 0) return base_->Write(fd, data, size);
  if (partial_ && size >= 2) {
    fail_next_write_ = true;
    return base_->Write(fd, data, size / 2);
  }
  return -err;
}

int64_t FaultInjectingFileOps::Pread(int fd, void* data, size_t size, uint64_t offset) {
  int err = Tick(FileOp::kPread);
  return err ? -err : base_->Pread(fd, data, size, offset);
}

int FaultInjectingFileOps::Fsync(int fd) {
  int err = Tick(FileOp::kFsync);
  return err ? -err : base_->Fsync(fd);
}

int FaultInjectingFileOps::Close(int fd) {
  int err = Tick(FileOp::kClose);
  if (err) {
    base_->Close(fd);  // like Linux: the fd is gone even though close reported an error
    return -err;
  }
  return base_->Close(fd);
}

int FaultInjectingFileOps::Rename(const std::string& from, const std::string& to,
                                  bool no_replace) {
  int err = Tick(FileOp::kRename);
  return err ? -err : base_->Rename(from, to, no_replace);
}

int FaultInjectingFileOps::Link(const std::string& from, const std::string& to) {
  int err = Tick(FileOp::kLink);
  return err ? -err : base_->Link(from, to);
}

int FaultInjectingFileOps::Mkdir(const std::string& path, mode_t mode) {
  int err = Tick(FileOp::kMkdir);
  return err ? -err : base_->Mkdir(path, mode);
}

int FaultInjectingFileOps::Unlink(const std::string& path) {
  int err = Tick(FileOp::kUnlink);
  return err ? -err : base_->Unlink(path);
}

int FaultInjectingFileOps::Rmdir(const std::string& path) {
  int err = Tick(FileOp::kRmdir);
  return err ? -err : base_->Rmdir(path);
}

int FaultInjectingFileOps::ListDir(const std::string& path, std::vector<std::string>* names) {
  int err = Tick(FileOp::kListDir);
  return err ? -err : base_->ListDir(path, names);
}

int FaultInjectingFileOps::Stat(const std::string& path, int fd, struct stat* st) {
  int err = Tick(FileOp::kStat);
  return err ? -err : base_->Stat(path, fd, st);
}

}  // namespace echokv::state
