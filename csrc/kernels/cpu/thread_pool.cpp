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

// state_ = epoch (32 bits) | number of chunks (16) | next unclaimed chunk (16).
uint32_t epoch_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
int64_t chunks_of(uint64_t state) { return static_cast<int64_t>((state >> 16) & 0xffffu); }
int64_t next_of(uint64_t state) { return static_cast<int64_t>(state & 0xffffu); }
}  // namespace

ThreadPool::ThreadPool(int64_t num_threads) : num_threads_(std::max<int64_t>(1, num_threads)) {
  for (int64_t i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(uint32_t epoch) {
  uint64_t state = state_.load(std::memory_order_acquire);
  for (;;) {
    if (epoch_of(state) != epoch || next_of(state) >= chunks_of(state)) return;
    const int64_t index = next_of(state);
    // The job's fields are read only after a claim in its epoch succeeded.
    if (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) continue;
    const int64_t begin = index * chunk_;
    (*fn_)(begin, std::min(n_, begin + chunk_));
    state = state_.load(std::memory_order_acquire);
  }
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
  const uint32_t epoch = epoch_of(state_.load(std::memory_order_relaxed)) + 1;
  fn_ = &fn;
  n_ = n;
  chunk_ = ((units + parts - 1) / parts) * grain;
  const auto chunks = static_cast<uint64_t>((n + chunk_ - 1) / chunk_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.store((static_cast<uint64_t>(epoch) << 32) | (chunks << 16), std::memory_order_release);
  }
  cv_.notify_all();
  drain(epoch);
  // Every chunk is claimed; wait for workers still running theirs.
  for (int spins = 0; active_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096) SSD_CPU_RELAX();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    int spins = 0;
    while (epoch_of(state_.load(std::memory_order_acquire)) == seen) {
      SSD_CPU_RELAX();
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || epoch_of(state_.load(std::memory_order_acquire)) != seen; });
        if (stop_) return;
      }
    }
    active_.fetch_add(1, std::memory_order_acq_rel);
    seen = epoch_of(state_.load(std::memory_order_acquire));
    drain(seen);
    active_.fetch_sub(1, std::memory_order_acq_rel);
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
  }
}

}  // namespace ssd::kernels
