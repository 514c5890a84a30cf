#include "thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define SSD_CPU_RELAX() _mm_pause()
#else
#define SSD_CPU_RELAX() std::this_thread::yield()
#endif

namespace ssd::kernels {

namespace {
// Workers spin this long after a job before sleeping: decode issues thousands
// of small parallel regions per second and a futex wake costs tens of microseconds.
constexpr auto kSpinTime = std::chrono::microseconds(2000);
}  // namespace

ThreadPool::ThreadPool(int64_t num_threads) : num_threads_(std::max<int64_t>(1, num_threads)) {
  for (int64_t i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    epoch_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int64_t index) {
  const int64_t begin = index * chunk_;
  const int64_t end = std::min(n_, begin + chunk_);
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (num_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  const int64_t parts = std::min(num_threads_, units);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = ((units + parts - 1) / parts) * grain;
    pending_.store(num_threads_ - 1, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_chunk(0);
  while (pending_.load(std::memory_order_acquire) != 0) SSD_CPU_RELAX();
}

void ThreadPool::worker_loop(int64_t index) {
  uint64_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    uint64_t now = epoch_.load(std::memory_order_acquire);
    int spins = 0;
    while (now == seen) {
      SSD_CPU_RELAX();
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return epoch_.load(std::memory_order_acquire) != seen; });
      }
      now = epoch_.load(std::memory_order_acquire);
    }
    seen = now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    run_chunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace ssd::kernels
