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
  /// Starts num_threads - 1 workers (the caller is the last thread). Throws
  /// std::runtime_error when one cannot be started, after stopping the others.
  explicit ThreadPool(int64_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int64_t num_threads() const { return num_threads_; }

  /// Runs fn(begin, end) over [0, n) split into contiguous chunks whose sizes
  /// are multiples of `grain` (except the last). Blocks until all are done.
  /// Chunks (several per thread) are claimed dynamically, so the caller
  /// finishes the job alone when a worker is not scheduled; while the cores
  /// are oversubscribed (a worker late or descheduled) the caller runs whole
  /// jobs alone for a while (see thread_pool.cpp). The split never changes
  /// what an index computes.
  /// Not reentrant: one caller thread at a time.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  /// Sets stop_, wakes the workers and joins them (destructor; a constructor that failed).
  void stop_workers();
  /// Claims and runs chunks of the job published as `epoch` until none is left.
  void drain(uint32_t epoch);
  /// Waits for workers still running a chunk; true when one was late (see thread_pool.cpp).
  bool wait_workers(int64_t own_ns);
  /// Starts a solo spell, twice as long as the last one in a row.
  void back_off();

  int64_t num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;       // workers wait here for a job
  std::condition_variable done_cv_;  // the caller waits here for active_ == 0
  bool stop_ = false;
  bool caller_waiting_ = false;  // guarded by mu_
  // Epoch, chunk count and next unclaimed chunk packed in one word, so a claim
  // can never cross into another job (see thread_pool.cpp).
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> active_{0};  // workers inside drain()
  std::atomic<bool> crowded_{false};  // a worker was descheduled while spinning
  // The job of the current epoch; written only while no worker runs a chunk.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  // Caller-only: jobs still to run alone, the next solo spell's length, and
  // shared jobs in a row without a late worker.
  int64_t solo_left_ = 0;
  int64_t solo_next_ = 0;
  int64_t on_time_ = 0;
};

}  // namespace ssd::kernels
