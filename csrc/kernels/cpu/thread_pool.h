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

/// The runnable-thread count in the text of /proc/loadavg ("0.20 0.18 0.12
/// 3/412 1234": the 3); -1 when the text has no such field.
int64_t loadavg_runnable(const char* text);

class ThreadPool {
 public:
  /// Threads of others that want a CPU now, given how many of the pool's own
  /// threads are awake; -1 when unknown (then the pool shares every job).
  using LoadProbe = std::function<int64_t(int64_t own_awake)>;

  /// num_threads counts the calling thread: 1 means no extra threads.
  /// Starts num_threads - 1 workers (the caller is the last thread). Throws
  /// std::runtime_error when one cannot be started, after stopping the others.
  /// probe: where the load comes from; empty (the product) reads the run
  /// queue of /proc/loadavg; tests pass a scripted one.
  explicit ThreadPool(int64_t num_threads, LoadProbe probe = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int64_t num_threads() const { return num_threads_; }
  /// Whether the next job is shared with the workers (false: the caller runs
  /// it alone because the machine's cores are taken; see thread_pool.cpp).
  bool sharing() const { return share_ && num_threads_ > 1; }

  /// Runs fn(begin, end) over [0, n) split into contiguous chunks whose sizes
  /// are multiples of `grain` (except the last). Blocks until all are done.
  /// Chunks (several per thread) are claimed dynamically, so the caller
  /// finishes the job alone when a worker is not scheduled; while the
  /// machine's run queue shows the cores taken by others, the caller runs
  /// whole jobs alone (see thread_pool.cpp). The split never changes what an
  /// index computes.
  /// Not reentrant: one caller thread at a time.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  /// Sets stop_, wakes the workers and joins them (destructor; a constructor that failed).
  void stop_workers();
  /// Claims and runs chunks of the job published as `epoch` until none is left.
  void drain(uint32_t epoch);
  /// Waits for workers still running a chunk (sleeping once one is late).
  void wait_workers(int64_t own_ns);
  /// Threads of others runnable now: /proc/loadavg's runnable count less own_awake; -1 when unknown.
  int64_t others_from_loadavg(int64_t own_awake) const;
  void close_loadavg();
  /// Updates the estimate of others' runnable threads; decides share_ (see thread_pool.cpp).
  void sample_load();

  int64_t num_threads_;
  int64_t cpus_;          // CPUs this process may use
  int loadavg_fd_ = -1;   // /proc/loadavg, -1 where there is none or a probe was given
  LoadProbe probe_;
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
  std::atomic<int64_t> sleeping_{0};  // workers waiting on cv_
  // The job of the current epoch; written only while no worker runs a chunk.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  // Caller-only: jobs since the last look at the run queue, the moving
  // average of others' runnable threads, and whether jobs are shared now.
  int64_t since_sample_ = 0;
  double others_ = 0;
  bool share_ = true;
};

}  // namespace ssd::kernels
