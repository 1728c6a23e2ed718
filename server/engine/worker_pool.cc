#include "server/engine/worker_pool.h"

#include <utility>

namespace echokv::server {

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() { Shutdown(); }

void WorkerPool::Submit(std::function<void(bool)> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  task(/*cancelled=*/true);
}

int WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(tasks_.size());
}

void WorkerPool::Run() {
  while (true) {
    std::function<void(bool)> task;
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->tasks_.empty(); },
          this));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
      cancelled = stopping_;
    }
    task(cancelled);
  }
}

void WorkerPool::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

}  // namespace echokv::server
