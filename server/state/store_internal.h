// The StateStore's own constants and helpers, shared by its three files: store.cc
// (setup, file helpers, writes), store_recovery.cc (OpenAll, at start) and
// store_read.cc (SessionReader, OpenSession). Not part of the state API: included by
// those files only.
#ifndef ECHOKV_SERVER_STATE_STORE_INTERNAL_H_
#define ECHOKV_SERVER_STATE_STORE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/state/file_ops.h"
#include "server/state/format.h"
#include "server/state/types.h"

namespace echokv::state::store_internal {

inline constexpr char kFormatFile[] = "FORMAT";
inline constexpr char kLockFile[] = "LOCK";
inline constexpr char kSessionsDir[] = "sessions";
inline constexpr char kManifestName[] = "manifest";
inline constexpr char kManifestTmp[] = "manifest.tmp";
inline constexpr char kManifestPrev[] = "manifest.prev";
inline constexpr absl::string_view kStagingPrefix = ".tmp-";
inline constexpr absl::string_view kDeletedPrefix = ".del-";
inline constexpr absl::string_view kFormatName = "echokv-state";
inline constexpr int kLayoutVersion = 1;
inline constexpr size_t kReadChunk = size_t{1} << 20;
inline constexpr size_t kMaxWrite = size_t{1} << 30;
inline const char kZeros[internal::kBlobAlignment] = {};

inline std::string Join(absl::string_view a, absl::string_view b) { return absl::StrCat(a, "/", b); }

// "seg-<decimal seq>.ekv" -> seq.
inline bool ParseSegmentFileName(absl::string_view name, uint64_t* seq) {
  if (!absl::ConsumePrefix(&name, "seg-") || !absl::ConsumeSuffix(&name, ".ekv") || name.empty()) {
    return false;
  }
  for (char c : name) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(name, seq);
}

// Attaches kIo to an errno status (reads).
inline absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  return WithErrorKind(ErrnoToStatus(err, what, path), ErrorKind::kIo);
}

inline std::string FormatFileText() {
  return absl::StrCat("{\"format\":\"", kFormatName, "\",\"version\":", kLayoutVersion, "}\n");
}

}  // namespace echokv::state::store_internal

#endif  // ECHOKV_SERVER_STATE_STORE_INTERNAL_H_
