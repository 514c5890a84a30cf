// A leveled logger for the decisions the engine makes on its own (fallback
// switches, partial speculation trees, fan-out budget changes, preemptions).
// Silent by default. Records go to a sink: by default a bounded queue that
// the owner drains (the Python layer forwards it to `logging` from its own
// thread, so no engine thread ever waits on the GIL); a C++ embedder may
// install any callable instead.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace ssd::log {

/// The numbers of Python's logging levels, so a level crosses unchanged.
enum class Level : int { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40, kOff = 100 };

struct Record {
  Level level = Level::kInfo;
  std::string message;
};

/// Records below `level` are dropped before they are formatted. Default kOff.
void set_level(Level level);
Level level();
inline bool enabled(Level l) { return static_cast<int>(l) >= static_cast<int>(level()); }

/// Replaces the sink (called on the logging thread, never under an engine
/// lock); nullptr restores the default queue.
using Sink = std::function<void(const Record&)>;
void set_sink(Sink sink);

/// Hands a record to the sink.
void write(Level level, std::string message);

/// The default queue's records, oldest first; the queue keeps the newest
/// kQueueCapacity and counts what it dropped.
std::vector<Record> drain();
int64_t dropped();
constexpr size_t kQueueCapacity = 4096;

}  // namespace ssd::log

/// SSD_LOG(ssd::log::Level::kInfo, "budget " << b): formats only when enabled.
#define SSD_LOG(level, stream_expr)                                   \
  do {                                                                \
    if (::ssd::log::enabled(level)) {                                 \
      std::ostringstream ssd_log_stream_;                             \
      ssd_log_stream_ << stream_expr;                                 \
      ::ssd::log::write((level), ssd_log_stream_.str());              \
    }                                                                 \
  } while (0)
#define SSD_LOG_DEBUG(stream_expr) SSD_LOG(::ssd::log::Level::kDebug, stream_expr)
#define SSD_LOG_INFO(stream_expr) SSD_LOG(::ssd::log::Level::kInfo, stream_expr)
#define SSD_LOG_WARNING(stream_expr) SSD_LOG(::ssd::log::Level::kWarning, stream_expr)
#define SSD_LOG_ERROR(stream_expr) SSD_LOG(::ssd::log::Level::kError, stream_expr)
