// Request / response types of the embeddable engine API, and the engine's
// counters. Every counter struct lists its fields once, in fields(): its +=
// and the Python dicts (and the benchmark's counter deltas) iterate that list,
// so a new counter is declared and listed here and nowhere else.
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

/// Adds every listed field of `from` into `to`.
template <class T>
T& add_fields(T& to, const T& from) {
  T::fields([&](const char*, auto member) { to.*member += from.*member; });
  return to;
}

/// Counters of speculative rounds (sd, ssd), per request and engine-wide. In
/// ssd every round after a sequence's first verifies a speculation that came
/// from a cache lookup: a hit, or a miss answered by a fallback.
struct SpecCounters {
  int64_t rounds = 0;
  int64_t draft_tokens_proposed = 0;
  int64_t draft_tokens_accepted = 0;
  int64_t cache_lookups = 0;
  int64_t cache_hits = 0;
  int64_t fallback_neural = 0;       ///< misses answered by the neural fallback
  int64_t fallback_fast = 0;         ///< ... by the fast (n-gram) fallback
  int64_t hit_tokens = 0;            ///< tokens emitted by rounds verifying a cache hit
  int64_t miss_tokens = 0;           ///< ... verifying a fallback's speculation
  int64_t fast_tokens_proposed = 0;  ///< draft tokens proposed by the fast fallback
  int64_t fast_tokens_accepted = 0;

  template <class F>
  static void fields(F&& f) {
    f("rounds", &SpecCounters::rounds);
    f("draft_tokens_proposed", &SpecCounters::draft_tokens_proposed);
    f("draft_tokens_accepted", &SpecCounters::draft_tokens_accepted);
    f("cache_lookups", &SpecCounters::cache_lookups);
    f("cache_hits", &SpecCounters::cache_hits);
    f("fallback_neural", &SpecCounters::fallback_neural);
    f("fallback_fast", &SpecCounters::fallback_fast);
    f("hit_tokens", &SpecCounters::hit_tokens);
    f("miss_tokens", &SpecCounters::miss_tokens);
    f("fast_tokens_proposed", &SpecCounters::fast_tokens_proposed);
    f("fast_tokens_accepted", &SpecCounters::fast_tokens_accepted);
  }
  SpecCounters& operator+=(const SpecCounters& o) { return add_fields(*this, o); }
};

/// Per-request measurements; times in seconds since the request was enqueued.
struct RequestMetrics {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t num_preemptions = 0;
  double time_to_first_token = 0.0;
  double finish_time = 0.0;
  uint64_t seed = 0;  ///< the seed the request's random streams were keyed by
  SpecCounters spec;

  template <class F>
  static void fields(F&& f) {
    f("prompt_tokens", &RequestMetrics::prompt_tokens);
    f("generated_tokens", &RequestMetrics::generated_tokens);
    f("num_preemptions", &RequestMetrics::num_preemptions);
    f("time_to_first_token", &RequestMetrics::time_to_first_token);
    f("finish_time", &RequestMetrics::finish_time);
    f("seed", &RequestMetrics::seed);
  }
};

/// One emitted token's log-probability under the processed distribution it
/// was drawn from, and the most likely tokens there (probability desc, id
/// asc; at most SamplingParams::logprobs, none of probability 0).
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
};

/// A batch of new tokens for one request; the last response of a request has
/// finished set and a finish reason (and an error message for kError).
struct Response {
  RequestId id = 0;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  ///< one per token when the request asked for logprobs
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;
  RequestMetrics metrics;
};

/// The engine thread's counters and times (seconds, summed). verify: target
/// forwards that verify speculations; active: the engine thread busy with
/// work; target_wait: the target idle, waiting for the ssd draft worker.
struct StepCounters {
  int64_t steps = 0;
  int64_t forward_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t num_finished = 0;
  int64_t verify_steps = 0;
  double forward_seconds = 0.0;
  double verify_seconds = 0.0;
  double active_seconds = 0.0;
  double target_wait_seconds = 0.0;
  /// Bytes the target's rounds read from its device to the host (counts,
  /// tokens, asked-for log-probabilities; never logit rows).
  int64_t round_host_bytes = 0;

  template <class F>
  static void fields(F&& f) {
    f("steps", &StepCounters::steps);
    f("forward_tokens", &StepCounters::forward_tokens);
    f("generated_tokens", &StepCounters::generated_tokens);
    f("num_finished", &StepCounters::num_finished);
    f("verify_steps", &StepCounters::verify_steps);
    f("forward_seconds", &StepCounters::forward_seconds);
    f("verify_seconds", &StepCounters::verify_seconds);
    f("active_seconds", &StepCounters::active_seconds);
    f("target_wait_seconds", &StepCounters::target_wait_seconds);
    f("round_host_bytes", &StepCounters::round_host_bytes);
  }
  StepCounters& operator+=(const StepCounters& o) { return add_fields(*this, o); }
};

