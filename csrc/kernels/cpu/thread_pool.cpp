#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__linux__)
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>
#endif

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
// than it worked itself and longer than this; the caller then sleeps instead
// of spinning, so that a descheduled worker can have its core.
constexpr int64_t kLateFloorNs = 50'000;
// Whether to share jobs is decided from the machine's run queue. Every
// kSampleEvery jobs the caller reads how many threads are runnable right now
// (/proc/loadavg's fourth field, Linux), less this pool's own awake threads:
// the threads of others (another process, or the engine's other threads) that
// want a CPU. Their moving average (weight 1/kSampleWeight per sample) is set
// against the CPUs this process may use: while others and the pool together
// want more CPUs than there are, a shared job waits on a descheduled thread,
// so the caller runs whole jobs alone (the workers sleep and leave their
// cores to whoever took them), which is what one thread gets. Shares again
// once the others fit. Timings cannot decide this: a chunk's own duration is
// inflated by the same preemptions it would have to detect.
constexpr int64_t kSampleEvery = 64;
constexpr double kSampleWeight = 8.0;
// Hysteresis around "others fit", in threads: stop sharing above +0.5,
// share again below +0.25, so that a thread waking for a moment does not flap it.
constexpr double kCrowdedAbove = 0.5;
constexpr double kRoomyBelow = 0.25;

// state_ = epoch (32 bits) | number of chunks (16) | next unclaimed chunk (16).
uint32_t epoch_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
int64_t chunks_of(uint64_t state) { return static_cast<int64_t>((state >> 16) & 0xffffu); }
int64_t next_of(uint64_t state) { return static_cast<int64_t>(state & 0xffffu); }

// CPUs this process may run on.
int64_t usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

int64_t ns_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}
}  // namespace

int64_t loadavg_runnable(const char* text) {
  const char* p = text;
  for (int field = 0; field < 3; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return -1;
    ++p;
  }
  char* end = nullptr;
  const long runnable = std::strtol(p, &end, 10);
  return end == p || *end != '/' || runnable < 0 ? -1 : runnable;
}

ThreadPool::ThreadPool(int64_t num_threads, LoadProbe probe)
    : num_threads_(std::max<int64_t>(1, num_threads)), cpus_(usable_cpus()), probe_(std::move(probe)) {
#if defined(__linux__)
  if (num_threads_ > 1 && !probe_) loadavg_fd_ = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
#endif
  try {
    workers_.reserve(static_cast<size_t>(num_threads_ - 1));
    for (int64_t i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::exception& e) {
    // The destructor does not run for a constructor that throws, and a
    // joinable std::thread must not be destroyed: stop the started workers here.
    const auto started = workers_.size();
    stop_workers();
    close_loadavg();
    throw std::runtime_error("thread pool: could not start " + std::to_string(num_threads_) + " threads (" +
                             std::to_string(started + 1) + " running when thread creation failed: " + e.what() +
                             "); use fewer threads");
  }
}

ThreadPool::~ThreadPool() {
  stop_workers();
  close_loadavg();
}

void ThreadPool::close_loadavg() {
#if defined(__linux__)
  if (loadavg_fd_ >= 0) close(loadavg_fd_);
#endif
  loadavg_fd_ = -1;
}

int64_t ThreadPool::others_from_loadavg(int64_t own_awake) const {
#if defined(__linux__)
  if (loadavg_fd_ < 0) return -1;
  char buf[128];
  const ssize_t len = pread(loadavg_fd_, buf, sizeof(buf) - 1, 0);
  if (len <= 0) return -1;
  buf[len] = '\0';
  const int64_t runnable = loadavg_runnable(buf);
  return runnable < 0 ? -1 : std::max<int64_t>(0, runnable - own_awake);
#else
  (void)own_awake;
  return -1;
#endif
}

void ThreadPool::sample_load() {
  const int64_t awake = num_threads_ - sleeping_.load(std::memory_order_relaxed);
  const int64_t others = probe_ ? probe_(awake) : others_from_loadavg(awake);
  if (others < 0) return;  // unknown: keep sharing
  others_ += (static_cast<double>(others) - others_) / kSampleWeight;
  const double room = static_cast<double>(cpus_ - num_threads_);  // CPUs left for others while sharing
  if (share_ && others_ > room + kCrowdedAbove) share_ = false;
  else if (!share_ && others_ < room + kRoomyBelow) share_ = true;
}

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
  while (epoch_of(state) == epoch && next_of(state) < chunks_of(state)) {
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
  if (++since_sample_ >= kSampleEvery) {
    since_sample_ = 0;
    sample_load();
  }
  if (!share_) {
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
  wait_workers(ns_since(start));
}

void ThreadPool::wait_workers(int64_t own_ns) {
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
      return;
    }
  }
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
      // caller. Spinning on would take its time, so sleep.
      const bool preempted = now - checked > kPreempted;
      checked = now;
      if (preempted || now > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        sleeping_.fetch_add(1, std::memory_order_relaxed);
        cv_.wait(lock, [&] { return stop_ || epoch_of(state_.load(std::memory_order_acquire)) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
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
