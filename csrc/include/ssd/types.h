// Request / response types of the embeddable engine API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ssd/config.h"

namespace ssd {

using RequestId = uint64_t;

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

const char* finish_reason_name(FinishReason reason);

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

/// Per-request measurements; times in seconds since the request was enqueued.
struct RequestMetrics {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t num_preemptions = 0;
  double time_to_first_token = 0.0;
  double finish_time = 0.0;
  uint64_t seed = 0;  ///< the seed the request's random streams were keyed by
  int64_t rounds = 0;  ///< speculative rounds (sd)
  int64_t draft_tokens_proposed = 0;
  int64_t draft_tokens_accepted = 0;
};

/// A batch of new tokens for one request; the last response of a request has
/// finished set and a finish reason (and an error message for kError).
struct Response {
  RequestId id = 0;
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;
  RequestMetrics metrics;
};

/// Engine-wide counters.
struct EngineStats {
  int64_t steps = 0;
  int64_t forward_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t peak_batch = 0;
  int64_t num_preemptions = 0;
  int64_t num_finished = 0;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  double forward_seconds = 0.0;
  int64_t rounds = 0;
  int64_t draft_tokens_proposed = 0;
  int64_t draft_tokens_accepted = 0;
};

}  // namespace ssd
