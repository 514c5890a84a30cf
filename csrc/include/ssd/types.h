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
  int64_t rounds = 0;  ///< speculative rounds (sd, ssd)
  int64_t draft_tokens_proposed = 0;
  int64_t draft_tokens_accepted = 0;
  // ssd: every round after a sequence's first verifies a speculation that
  // came from a cache lookup: a hit, or a miss answered by a fallback.
  int64_t cache_lookups = 0;
  int64_t cache_hits = 0;
  int64_t fallback_neural = 0;
  int64_t fallback_fast = 0;
  int64_t hit_tokens = 0;   ///< tokens emitted by rounds verifying a cache hit
  int64_t miss_tokens = 0;  ///< ... verifying a fallback's speculation
  int64_t fast_tokens_proposed = 0;  ///< draft tokens proposed by the fast (n-gram) fallback
  int64_t fast_tokens_accepted = 0;
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
  // ssd counters (see RequestMetrics).
  int64_t cache_lookups = 0;
  int64_t cache_hits = 0;
  int64_t fallback_neural = 0;
  int64_t fallback_fast = 0;
  int64_t hit_tokens = 0;
  int64_t miss_tokens = 0;
  int64_t fast_tokens_proposed = 0;
  int64_t fast_tokens_accepted = 0;
  /// What a uniformly random one-hot proposal would be accepted with:
  /// E_x~U[p(x)] = 1 / vocab at any temperature (the fast fallback's baseline).
  double random_token_acceptance = 0.0;
  int64_t kv_commits = 0;       ///< hits whose branch KV was moved into the sequence
  int64_t tree_branches = 0;    ///< branches tree-decoded, all rounds
  int64_t fanout_budget = 0;    ///< the current budget B
  std::vector<int64_t> fanout;  ///< the current F_0..F_K
  double acceptance_estimate = 0.0;  ///< the planner's online a_p
  double miss_exponent = 0.0;        ///< the planner's online r
  // Times (seconds, summed). verify: target forwards that verify speculations.
  int64_t verify_steps = 0;
  double verify_seconds = 0.0;
  double active_seconds = 0.0;       ///< engine thread busy with work (not idle)
  double target_wait_seconds = 0.0;  ///< target idle, waiting for the draft worker
  int64_t draft_rounds = 0;
  double draft_round_seconds = 0.0;  ///< draft worker: fork points + tree decode
  int64_t fallback_batches = 0;
  double fallback_seconds = 0.0;
  // The "auto" fallback's estimates of tokens per round verifying each kind's
  // proposals. Shadow rounds: n-gram proposals made beside each neural
  // fallback and scored against the committed text (the tokens their rounds
  // would have emitted, summed in fast_shadow_tokens; see DraftWorker).
  double fallback_neural_estimate = 0.0;
  double fallback_fast_estimate = 0.0;
  int64_t fast_shadow_rounds = 0;
  int64_t fast_shadow_tokens = 0;
};

/// The speed model's quantities, defined once for the engine and per request.
/// Times are relative to one verify forward.
struct SpeedMetrics {
  double acceptance_rate = 0.0;    ///< accepted / proposed draft tokens
  double mean_accepted_len = 0.0;  ///< accepted draft tokens per round
  double tokens_per_round = 0.0;
  double cache_hit_rate = 0.0;     ///< rounds whose outcome was in the cache / lookups
  double fast_acceptance_rate = 0.0;  ///< acceptance of the fast fallback's proposals
  double e_hit = 0.0;              ///< tokens per round on hits
  double e_miss = 0.0;             ///< tokens per round on misses
  double t_p = 0.0;                ///< draft round time / verify time
  double t_b = 0.0;                ///< fallback time / verify time
  /// (p E_hit + (1-p) E_miss) / (p max(1, T_p) + (1-p)(1 + T_b)); 0 without data.
  double predicted_speedup = 0.0;
  double target_busy_fraction = 0.0;  ///< target forward time / active time
};

/// Speed model of a whole run (engine-wide counters and times).
SpeedMetrics speed_metrics(const EngineStats& stats);
/// Counting metrics of one request (its times are engine-wide, so no T_p/T_b).
SpeedMetrics speed_metrics(const RequestMetrics& metrics);
/// The speed model's prediction of the speedup over autoregressive decoding.
double predicted_speedup(double p_hit, double e_hit, double e_miss, double t_p, double t_b);

}  // namespace ssd
