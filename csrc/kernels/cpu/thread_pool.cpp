#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#define SSD_CPU_RELAX() _mm_pause()
#else
#define SSD_CPU_RELAX() std::this_thread::yield()
#endif

namespace ssd::kernels {

namespace {
using Clock = std::chrono::steady_clock;

// Workers spin this long after a job before sleeping: decode issues thousands
// of small parallel regions per second and a futex wake costs tens of microseconds.
// Spinning is free only on a core nobody else wants, hence the checks below.
constexpr auto kSpinTime = std::chrono::microseconds(2000);
// A gap between two looks at the clock while spinning longer than this is a
// preemption (interrupts take microseconds, a scheduler time slice milliseconds).
constexpr auto kPreempted = std::chrono::microseconds(200);
// Chunks per thread: a worker that is descheduled, or starts late, holds at
// most this share of its part while the caller takes the rest.
constexpr int64_t kChunksPerThread = 4;
// A worker is late when the caller, done with its own chunks, waits longer
// than it worked itself and longer than this: a worker with a core of its own
// finishes its last chunk sooner, a descheduled one holds the caller for a
// scheduler time slice (milliseconds).
constexpr int64_t kLateFloorNs = 50'000;
// When a worker was late, or was descheduled while spinning, the cores are
// oversubscribed: the caller runs the next jobs alone (a solo spell; the
// workers sleep and leave their core to whoever took it). The first spell is
// kSoloMin jobs (about two decoded tokens of a small model); each spell in a
// row doubles, up to kSoloMax (about a second), so that a busy machine is
// probed rarely. kOnTime shared jobs in a row without a late worker end the backoff.
constexpr int64_t kSoloMin = 256;
constexpr int64_t kSoloMax = 256 * 64;
constexpr int64_t kOnTime = 4096;

// state_ = epoch (32 bits) | number of chunks (16) | next unclaimed chunk (16).
uint32_t epoch_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
int64_t chunks_of(uint64_t state) { return static_cast<int64_t>((state >> 16) & 0xffffu); }
int64_t next_of(uint64_t state) { return static_cast<int64_t>(state & 0xffffu); }

int64_t ns_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}
}  // namespace

ThreadPool::ThreadPool(int64_t num_threads) : num_threads_(std::max<int64_t>(1, num_threads)) {
  try {
    workers_.reserve(static_cast<size_t>(num_threads_ - 1));
    for (int64_t i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::exception& e) {
    // The destructor does not run for a constructor that throws, and a
    // joinable std::thread must not be destroyed: stop the started workers here.
    const auto started = workers_.size();
    stop_workers();
    throw std::runtime_error("thread pool: could not start " + std::to_string(num_threads_) + " threads (" +
                             std::to_string(started + 1) + " running when thread creation failed: " + e.what() +
                             "); use fewer threads");
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
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
  if (solo_left_ == 0 && crowded_.load(std::memory_order_relaxed) && crowded_.exchange(false)) back_off();
  if (solo_left_ > 0) {
    --solo_left_;
    fn(0, n);
    return;
  }
  const int64_t parts = std::min({num_threads_ * kChunksPerThread, units, int64_t{0xffff}});
  const uint32_t epoch = epoch_of(state_.load(std::memory_order_relaxed)) + 1;
  fn_ = &fn;
  n_ = n;
  chunk_ = ((units + parts - 1) / parts) * grain;
  const auto chunks = static_cast<uint64_t>((n + chunk_ - 1) / chunk_);
  const auto start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.store((static_cast<uint64_t>(epoch) << 32) | (chunks << 16), std::memory_order_release);
  }
  cv_.notify_all();
  drain(epoch);
  if (wait_workers(ns_since(start))) back_off();
  else if (++on_time_ >= kOnTime) solo_next_ = 0;
}

bool ThreadPool::wait_workers(int64_t own_ns) {
  // Every chunk is claimed; spin while a worker on its own core would still be
  // finishing its last one.
  const auto since = Clock::now();
  const int64_t patience = std::max(kLateFloorNs, own_ns);
  for (int spins = 0; active_.load(std::memory_order_acquire) != 0; ++spins) {
    SSD_CPU_RELAX();
    if (spins % 64 == 63 && ns_since(since) > patience) {
      // Late: the worker is descheduled. Sleep rather than spin, so that it can
      // run on this core; it notifies when the last chunk is done.
      std::unique_lock<std::mutex> lock(mu_);
      caller_waiting_ = true;
      done_cv_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
      caller_waiting_ = false;
      return true;
    }
  }
  return false;
}

void ThreadPool::back_off() {
  solo_next_ = std::clamp(2 * solo_next_, kSoloMin, kSoloMax);
  solo_left_ = solo_next_;
  on_time_ = 0;
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    auto checked = Clock::now();
    const auto spin_until = checked + kSpinTime;
    int spins = 0;
    while (epoch_of(state_.load(std::memory_order_acquire)) == seen) {
      SSD_CPU_RELAX();
      if (++spins % 64 != 0) continue;
      const auto now = Clock::now();
      // Descheduled while spinning: another thread wanted this core, maybe the
      // caller. Spinning on would take its time, so sleep and tell the caller.
      const bool preempted = now - checked > kPreempted;
      checked = now;
      if (preempted) crowded_.store(true, std::memory_order_relaxed);
      if (preempted || now > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || epoch_of(state_.load(std::memory_order_acquire)) != seen; });
        if (stop_) return;
      }
    }
    active_.fetch_add(1, std::memory_order_acq_rel);
    seen = epoch_of(state_.load(std::memory_order_acquire));
    drain(seen);
    std::lock_guard<std::mutex> lock(mu_);
    // Decremented under mu_ so that a caller about to sleep on done_cv_ cannot miss it.
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1 && caller_waiting_) done_cv_.notify_one();
    if (stop_) return;
  }
}

}  // namespace ssd::kernels
