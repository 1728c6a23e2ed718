// The HTTP door's side of one completion (openai_server.cc): the deltas Sessions::Complete
// delivers queue here on the engine thread and the connection's worker takes them, and
// the worker waits here for the session's id and for the end. Door-internal.
//
//   auto generation = std::make_shared<Generation>(sessions, limits.max_stream_backlog);
//   generation->set_completion(sessions->Complete(std::move(request), generation->Sink(stream),
//                                                 generation->OnSession(), generation->Done()));
//   const std::string id = generation->WaitSession();
//   ... generation->Take(poll, &deltas); write them; generation->Written(); ...
#ifndef ECHOKV_SERVER_DOORS_HTTP_COMPLETION_STREAM_H_
#define ECHOKV_SERVER_DOORS_HTTP_COMPLETION_STREAM_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/sessions/sessions.h"

namespace echokv::server::http_door {

// One completion's generation: its deltas queue here (engine thread) and the HTTP worker
// takes them. For streams, backlog() = deltas queued + those being written: what the
// client has not taken yet, so the scheduler skips a slow reader instead of queueing
// without bound (EngineLimits::max_stream_backlog).
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(Sessions* sessions, int max_backlog) : sessions_(sessions), max_backlog_(max_backlog) {}

  // The completion this generation belongs to (Sessions::Complete's handle).
  void set_completion(std::shared_ptr<Completion> c) {
    absl::MutexLock lock(&mu_);
    completion_ = std::move(c);
  }
  // The client does not get the whole reply (Completion::Abandon).
  void Abandon() {
    std::shared_ptr<Completion> c;
    {
      absl::MutexLock lock(&mu_);
      c = completion_;
    }
    if (c != nullptr) c->Abandon();
  }

  std::function<void(const std::string&)> OnSession() {
    return [self = shared_from_this()](const std::string& id) {
      absl::MutexLock lock(&self->mu_);
      self->session_id_ = id;
    };
  }
  // Blocks until the session is known or the generation ended (creating it failed);
  // returns the session's id, "" for the latter.
  std::string WaitSession() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Generation::SessionKnownOrDone));
    return session_id_;
  }

  StreamSink Sink(bool streaming) {
    StreamSink sink;
    std::shared_ptr<Generation> self = shared_from_this();
    sink.on_delta = [self](GenerateDelta d) {
      absl::MutexLock lock(&self->mu_);
      self->queue_.push_back(std::move(d));
    };
    if (streaming) {
      sink.backlog = [self] {
        absl::MutexLock lock(&self->mu_);
        return static_cast<int>(self->queue_.size()) + self->writing_;
      };
    }
    return sink;
  }

  DoneFn<GenerateSummary> Done() {
    return [self = shared_from_this()](absl::StatusOr<GenerateSummary> r) {
      absl::MutexLock lock(&self->mu_);
      self->result_ = std::move(r);
      self->done_ = true;
    };
  }

  // Blocks until a delta or the end arrived.
  void WaitFirstEvent() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Generation::HasEvent));
  }

  // The end, with no delta before it.
  bool EndedEmpty() {
    absl::MutexLock lock(&mu_);
    return done_ && queue_.empty();
  }

  enum class Next { kDeltas, kEnd, kIdle };
  // Takes every queued delta (then call Written() after writing them), or reports the
  // end once the queue is empty, or kIdle after `wait` with nothing new.
  Next Take(absl::Duration wait, std::vector<GenerateDelta>* out) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &Generation::HasEvent), wait);
    if (!queue_.empty()) {
      held_back_ = static_cast<int>(queue_.size()) >= max_backlog_;
      for (GenerateDelta& d : queue_) out->push_back(std::move(d));
      queue_.clear();
      writing_ = static_cast<int>(out->size());
      return Next::kDeltas;
    }
    return done_ ? Next::kEnd : Next::kIdle;
  }

  // The deltas of the last Take() left for the client.
  void Written() {
    bool wake = false;
    {
      absl::MutexLock lock(&mu_);
      // The scheduler skips the stream while queued + being written reaches the limit
      // (it may have looked at any moment since Take); wake it if that could be so.
      wake = held_back_ || static_cast<int>(queue_.size()) + writing_ >= max_backlog_;
      writing_ = 0;
      held_back_ = false;
    }
    if (wake) sessions_->Wake();  // the scheduler may have skipped this stream
  }

  // Blocks until the engine finished; returns its result and every delta not taken.
  absl::StatusOr<GenerateSummary> WaitEnd(std::vector<GenerateDelta>* rest = nullptr) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (rest != nullptr) {
      for (GenerateDelta& d : queue_) rest->push_back(std::move(d));
      queue_.clear();
    }
    return result_;
  }

  absl::StatusOr<GenerateSummary> result() {
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  bool HasEvent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || done_; }
  bool SessionKnownOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !session_id_.empty() || done_; }

  Sessions* sessions_;             // not owned
  const int max_backlog_;          // EngineLimits::max_stream_backlog
  absl::Mutex mu_;
  std::shared_ptr<Completion> completion_ ABSL_GUARDED_BY(mu_);
  std::string session_id_ ABSL_GUARDED_BY(mu_);             // Sessions::Complete's on_session
  std::deque<GenerateDelta> queue_ ABSL_GUARDED_BY(mu_);   // deltas not yet taken
  int writing_ ABSL_GUARDED_BY(mu_) = 0;                   // taken, being written
  bool held_back_ ABSL_GUARDED_BY(mu_) = false;            // the queue was at the backlog limit
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<GenerateSummary> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not finished");
};

}  // namespace echokv::server::http_door

#endif  // ECHOKV_SERVER_DOORS_HTTP_COMPLETION_STREAM_H_
