#include "ssd/log.h"

#include <atomic>
#include <deque>
#include <mutex>

namespace ssd::log {

namespace {

// Process-wide by nature, like any logging system: one level, one sink.
std::atomic<int> g_level{static_cast<int>(Level::kOff)};

struct State {
  std::mutex mu;
  Sink sink;
  std::deque<Record> queue;
  int64_t dropped = 0;
};

State& state() {
  static State s;
  return s;
}

}  // namespace

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

void set_sink(Sink sink) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.sink = std::move(sink);
}

void write(Level l, std::string message) {
  State& s = state();
  Sink sink;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.sink) {
      if (s.queue.size() >= kQueueCapacity) {
        s.queue.pop_front();
        ++s.dropped;
      }
      s.queue.push_back({l, std::move(message)});
      return;
    }
    sink = s.sink;
  }
  sink({l, std::move(message)});  // outside the lock: a sink may log or block
}

std::vector<Record> drain() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<Record> out(std::make_move_iterator(s.queue.begin()), std::make_move_iterator(s.queue.end()));
  s.queue.clear();
  return out;
}

int64_t dropped() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.dropped;
}

}  // namespace ssd::log
