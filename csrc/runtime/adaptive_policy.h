// The adaptive engine's decision (EngineConfig::adaptive): once per step,
// before the target's forward, it plans the next round of every decoding
// sequence from the speed model of one step (ssd/speed_model.h,
// plan_step()): which drafting kind (none, sd's sequential drafting, ssd's
// trees, ssd without trees) and how many proposals each sequence verifies,
// maximising the batch's expected tokens per second. Its inputs are only
// what is known before a verify forward: measured forward, draft, tree and
// fallback times, and acceptance and hit-rate estimates from earlier rounds.
// It never reads the target's logits of the round being verified, so the
// output law (and temperature-0 output) is that of any fixed lookahead.
//
// Until kWarmupTrials proposals were verified every round verifies k (with
// the best speculative kind); a batch size whose forward was never timed gets
// one autoregressive step first.
//
// A round's lookahead is decided when the round before it is verified (or
// when the sequence's prefill is done), so the ssd draft worker hears it
// with the outcome and builds that round's tree for the outcomes that can
// happen. While no sequence speculates, nothing updates the acceptance
// estimates, so after 64 such steps (then 128, ... 512) one step speculates in
// full (a probe) and the plan is made again. Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler.h"
#include "speculator.h"
#include "ssd/config.h"
#include "ssd/speed_model.h"
#include "ssd/types.h"

namespace ssd::runtime {

class AdaptivePolicy {
 public:
  AdaptivePolicy(const EngineConfig& config, const TestingConfig& testing);

  /// Once per step with speculative chunks, before the forward: plans the
  /// rounds this step's outcomes open, for the `decoding` sequences.
  /// draft_totals: the draft side's counters so far (their growth gives the
  /// draft costs).
  void plan(const std::vector<Sequence*>& decoding, const DraftCounters& draft_totals);
  /// A target forward over `rows` rows took `seconds`.
  void observe_forward(int64_t rows, double seconds) { forward_.observe(rows, seconds); }
  /// Sets the lookahead (and trees) of the sequence's first round.
  void first_round(Sequence* seq);
  /// A round of `seq` verified `proposed` proposals and kept `accepted`;
  /// sets its next round's lookahead (and trees).
  void after_round(Sequence* seq, int64_t proposed, int64_t accepted, CacheLookup lookup);

  void stats(EngineStats& s) const;

  /// Most proposals a sequence's acceptance estimate is trusted with (< 1: plan_step's domain).
  static constexpr double kMaxAcceptance = 0.98;
  /// A new drafting kind must predict this much more than the one in force.
  static constexpr double kHysteresis = 0.05;
  /// Steps a drafting kind stays in force before another may replace it.
  static constexpr int64_t kDwellSteps = 8;

 private:
  double acceptance_of(const Sequence* seq) const;
  void assign(Sequence* seq);
  void learn_draft_costs(const DraftCounters& totals);
  StepCosts costs_at(int64_t batch, int64_t rows, Drafting kind) const;

  const EngineConfig& config_;
  bool enabled_;
  std::vector<int64_t> forced_;  // TestingConfig::forced_lookahead
  std::vector<Drafting> kinds_;  // the kinds this mode can run
  CostCurve forward_;            // target forward by rows
  CostCurve draft_step_, tree_, fallback_, neural_fallback_;  // draft side, by sequences
  DraftCounters seen_;           // draft totals at the last plan
  int64_t last_batch_ = 0;
  double kept_ = 0.0, tried_ = 0.0;  // all sequences (decayed)
  double hits_ = 0.0, lookups_ = 0.0;
  StepPlan in_force_;             // what this step's outcomes open (a probe's plan, for one step)
  Drafting kind_ = Drafting::kNone;  // the drafting kind in force
  int64_t since_speculation_ = 0;    // autoregressive steps since one speculated
  int64_t probe_every_ = 64;
  bool planned_ = false;
  bool explored_ = false;  // the last plan was an exploring autoregressive step
  int64_t since_switch_ = 0;
  int64_t step_ = 0;
  AdaptiveCounters counters_;
  PolicyGauges gauges_;
};

}  // namespace ssd::runtime
