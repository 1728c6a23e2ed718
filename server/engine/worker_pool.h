// A fixed pool of threads running closures in FIFO order (the engine's edge workers:
// validation and tokenization off the engine thread). Shutdown runs what is queued
// with `cancelled` = true so every request still gets its answer.
//
//   WorkerPool pool(2);
//   pool.Submit([](bool cancelled) { ... });
//   pool.Shutdown();   // joins
#ifndef ECHOKV_SERVER_ENGINE_WORKER_POOL_H_
#define ECHOKV_SERVER_ENGINE_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace echokv::server {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();  // Shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; after Shutdown it runs inline with cancelled = true.
  void Submit(std::function<void(bool cancelled)> task);
  int queued() const;
  void Shutdown();

 private:
  void Run();
  mutable absl::Mutex mu_;
  std::deque<std::function<void(bool)>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_WORKER_POOL_H_
