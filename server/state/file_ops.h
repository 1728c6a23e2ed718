// The file-system seam of the state store: every open, write, fsync, rename, ... the
// store does goes through a FileOps, so tests can make any single call fail the way a
// full disk or a dying disk does. The calls mirror POSIX and return -errno on failure;
// the store turns errno into a Status in one place (ErrnoToStatus).
//
//   state::PosixFileOps posix;
//   state::FaultInjectingFileOps faults(&posix);
//   faults.FailAt(state::FileOp::kFsync, /*nth=*/2, ENOSPC);  // the 2nd fsync from now
//   options.file_ops = &faults;
//   auto store = state::StateStore::Create(options);
#ifndef ECHOKV_SERVER_STATE_FILE_OPS_H_
#define ECHOKV_SERVER_STATE_FILE_OPS_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace echokv::state {

// The operations a FaultInjectingFileOps can fail, one counter each.
enum class FileOp {
  kOpenWrite,  // Open with O_CREAT (a new or truncated file)
  kOpenRead,   // Open without O_CREAT (files and directories)
  kWrite,
  kPread,
  kFsync,
  kClose,
  kRename,
  kLink,
  kMkdir,
  kUnlink,
  kRmdir,
  kListDir,
  kStat,
};
inline constexpr int kNumFileOps = 13;
absl::string_view FileOpName(FileOp op);  // "open_write", "write", ...

class FileOps {
 public:
  virtual ~FileOps() = default;
  // open(2): an fd or -errno.
  virtual int Open(const std::string& path, int flags, mode_t mode) = 0;
  // write(2) / pread(2): bytes done (possibly short) or -errno.
  virtual int64_t Write(int fd, const void* data, size_t size) = 0;
  virtual int64_t Pread(int fd, void* data, size_t size, uint64_t offset) = 0;
  // fsync(2), close(2): 0 or -errno.
  virtual int Fsync(int fd) = 0;
  virtual int Close(int fd) = 0;
  // rename(2); with no_replace, renameat2(RENAME_NOREPLACE) (EEXIST when `to` exists).
  virtual int Rename(const std::string& from, const std::string& to, bool no_replace) = 0;
  virtual int Link(const std::string& from, const std::string& to) = 0;
  virtual int Mkdir(const std::string& path, mode_t mode) = 0;
  virtual int Unlink(const std::string& path) = 0;
  virtual int Rmdir(const std::string& path) = 0;
  // Names in a directory except "." and "..", in no particular order; 0 or -errno.
  virtual int ListDir(const std::string& path, std::vector<std::string>* names) = 0;
  // lstat(2) of a path (fd < 0) or fstat(2) of fd: 0 or -errno.
  virtual int Stat(const std::string& path, int fd, struct stat* st) = 0;
};

// The real calls (EINTR retried).
class PosixFileOps : public FileOps {
 public:
  int Open(const std::string& path, int flags, mode_t mode) override;
  int64_t Write(int fd, const void* data, size_t size) override;
  int64_t Pread(int fd, void* data, size_t size, uint64_t offset) override;
  int Fsync(int fd) override;
  int Close(int fd) override;
  int Rename(const std::string& from, const std::string& to, bool no_replace) override;
  int Link(const std::string& from, const std::string& to) override;
  int Mkdir(const std::string& path, mode_t mode) override;
  int Unlink(const std::string& path) override;
  int Rmdir(const std::string& path) override;
  int ListDir(const std::string& path, std::vector<std::string>* names) override;
  int Stat(const std::string& path, int fd, struct stat* st) override;
};

// Wraps another FileOps; counts every call per FileOp and fails the nth call of one op
// (counted from the FailAt call) with an errno. Single-threaded use (tests).
class FaultInjectingFileOps : public FileOps {
 public:
  explicit FaultInjectingFileOps(FileOps* base) : base_(base) {}

  // The `nth` (1-based) call of `op` after this one fails with `err` (ENOSPC, EIO, ...)
  // and does nothing. For kWrite with partial=true that call instead writes half of its
  // bytes (a short write, as a filling disk does) and the next write call fails.
  // Replaces any earlier armed fault.
  void FailAt(FileOp op, int nth, int err, bool partial = false);
  void Disarm() { armed_ = false; }
  // True once the armed fault has fired.
  bool fired() const { return fired_; }
  // Calls per op since construction or ResetCounts.
  int count(FileOp op) const { return counts_[static_cast<int>(op)]; }
  void ResetCounts() { counts_.fill(0); }

  int Open(const std::string& path, int flags, mode_t mode) override;
  int64_t Write(int fd, const void* data, size_t size) override;
  int64_t Pread(int fd, void* data, size_t size, uint64_t offset) override;
  int Fsync(int fd) override;
  int Close(int fd) override;
  int Rename(const std::string& from, const std::string& to, bool no_replace) override;
  int Link(const std::string& from, const std::string& to) override;
  int Mkdir(const std::string& path, mode_t mode) override;
  int Unlink(const std::string& path) override;
  int Rmdir(const std::string& path) override;
  int ListDir(const std::string& path, std::vector<std::string>* names) override;
  int Stat(const std::string& path, int fd, struct stat* st) override;

 private:
  // Counts a call of `op`; returns the errno to fail it with, or 0 to let it through.
  int Tick(FileOp op);

  FileOps* base_;                             // not owned; does the real work
  std::array<int, kNumFileOps> counts_{};     // calls per op
  bool armed_ = false;                        // a fault is pending
  bool fired_ = false;                        // the armed fault has fired
  FileOp op_ = FileOp::kWrite;                // the op to fail
  int remaining_ = 0;                         // calls of op_ left before the failing one
  int err_ = 0;                               // errno to fail with
  bool partial_ = false;                      // kWrite: short write first
  bool fail_next_write_ = false;              // after a partial write: fail the next one
};

// The store's one errno -> Status mapping: ENOSPC / EDQUOT -> RESOURCE_EXHAUSTED, every
// other errno -> INTERNAL; the message is "<what> <path>: <strerror> (errno N)", and the
// errno rides along as a payload (ErrnoOf) so a caller can say what failed without the
// path.
absl::Status ErrnoToStatus(int err, absl::string_view what, absl::string_view path);
// The errno ErrnoToStatus put in `status`; nullopt for OK or a status without one.
std::optional<int> ErrnoOf(const absl::Status& status);

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_FILE_OPS_H_
