// Plain stats the state store reports (docs/DESIGN.md rule 10: no Prometheus here). The
// server's Metrics implements StateObserver and turns the calls into
// echokv_state_write_seconds and echokv_state_errors_total{kind}. No session ids.
//
//   class Counting : public state::StateObserver {
//     void OnStateError(state::ErrorKind kind) override { ++errors[int(kind)]; }
//   };
//   options.observer = &counting;   // StoreOptions; must outlive the store
#ifndef ECHOKV_SERVER_STATE_OBSERVER_H_
#define ECHOKV_SERVER_STATE_OBSERVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/state/types.h"

namespace echokv::state {

enum class WriteOp {
  kTurn,           // WriteTurn (segment + manifest)
  kUpdate,         // UpdateSession (manifest only)
  kImport,         // a snapshot import: reported by Finish (bytes = the stream's length)
  kDelete,         // DeleteSession
};

struct WriteStats {
  WriteOp op = WriteOp::kTurn;
  absl::Duration duration;           // the whole call, fsyncs included
  uint64_t bytes = 0;                // bytes written to files (0 for a delete)
  absl::StatusCode code = absl::StatusCode::kOk;  // the call's result
};

// Called from whatever thread called the store; implementations must be thread-safe if
// the store is used from several threads. The defaults do nothing.
class StateObserver {
 public:
  virtual ~StateObserver() = default;
  // After every write, successful or not.
  virtual void OnWrite(const WriteStats& stats) {}
  // Once per refused session or segment (OpenAll, OpenSession, export): the error's kind.
  virtual void OnStateError(ErrorKind kind) {}
  // A best-effort cleanup failed (a superseded segment file or a deleted session's files
  // could not be removed). Nothing acknowledged is affected; OpenAll retries the cleanup.
  virtual void OnCleanupFailed(const absl::Status& status) {}
};

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_OBSERVER_H_
