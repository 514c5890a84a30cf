// A small fixed-size thread pool for the CPU kernels. Each worker (target,
// draft) owns one, so two models can run on disjoint cores at the same time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ssd::kernels {

class ThreadPool {
 public:
  /// num_threads counts the calling thread: 1 means no extra threads.
  explicit ThreadPool(int64_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int64_t num_threads() const { return num_threads_; }

  /// Runs fn(begin, end) over [0, n) split into contiguous chunks whose sizes
  /// are multiples of `grain` (except the last). Blocks until all are done.
  /// The split never changes what a single index computes.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int64_t index);
  void run_chunk(int64_t index);

  int64_t num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int64_t> pending_{0};
  bool stop_ = false;
  // Job of the current epoch.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
};

}  // namespace ssd::kernels
