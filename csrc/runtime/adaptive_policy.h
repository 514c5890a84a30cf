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
// What it measures, and how the step model is kept honest:
// - the target forward by rows, from forwards the draft side did not work
//   beside; a forward beside tree building is slower by a learnt factor
//   (contention), and a tree takes a learnt share of the forward it runs
//   beside (the auto fan-out budget sizes trees to the verify);
// - each step's modelled seconds (for the lookaheads its rounds verify)
//   against its measured seconds, per drafting kind and batch size: the
//   ratio scales that kind's predictions (waits for the draft side, engine
//   overhead and whatever else the model leaves out), learnt again once the
//   context moved far from the one it was learnt at; a kind not measured
//   at a batch is priced at least as autoregressive steps and the other
//   speculative kinds measured there are;
// - what a switch to a speculative kind costs: its first kSwitchSteps
//   steps' seconds beyond the model (the draft catching up on the
//   sequences it idled for). A switch must win that back within
//   kSwitchHorizon steps;
// - a tree's misses by fallback kind: a trees plan is priced with the kind
//   that makes it faster (the worker's `auto` fallback picks its kind with
//   the same speed model, and measures the one it tries), and a tree's
//   step is compared with the model for the kind that served its misses
//   (the step factor absorbs no change of kind);
// - acceptance by source: per sequence the draft model's proposals; over
//   all sequences the model drafting a round, the model's tree on a hit
//   (kept more often), and the n-gram fallback. A tree's round proposes a
//   hit's, or on a miss the fallback's or the model's as the worker served
//   misses;
// - the forward by rows at the context it was timed at (timed again, for
//   one step, when the context moved far and autoregressive steps look
//   best, and before a speculative kind is left for them);
// - the draft model's runs by the rounds they drafted: drafting without
//   trees drafts every sequence's round, a tree's misses only a few.
//
// Before it plans freely at a batch size: one autoregressive step times the
// forward of one row per sequence (and what such a step costs beyond it;
// again when the context moved far from it and autoregressive steps look
// best), in ssd one step without trees times a
// full verify's forward (so the cost of every lookahead in between is
// interpolated between two uncontended measurements); not for a batch that
// shrank below a timed one while a speculative kind is in force (a draining
// tail, priced from the larger batch's forwards) until it has stayed
// smaller for kDwellSteps, and until
// kWarmupTrials proposals were verified every round verifies k with the best
// speculative kind.
//
// A round's lookahead is decided when the round before it is verified (or
// when the sequence's prefill is done), so the ssd draft worker hears it
// with the outcome and builds that round's tree for the outcomes that can
// happen. While no sequence speculates, nothing updates the acceptance
// estimates, so after 64 such steps (then 128, ... 512) one sequence
// speculates in full for a step (a probe) and the plan is made again.
// Engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
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
  /// The step's target forward over `rows` rows took `seconds`, while the
  /// draft side worked for `draft_busy` of them.
  void observe_forward(int64_t rows, double seconds, double draft_busy = 0.0);
  /// The step took `seconds` from schedule to postprocess; `decode_only`:
  /// every chunk was a decoding sequence's round (no prefill in it).
  void observe_step(double seconds, bool decode_only);
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
  /// Steps a drafting kind stays in force before another may replace it ...
  static constexpr int64_t kDwellSteps = 8;
  /// ... unless it is speculative, had this many steps compared with the
  /// model since it came into force, and is now predicted slower than
  /// autoregressive steps: it is left for them at once. Entering a kind
  /// waits out the dwell, falling back to the baseline does not.
  static constexpr int64_t kLeaveSteps = 2;
  /// A switch to a speculative kind must win back what its first steps cost
  /// (the draft catching up on the sequences it idled for) within this many steps.
  static constexpr int64_t kSwitchHorizon = 16;
  /// The first steps of a kind, after a switch: they pay for it and are not compared with the model.
  static constexpr int64_t kSwitchSteps = 2;

 private:
  /// A ratio learnt from measurements: a decayed mean pulled towards a prior
  /// (the same prior for observe() and value()). With a context (mean KV
  /// length, > 0), measurements at a context that differs from the one the
  /// mean was learnt at (CostCurve::context_differs) replace it.
  struct Ratio {
    double sum = 0.0, weight = 0.0, context = 0.0;
    void observe(double x, double prior, double at_context = 0.0);
    double value(double prior) const;
  };
  /// The plans of one step, one per drafting kind the mode has.
  struct Options {
    StepPlan best, current, none, speculative, misses;
    CacheLookup trees_miss = CacheLookup::kNone;  // the fallback kind the trees plan was priced with
  };
  /// The rounds a step verifies (their lookaheads are known when it starts),
  /// modelled when the step ends: after its own forward was timed, so a step
  /// whose forward size was never timed before is compared with that forward.
  struct Expected {
    Drafting drafting = Drafting::kNone;
    std::vector<int64_t> lookaheads;  // empty: nothing to compare
    int64_t batch = 0;
    int64_t switching = 0;  // 1..kSwitchSteps: a switch's first steps (their excess is its cost); 0: not
    double context = 0.0;   // mean KV length of its sequences
    // trees: how a round it verified that missed the cache was served (kNone:
    // every round hit; known after its rounds, kNeuralFallback if any was),
    // and the fallback kind the plan of its rounds was priced with
    CacheLookup missed = CacheLookup::kNone, priced = CacheLookup::kNone;
  };

  struct Tally {
    double kept = 0.0, tried = 0.0, kept_next = 0.0, tried_next = 0.0;
    void add(double first, double kept_next_add, double tried_next_add, double decay);
    double trials() const { return tried + tried_next; }
    /// The estimates, pulled towards `prior` with kPriorWeight proposals.
    Acceptance pulled(const Acceptance& prior) const;
  };
  /// The sequence's estimates for the draft model's proposals, pulled towards `global`'s
  /// (global.pulled(prior)).
  Acceptance acceptance_of(const Sequence* seq, const Tally& global, const Acceptance& prior) const;
  /// ... drafting a round.
  Acceptance acceptance_of(const Sequence* seq) const;
  /// ... in a round whose tree hit.
  Acceptance hit_acceptance(const Sequence* seq) const;
  /// The cache hit-rate estimate (decayed, with its prior).
  double hit_rate() const;
  /// The n-gram fallback's (over all sequences).
  Acceptance fast_acceptance() const;
  /// What a round of `kind` proposes: the draft model's, or in a tree's
  /// round a hit's (the draft model's on a hit) or a miss's: as `miss`
  /// serves it (kFastFallback: the n-gram fallback's, kNeuralFallback: the
  /// draft model's; kNone: each as often as it served misses).
  Acceptance acceptance_of(const Sequence* seq, Drafting kind, CacheLookup miss = CacheLookup::kNone) const;
  void assign(Sequence* seq);
  void learn_draft_costs(const DraftCounters& totals);
  /// The step's costs; a tree's misses as `miss` serves them (kNone: a run of either kind).
  StepCosts costs_at(int64_t batch, int64_t rows, Drafting kind, CacheLookup miss = CacheLookup::kNone) const;
  /// Measured / modelled step seconds of `kind` at batch b (1 until measured).
  double step_factor(Drafting kind, int64_t batch) const;
  /// What step_factor() is pulled towards: the kind's factor over every
  /// batch, for a speculative kind at least autoregressive steps' factor at b.
  double step_prior(Drafting kind, int64_t batch) const;
  void expect_step(const std::vector<Sequence*>& decoding);
  /// Seconds a switch to `kind` costs at batch b beyond its steps' model (measured, else a prior).
  double switch_seconds(Drafting kind, int64_t batch) const;
  Options evaluate(const std::vector<Sequence*>& decoding, int64_t batch) const;
  StepPlan choose(const Options& o, int64_t batch, const std::vector<Acceptance>& acceptance);
  /// Switching from `from` to `to` wins back its cost within kSwitchHorizon steps.
  bool pays_back(const StepPlan& to, const StepPlan& from, int64_t batch) const;
  void update_gauges(const std::vector<Sequence*>& decoding, const Options& o, const StepPlan& chosen,
                     const std::vector<Acceptance>& acceptance, int64_t batch);

  const EngineConfig& config_;
  bool enabled_;
  std::vector<int64_t> forced_;  // TestingConfig::forced_lookahead
  std::vector<Drafting> kinds_;  // the kinds this mode can run
  // Target forwards by rows while the draft side builds no tree. A forward
  // beside tree building is slower (on a CPU the two share memory
  // bandwidth): contention_ is by how much, tree_per_verify_ how long a tree
  // takes against the forward it ran beside.
  CostCurve forward_;
  Ratio contention_, tree_per_verify_;
  bool overlapped_ = false;               // this step's forward runs beside tree building
  double last_overlapped_forward_ = 0.0;  // seconds of the last such forward
  // Draft side, by batch: a fallback run of either kind, and of each kind.
  CostCurve draft_step_, tree_, fallback_, neural_fallback_, fast_fallback_;
  // The draft model's runs (a tree's misses, rounds without trees) by the
  // rounds they drafted: what drafting without trees costs, where every
  // sequence's round is drafted. neural_rounds_: rounds the draft model
  // drafted, verified since the last plan.
  CostCurve neural_runs_;
  double neural_rounds_ = 0.0;
  CacheLookup trees_miss_ = CacheLookup::kNone;  // the kind the trees plan in force was priced with
  DraftCounters seen_;  // draft totals at the last plan
  // Measured / modelled step seconds by drafting kind: over every batch, and
  // by batch. What the model leaves out (waits for the draft side, whose
  // share moves with the context) is learnt again at a new context.
  Ratio step_all_[4];
  std::map<int64_t, Ratio> step_by_batch_[4];
  Expected expected_;                       // of the step under way
  // Switch costs by drafting kind and batch; the excess of the switch under way so far.
  std::map<int64_t, Ratio> switch_by_batch_[4];
  double switch_excess_ = 0.0;
  bool probed_ = false;                     // the last plan was a probe
  bool started_ = false;                    // a sequence's first round was assigned since the last plan
  int64_t timing_rows_ = 0;                 // a forward the last plan asked for, to time it
  int64_t timed_batch_ = 0;                 // the largest batch planned at whose forward was timed
  int64_t shrank_at_ = -kDwellSteps;        // the plan (step_) at which the batch last shrank
  int64_t last_batch_ = 0;
  double context_ = 0.0;                    // mean KV length of the step's decoding sequences
  bool retiming_ = false;                   // this plan times the forward again (one autoregressive step)
  bool holding_ = false;                    // the last plan did: this one switches nothing
  // Proposals kept over all sequences (decayed), as Sequence's, by source:
  // the draft model drafting a round (no tree, or a miss it re-drafted), the
  // draft model's tree on a hit (a hit follows text the draft foresaw, and
  // is kept longer), the n-gram fallback.
  Tally model_, hit_, fast_;
  double hits_ = 0.0, lookups_ = 0.0;
  double fast_misses_ = 0.0, misses_ = 0.0;  // misses served by the n-gram fallback / all misses (decayed)
  StepPlan in_force_;                // what this step's outcomes open (a probe's plan, for its steps)
  int64_t probe_rounds_ = 0;         // rounds of a probe still to assign (a probe speculates for one sequence)
  int64_t probe_steps_left_ = 0;     // steps the probe under way goes on for (a probe of trees: one more)
  StepPlan probe_plan_;              // the plan of the probe under way
  std::optional<RequestId> probe_seq_;  // the sequence the probe under way speculates for (none: the first assigned)
  Drafting kind_ = Drafting::kNone;  // the drafting kind in force
  int64_t since_speculation_ = 0;    // autoregressive steps since one speculated
  int64_t probe_every_ = 64;
  bool planned_ = false;
  bool explored_ = false;  // the last plan was a timing or warming step
  bool warming_ = false;   // ... a warming step
  int64_t since_switch_ = 0;
  int64_t measured_since_switch_ = 0;  // steps of the kind in force compared with the model since it came in
  int64_t step_ = 0;
  AdaptiveCounters counters_;
  PolicyGauges gauges_;
};

}  // namespace ssd::runtime