/// The ssd draft worker's counters and times (seconds, summed). Shadow
/// rounds: n-gram proposals made beside each neural fallback and scored
/// against the committed text (the tokens their rounds would have emitted).
struct DraftCounters {
  int64_t draft_rounds = 0;       ///< trees built (fork points + tree decode)
  int64_t tree_branches = 0;      ///< branches tree-decoded
  int64_t partial_trees = 0;      ///< trees that ran out of draft KV blocks
  int64_t branches_dropped = 0;   ///< planned branches those trees could not allocate
  int64_t kv_commits = 0;         ///< hits whose branch KV moved into the sequence
  int64_t fallback_batches = 0;
  int64_t fast_shadow_rounds = 0;
  int64_t fast_shadow_tokens = 0;
  double draft_round_seconds = 0.0;
  double fallback_seconds = 0.0;
  int64_t neural_fallback_batches = 0;   ///< fallback passes of the neural kind
  double neural_fallback_seconds = 0.0;  ///< ... and their time
  int64_t draft_forwards = 0;     ///< sd: draft forwards (one per drafted position of a batch)
  /// Bytes the draft's sampling read from its device to the host (sd: the
  /// drawn tokens; ssd: the logit rows its trees and fallbacks still rank
  /// on the host).
  int64_t draft_host_bytes = 0;

  template <class F>
  static void fields(F&& f) {
    f("draft_rounds", &DraftCounters::draft_rounds);
    f("draft_forwards", &DraftCounters::draft_forwards);
    f("draft_host_bytes", &DraftCounters::draft_host_bytes);
    f("neural_fallback_batches", &DraftCounters::neural_fallback_batches);
    f("neural_fallback_seconds", &DraftCounters::neural_fallback_seconds);
    f("tree_branches", &DraftCounters::tree_branches);
    f("partial_trees", &DraftCounters::partial_trees);
    f("branches_dropped", &DraftCounters::branches_dropped);
    f("kv_commits", &DraftCounters::kv_commits);
    f("fallback_batches", &DraftCounters::fallback_batches);
    f("fast_shadow_rounds", &DraftCounters::fast_shadow_rounds);
    f("fast_shadow_tokens", &DraftCounters::fast_shadow_tokens);
    f("draft_round_seconds", &DraftCounters::draft_round_seconds);
    f("fallback_seconds", &DraftCounters::fallback_seconds);
  }
  DraftCounters& operator+=(const DraftCounters& o) { return add_fields(*this, o); }
};

/// The ssd draft worker's current plan and estimates (values now, not sums).
struct DraftGauges {
  int64_t fanout_budget = 0;         ///< the current budget B
  std::vector<int64_t> fanout;       ///< the current F_0..F_K (confidence: the last tree's branches per fork point)
  double acceptance_estimate = 0.0;  ///< the planner's online a_p
  double miss_exponent = 0.0;        ///< the planner's online r
  /// The "auto" fallback's estimates of tokens per round verifying each kind's proposals.
  double fallback_neural_estimate = 0.0;
  double fallback_fast_estimate = 0.0;

  template <class F>
  static void fields(F&& f) {
    f("fanout_budget", &DraftGauges::fanout_budget);
    f("fanout", &DraftGauges::fanout);
    f("acceptance_estimate", &DraftGauges::acceptance_estimate);
    f("miss_exponent", &DraftGauges::miss_exponent);
    f("fallback_neural_estimate", &DraftGauges::fallback_neural_estimate);
    f("fallback_fast_estimate", &DraftGauges::fallback_fast_estimate);
  }
};

/// The engine's state now (values, not sums).
struct EngineGauges {
  int64_t peak_batch = 0;
  int64_t num_preemptions = 0;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  /// What a uniformly random one-hot proposal would be accepted with:
  /// E_x~U[p(x)] = 1 / vocab at any temperature (the fast fallback's baseline).
  double random_token_acceptance = 0.0;

  template <class F>
  static void fields(F&& f) {
    f("peak_batch", &EngineGauges::peak_batch);
    f("num_preemptions", &EngineGauges::num_preemptions);
    f("num_running", &EngineGauges::num_running);
    f("num_waiting", &EngineGauges::num_waiting);
    f("kv_blocks_total", &EngineGauges::kv_blocks_total);
    f("kv_blocks_free", &EngineGauges::kv_blocks_free);
    f("random_token_acceptance", &EngineGauges::random_token_acceptance);
  }
};

/// Engine-wide statistics: sums (steps, spec, draft) and values now (the gauges).
/// The adaptive policy's counters (summed over steps).
struct AdaptiveCounters {
  int64_t adaptive_steps = 0;        ///< steps the policy planned (speculative chunks present)
  int64_t adaptive_switches = 0;     ///< steps whose drafting kind differed from the step before
  int64_t adaptive_ar_steps = 0;     ///< planned steps that speculated for no sequence
  int64_t adaptive_tree_steps = 0;   ///< ssd: planned steps that let the draft build trees
  int64_t adaptive_probe_steps = 0;  ///< steps that speculated in full to re-measure, the plan staying autoregressive
  int64_t adaptive_rounds = 0;       ///< rounds given a lookahead
  int64_t adaptive_lookahead_sum = 0;  ///< their lookaheads, summed
  double adaptive_decision_seconds = 0.0;  ///< time spent planning

