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
#include <map>
#include <vector>

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
  double round_host_bytes_per_step = 0.0;  ///< bytes the target's rounds read to the host / steps
};

// ---- One engine step over a batch (the adaptive policy) ----
//
// The round model above compares modes at a mean batch, in units of a
// verify. A step of the adaptive engine is planned in seconds instead, from
// measured costs, for the batch at hand: sequence i verifies V_i of its K
// proposals (0: an autoregressive step for it) and emits
// E_i = 1 + sum_{j=1..V_i} g_i(j) tokens in expectation, where the gain
// g_i(j) = f_i n_i^(j-1) is the chance that its j-th proposal is kept: f_i
// that the first is, n_i that a proposal is kept after a kept one.
// Acceptance comes in runs (an easy span is accepted whole), so n_i is
// usually above f_i, and a geometric model (f = n) would undervalue the
// deeper proposals. The step's time, R = sum_i (1 + V_i) rows:
// - kNone (no drafting):          t(R)
// - kSequential (sd):             t(R) + max_i V_i * d          (d: one draft forward)
// - kTrees (ssd):                 max(c t(R), T) + (1 - h^s) * F  (T: tree, F: fallback,
//                                 h: hit rate, s: sequences speculating, c: the
//                                 slowdown of a forward while the draft builds trees
//                                 beside it; with a tree sized to the verify, T = tau c t(R))
// - kMisses (ssd without trees):  t(R) + F when any sequence speculates
// The best V for a drafting kind verifies exactly the proposals whose gain
// g_i(j) clears a threshold (gains fall with j, so a threshold picks a prefix
// per sequence); plan_step() finds it by adding proposals in order of gain.

/// Seconds of a forward as a function of its size (rows or sequences),
/// learnt from measurements: a running mean per size bucket, linear between
/// measured sizes, flat below the smallest (fewer rows never cost less than
/// reading the weights) and proportional above the largest. A bucket's first
/// measurement is replaced by its second (the first use of a size pays
/// one-off costs: fresh pages, a budget still being sized).
class CostCurve {
 public:
  /// `context`: the mean tokens a row attended to (0: not known). A point
  /// measured at a context that differs from it by more than kStaleContext
  /// (see context_differs) is replaced rather than averaged.
  void observe(int64_t size, double seconds, double context = 0.0);
  /// 0 when nothing was measured.
  double seconds(int64_t size) const;
  /// A measurement within a factor of 1.5 of `size`; with a `context`, one
  /// measured at a context that does not differ from it.
  bool measured_near(int64_t size, double context = 0.0) const;
  bool empty() const { return points_.empty(); }

  /// Contexts differ when (a + kContextSlack) / (b + kContextSlack), larger
  /// over smaller, exceeds kStaleContext: a row's cost is its weights' (the
  /// slack, in tokens) plus its attention's, which grows with the context.
  static constexpr double kStaleContext = 1.5, kContextSlack = 64.0;
  static bool context_differs(double a, double b);

 private:
  struct Point {
    double seconds = 0.0;
    double context = 0.0;
    int64_t count = 0;
  };
  std::map<int64_t, Point> points_;  // by bucket
};

enum class Drafting { kNone, kSequential, kTrees, kMisses };
const char* drafting_name(Drafting d);

/// Measured costs of one step's parts, in seconds, at the batch planned for.
struct StepCosts {
  const CostCurve* forward = nullptr;  ///< the target forward by rows (required)
  double draft_step = 0.0;  ///< sd: one draft forward of the batch
  double tree = 0.0;        ///< ssd: one round's tree build (used when tree_per_verify is 0)
  double tree_per_verify = 0.0;  ///< ssd: tau, a tree sized to its verify: T = tau * the contended forward
  double contention = 1.0;  ///< ssd: c, a forward's slowdown while trees are built beside it
  double fallback = 0.0;    ///< ssd: one batch of misses re-drafted
  double hit_rate = 0.0;    ///< ssd: a sequence's outcome is in the cache
};

/// A sequence's acceptance estimates: its first proposal is kept with
/// probability `first`, a proposal after a kept one with `next` (each in [0, 1)).
struct Acceptance {
  double first = 0.0;
  double next = 0.0;
};

struct StepPlan {
  Drafting drafting = Drafting::kNone;
  /// Proposal j of a sequence is verified iff its gain first * next^(j-1) >= threshold
  /// (> 1: none is; 0: every one). plan_step() puts it between the gains it
  /// takes and those it leaves out.
  double threshold = 2.0;
  double tokens = 0.0;   ///< expected tokens of the batch
  double seconds = 0.0;  ///< expected step time
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0.0; }
};

/// The proposals verified under `threshold`: the largest V <= K whose gain first * next^(V-1) >= threshold.
int64_t lookahead_for(const Acceptance& acceptance, double threshold, int64_t K);
/// The best plan of drafting kind `d` for sequences of these acceptance
/// estimates, at most K proposals each; with `threshold`
/// >= 0, the plan at that threshold instead (0: every proposal). Throws
/// std::invalid_argument without a measured forward curve or on bad input.
StepPlan plan_step(Drafting d, const std::vector<Acceptance>& acceptance, int64_t K, const StepCosts& costs,
                   double threshold = -1.0);
/// The modelled seconds of a step of kind `d` whose sequences verify these lookaheads.
double step_seconds(Drafting d, const std::vector<int64_t>& lookaheads, const StepCosts& costs);

/// Speed model of a whole run (engine-wide counters and times).
SpeedMetrics speed_metrics(const EngineStats& stats);
/// Counting metrics of one request (its times are engine-wide, so no T_p/T_b).
SpeedMetrics speed_metrics(const RequestMetrics& metrics);

}  // namespace ssd
