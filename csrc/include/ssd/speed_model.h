// The speed model of speculative decoding, stated once. The engine's
// `predicted_speedup`, the ssd draft worker's "auto" fallback and
// `python -m ssd.bench` all evaluate predict_round(); nothing else models a
// round's cost.
//
// Units. Times are relative to one verify forward of the round: the target's
// forward over b sequences x (K + 1) rows. `verify_cost` is that forward's
// cost in autoregressive steps of the same b sequences (one row each): the
// verify's cost as a function of its rows. It is 1 when a verify costs as
// much as a decode step (the engine's stats assume that; the benchmark
// measures it).
//
// What a round costs, as the engine runs it:
// - ssd (overlapped): the target verifies (1) while the draft worker builds
//   the next trees (T_p). If every sequence's outcome is in the cache, the
//   next round starts when both are done: max(1, T_p). If any sequence
//   misses, its outcome waits for the tree under way (the worker is one
//   thread and does not abandon a tree), then for the fallback's drafting:
//   max(1, T_p) + T_b. With b sequences a round is all-hit with p^b.
// - sd (sequential): the draft drafts K tokens (T_p), then the target
//   verifies: 1 + T_p, every round.
// - ar: one step, 1 token per sequence, costing one AR step.
// A sequence emits E_hit tokens in a round that hit and E_miss in one that
// missed; the speedup over ar is tokens per sequence per AR-step of time.
#pragma once

#include <cstdint>

#include "ssd/types.h"

namespace ssd {

struct RoundModel {
  double p_hit = 1.0;   ///< a sequence's outcome is in the speculation cache
  double e_hit = 0.0;   ///< tokens a sequence emits in a round that hit
  double e_miss = 0.0;  ///< ... in a round that missed
  double t_p = 0.0;     ///< draft work of a round / verify (ssd: fork forward + tree; sd: K steps)
  double t_b = 0.0;     ///< ssd: fallback drafting after a miss / verify
  int64_t batch = 1;    ///< sequences verified together
  double verify_cost = 1.0;  ///< verify forward / AR step over the same sequences
  bool overlapped = true;    ///< ssd: drafting overlaps the verify; sd: it precedes it
};

struct RoundPrediction {
  double p_all_hit = 0.0;  ///< p^b (1 for sd)
  double tokens = 0.0;     ///< expected tokens per sequence per round
  double time = 0.0;       ///< expected round time, in verify forwards
  double speedup = 0.0;    ///< tokens / (time * verify_cost); 0 without data
};

/// The one round-cost model (see the header comment). Throws
/// std::invalid_argument on a probability outside [0, 1], a negative time
/// or cost, or a batch < 1.
RoundPrediction predict_round(const RoundModel& m);

/// The speed model's quantities over counters, defined once for the engine
/// and per request. Times are relative to one verify forward.
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
  double mean_batch = 0.0;         ///< sequences per verify forward
  /// predict_round() at these quantities and the mean batch (verify_cost 1,
  /// so in units of one verify forward); 0 without cache lookups.
  double predicted_speedup = 0.0;
  double target_busy_fraction = 0.0;  ///< target forward time / active time
};

/// Speed model of a whole run (engine-wide counters and times).
SpeedMetrics speed_metrics(const EngineStats& stats);
/// Counting metrics of one request (its times are engine-wide, so no T_p/T_b).
SpeedMetrics speed_metrics(const RequestMetrics& metrics);

}  // namespace ssd