  template <class F>
  static void fields(F&& f) {
    f("adaptive_steps", &AdaptiveCounters::adaptive_steps);
    f("adaptive_switches", &AdaptiveCounters::adaptive_switches);
    f("adaptive_ar_steps", &AdaptiveCounters::adaptive_ar_steps);
    f("adaptive_tree_steps", &AdaptiveCounters::adaptive_tree_steps);
    f("adaptive_probe_steps", &AdaptiveCounters::adaptive_probe_steps);
    f("adaptive_rounds", &AdaptiveCounters::adaptive_rounds);
    f("adaptive_lookahead_sum", &AdaptiveCounters::adaptive_lookahead_sum);
    f("adaptive_decision_seconds", &AdaptiveCounters::adaptive_decision_seconds);
  }
  AdaptiveCounters& operator+=(const AdaptiveCounters& o) { return add_fields(*this, o); }
};

/// The adaptive policy's current plan and estimates (see ssd/speed_model.h).
struct PolicyGauges {
  std::string policy_drafting;        ///< "off" (fixed modes), "none", "sequential", "misses" or "trees"
  int64_t policy_batch = 0;           ///< sequences the last plan was made for
  double policy_threshold = 0.0;      ///< a proposal is verified when acceptance^depth >= this
  double policy_acceptance = 0.0;     ///< the batch's mean estimate that a round's first proposal is kept
  double policy_continuation = 0.0;   ///< ... that a proposal after a kept one is kept
  double policy_hit_rate = 0.0;       ///< ssd: the cache hit-rate estimate
  double policy_verify_seconds = 0.0; ///< the predicted time of the planned step
  double policy_forward_seconds = 0.0;   ///< the target forward estimate at one row per sequence
  double policy_tree_seconds = 0.0;      ///< ssd: a round's tree estimate at this batch
  double policy_fallback_seconds = 0.0;  ///< ssd: a batch of misses' drafting estimate (the kind trees are priced with)
  double policy_draft_seconds = 0.0;     ///< sd: one draft forward's estimate
  double policy_contention = 1.0;        ///< ssd: a target forward's slowdown while the draft builds trees beside it
  double policy_step_factor = 1.0;       ///< measured / modelled step seconds of the kind in force at this batch
  double policy_switch_seconds = 0.0;    ///< what switching to the best speculative kind costs at this batch (its first steps' excess)
  double policy_fast_acceptance = 0.0;   ///< ssd: the n-gram fallback's estimate that a first proposal is kept
  double policy_hit_acceptance = 0.0;    ///< ssd: the batch's mean estimate that a hit's first proposal is kept
  double policy_tok_s = 0.0;          ///< predicted tokens/s of the plan in force
  double policy_tok_s_ar = 0.0;       ///< ... of an autoregressive step
  double policy_tok_s_best = 0.0;     ///< ... of the best plan this step

  template <class F>
  static void fields(F&& f) {
    f("policy_drafting", &PolicyGauges::policy_drafting);
    f("policy_batch", &PolicyGauges::policy_batch);
    f("policy_threshold", &PolicyGauges::policy_threshold);
    f("policy_acceptance", &PolicyGauges::policy_acceptance);
    f("policy_continuation", &PolicyGauges::policy_continuation);
    f("policy_hit_rate", &PolicyGauges::policy_hit_rate);
    f("policy_verify_seconds", &PolicyGauges::policy_verify_seconds);
    f("policy_forward_seconds", &PolicyGauges::policy_forward_seconds);
    f("policy_tree_seconds", &PolicyGauges::policy_tree_seconds);
    f("policy_fallback_seconds", &PolicyGauges::policy_fallback_seconds);
    f("policy_switch_seconds", &PolicyGauges::policy_switch_seconds);
    f("policy_fast_acceptance", &PolicyGauges::policy_fast_acceptance);
    f("policy_hit_acceptance", &PolicyGauges::policy_hit_acceptance);
    f("policy_draft_seconds", &PolicyGauges::policy_draft_seconds);
    f("policy_contention", &PolicyGauges::policy_contention);
    f("policy_step_factor", &PolicyGauges::policy_step_factor);
    f("policy_tok_s", &PolicyGauges::policy_tok_s);
    f("policy_tok_s_ar", &PolicyGauges::policy_tok_s_ar);
    f("policy_tok_s_best", &PolicyGauges::policy_tok_s_best);
  }
};

struct EngineStats {
  StepCounters steps;
  SpecCounters spec;
  DraftCounters draft;
  AdaptiveCounters adaptive;
  EngineGauges engine;
  DraftGauges plan;
  PolicyGauges policy;
};

}  // namespace ssd
