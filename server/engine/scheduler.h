// The engine's scheduler (docs/ENGINE.md): each step, decide what runs. Torch-free and
// stateless apart from a fairness cursor, so it is tested with fake work.
//
// A step runs, in this order: one decode row for every ready stream (a stream whose
// reader is backed up is skipped, never buffered without bound) and for every job
// waiting on a lookahead decode (EchoKV / LAQ rounds join the same batch); prefill
// slices of waiting jobs, oldest first, within the step's token budget (decode rows
// count one token each; prefill always gets at least min_prefill_tokens so it moves
// even under a full decode batch); and at most max_phase_jobs bounded policy phases
// (scoring / selection), round robin.
//
//   Scheduler sched(SchedulerOptions{.max_step_tokens = 256});
//   Plan plan = sched.Schedule(streams, jobs);    // views of the engine's work
//   for (uint64_t id : plan.decode_streams) ...
#ifndef ECHOKV_SERVER_ENGINE_SCHEDULER_H_
#define ECHOKV_SERVER_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace echokv::server {

struct SchedulerOptions {
  int64_t max_step_tokens = 256;   // decode rows + prefill tokens per step
  int64_t min_prefill_tokens = 16; // prefill tokens per step when a job waits, at least
  int max_phase_jobs = 1;          // policy phases per step
  absl::Status Validate() const;   // names the bad field
};

// A generation stream as the scheduler sees it.
struct StreamView {
  uint64_t id = 0;
  bool ready = true;  // false: its reader has not read enough of what it was sent
};

// A prefill / compression job as the scheduler sees it.
struct JobView {
  enum class Next {
    kPrefill,  // prefill_remaining tokens to prefill
    kPhase,    // a bounded policy phase (or the final swap) to run
    kDecode,   // a lookahead decode row
    kWaiting,  // nothing to run (e.g. its state write is in flight)
  };
  uint64_t id = 0;  // admission order: lower = older
  Next next = Next::kWaiting;
  int64_t prefill_remaining = 0;
};

struct Plan {
  struct PrefillSlice {
    uint64_t job = 0;
    int64_t tokens = 0;
  };
  std::vector<uint64_t> decode_streams;  // one decode row each
  std::vector<uint64_t> decode_jobs;     // lookahead rows, one each
  std::vector<PrefillSlice> prefill;     // in execution order
  std::vector<uint64_t> phase_jobs;      // one phase each
  bool empty() const {
    return decode_streams.empty() && decode_jobs.empty() && prefill.empty() && phase_jobs.empty();
  }
  int64_t tokens() const;                // decode rows + prefill tokens
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options) : options_(options) {}
  // `jobs` in any order; they are served oldest (lowest id) first.
  Plan Schedule(absl::Span<const StreamView> streams, absl::Span<const JobView> jobs);
  const SchedulerOptions& options() const { return options_; }

 private:
  SchedulerOptions options_;
  uint64_t last_phase_job_ = 0;  // round-robin cursor over phase jobs
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_SCHEDULER_H_
