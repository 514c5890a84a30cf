// The adaptive policy's plans: per step, the kind of drafting and each
// sequence's lookahead, from the estimates of adaptive_estimates.cpp.
#include "adaptive_policy.h"

#include <algorithm>
#include <chrono>

#include "ssd/log.h"

namespace ssd::runtime {

namespace {

// Autoregressive steps between probes (one sequence speculating in full for
// a step, two for trees, re-measuring acceptance), doubling after each probe
// that confirms them. Not sooner: with the first after 16, probes at batch
// 8-16 measured hits that priced trees above autoregressive steps, and the
// policy switched to them for 4-13 of 33 steps (0.91-0.93x ar at batch 16).
constexpr int64_t kProbeFirst = 64, kProbeMax = 512;
// Verified proposals (decayed) before the policy may stop speculating: until
// then every round verifies k proposals with the best speculative kind, so
// the first rounds' luck does not decide.
constexpr double kWarmupTrials = 16.0;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

AdaptivePolicy::AdaptivePolicy(const EngineConfig& config, const TestingConfig& testing)
    : config_(config), enabled_(config.adaptive && config.mode != "ar"), forced_(testing.forced_lookahead) {
  if (config.mode == "sd") kinds_ = {Drafting::kNone, Drafting::kSequential};
  if (config.mode == "ssd") kinds_ = {Drafting::kNone, Drafting::kTrees, Drafting::kMisses};
  gauges_.policy_drafting = enabled_ ? "unplanned" : "off";
}

AdaptivePolicy::Options AdaptivePolicy::evaluate(const std::vector<Sequence*>& decoding, int64_t b) const {
  const int64_t K = config_.k;
  auto acceptance = [&](Drafting kind, CacheLookup miss = CacheLookup::kNone) {
    std::vector<Acceptance> a;
    for (const Sequence* seq : decoding) a.push_back(acceptance_of(seq, kind, miss));
    return a;
  };
  Options o;
  for (Drafting kind : kinds_) {
    StepPlan p;
    if (kind != Drafting::kTrees) {
      p = plan_step(kind, acceptance(kind), K, costs_at(b, b * (K + 1), kind));
    } else {
      // Misses served by the fallback kind that makes trees faster (the
      // worker's `auto` choice, by the same speed model, tends to it), or by
      // the configured one.
      for (CacheLookup miss : {CacheLookup::kFastFallback, CacheLookup::kNeuralFallback}) {
        const char* name = miss == CacheLookup::kFastFallback ? "fast" : "neural";
        if (config_.fallback != "auto" && config_.fallback != name) continue;
        const StepPlan q = plan_step(kind, acceptance(kind, miss), K, costs_at(b, b * (K + 1), kind, miss));
        if (o.trees_miss == CacheLookup::kNone || q.tokens_per_second() > p.tokens_per_second()) {
          p = q;
          o.trees_miss = miss;
        }
      }
    }
    // A plan that verifies no proposal runs an autoregressive step, whatever its kind.
    p.seconds *= step_factor(p.threshold > 1 ? Drafting::kNone : kind, b);
    if (kind == Drafting::kNone) o.none = p;
    else if (p.tokens_per_second() > o.speculative.tokens_per_second()) o.speculative = p;
    // ... and is one: in force, it is the autoregressive kind (whose probes
    // keep the acceptance estimates alive while nothing is verified).
    if (p.threshold > 1) p.drafting = Drafting::kNone;
    if (kind == kind_) o.current = p;
    if (p.tokens_per_second() > o.best.tokens_per_second()) o.best = p;
  }
  if (config_.mode == "ssd") {
    o.misses = plan_step(Drafting::kMisses, acceptance(Drafting::kMisses), K,
                         costs_at(b, b * (K + 1), Drafting::kMisses), 0.0);
    o.misses.seconds *= step_factor(Drafting::kMisses, b);
  }
  return o;
}

StepPlan AdaptivePolicy::choose(const Options& o, int64_t b, const std::vector<Acceptance>& acceptance) {
  const int64_t full = b * (config_.k + 1);
  // A forward size never timed is timed first, without trees beside it: one
  // row per sequence (an autoregressive step), then in ssd a full verify.
  // Not while the batch shrank, within the dwell, below one whose forward
  // was timed: the tail of a batch, which drains unevenly once any step
  // speculated; a batch that stays smaller is timed then. Its forwards are
  // priced from the larger batch's (interpolated, or flat below the
  // smallest: never cheaper, so autoregressive steps are not favoured), and
  // its timing steps (an autoregressive step, then a verify without trees)
  // cost two switches and a draft run over the batch each time it passed a
  // size: 3-4 switches in the last second of MT-bench T 0 batch-4 runs. (An
  // autoregressive step costs nothing while they are in force: it is taken.)
  const bool free_plan = forced_.empty();
  if (forward_.measured_near(b)) timed_batch_ = std::max(timed_batch_, b);
  const bool draining = b < timed_batch_ && step_ - shrank_at_ < kDwellSteps;
  const bool explore =
      free_plan && !(draining && kind_ != Drafting::kNone) && !forward_.measured_near(b) && timing_rows_ != b;
  const bool calibrate = free_plan && !draining && !explore && config_.mode == "ssd" &&
                         !forward_.measured_near(full) && timing_rows_ != full;
  // ... and timed again, while a speculative kind is in force, once the
  // context has moved past the one it was timed at (attention's share of a
  // row grows with it) and autoregressive steps are predicted at least as
  // good (within the hysteresis): a forward timed at a shorter context
  // prices them too cheaply, and only then can that decide. One step (the
  // kind in force stays), and the plan after it, made before that forward
  // is timed, switches nothing.
  const double spec = o.speculative.tokens_per_second(), none = o.none.tokens_per_second();
  const bool measured = kind_ != Drafting::kNone && measured_since_switch_ >= kLeaveSteps;
  retiming_ = free_plan && !explore && !calibrate && !holding_ && kind_ != Drafting::kNone &&
              (since_switch_ >= kDwellSteps || measured) && none * (1 + kHysteresis) >= spec &&
              !forward_.measured_near(b, context_);
  timing_rows_ = explore || retiming_ ? b : calibrate ? full : 0;
  // Only the draft model's proposals count: they are what every speculative kind's estimates start from.
  // The warm-up also goes on until the kind it warms had a step compared
  // with the model (its first kSwitchSteps are not): at batch 8 sixteen
  // trials took two steps, trees' step factor there was never measured, and
  // the timed run switched to trees priced at autoregressive steps' factor
  // (1.03; a tree step measured twice what the model said) for 3-5 steps.
  const bool unmeasured = warming_ && kind_ == o.speculative.drafting && measured_since_switch_ == 0 &&
                          since_switch_ <= kSwitchSteps + 1;
  const bool warming = (model_.trials() + hit_.trials() < kWarmupTrials || unmeasured) &&
                       o.speculative.drafting != Drafting::kNone;
  StepPlan chosen = o.current;
  const bool hold = holding_;
  holding_ = retiming_;
  warming_ = false;  // set by the warming plan below, if it is the one taken
  if (explore) {
    chosen = o.none;
  } else if (retiming_ || hold) {
    if (retiming_) SSD_LOG_DEBUG("adaptive: timing the forward of batch " << b << " again at context " << context_);
    // The kind in force stays, even should its plan, priced before the
    // forward was timed again, verify nothing (its rounds then verify
    // nothing for a step; the next plan decides at the new timing).
    if (kind_ != Drafting::kNone) chosen.drafting = kind_;
  } else if (calibrate) {
    chosen = o.misses;
  } else if (warming) {
    warming_ = true;
    chosen = o.speculative;
    chosen.threshold = 0.0;  // every proposal: the fixed mode's rounds
  } else if (measured && since_switch_ < kDwellSteps &&
             none > o.current.tokens_per_second() * (1 + kHysteresis)) {
    chosen = o.none;  // a speculative kind measured slower than the baseline: back to it before the dwell
  } else if (!planned_ || explored_) {
    // After the policy's own timing and warming plans: the best kind, if it
    // beats autoregressive steps and a speculative kind in force by the
    // hysteresis. Without it, the timing steps of a run's tail (a shrinking
    // batch) handed the next run's first plan at batch 8 to trees 0.2 % above
    // autoregressive steps, and two switches cost the run 10 %.
    const double best = o.best.tokens_per_second();
    chosen = o.best;
    if (chosen.drafting != Drafting::kNone && best < none * (1 + kHysteresis)) chosen = o.none;
    else if (chosen.drafting != kind_ && o.current.drafting != Drafting::kNone &&
             best < o.current.tokens_per_second() * (1 + kHysteresis))
      chosen = o.current;
  } else if (o.best.drafting != kind_ && since_switch_ >= kDwellSteps &&
             o.best.tokens_per_second() > o.current.tokens_per_second() * (1 + kHysteresis) &&
             pays_back(o.best, o.current, b)) {
    chosen = o.best;
  }
  // Leaving a speculative kind for autoregressive steps priced from a
  // forward timed at a context far from this one, by whichever rule (the
  // kind's own plan verifying nothing included): the forward is timed again
  // first, for one step, and the kind in force stays until the plan after
  // it. At HumanEval T 0 batch 8 the timed run's first plan had the forward
  // of one row per sequence from the warm-up's 17-token context (0.185 s,
  // 0.26 s at 138): trees' own plan verified nothing, and the dwell held
  // autoregressive steps for 8 steps before trees came back 22 % ahead.
  if (free_plan && !explore && !calibrate && !retiming_ && !hold && kind_ != Drafting::kNone &&
      chosen.drafting == Drafting::kNone && !forward_.measured_near(b, context_)) {
    retiming_ = holding_ = true;
    timing_rows_ = b;
    chosen = o.current;
    chosen.drafting = kind_;
    SSD_LOG_DEBUG("adaptive: timing the forward of batch " << b << " again at context " << context_
                                                           << " before leaving " << drafting_name(kind_));
  }
  explored_ = explore || calibrate || warming;
  if (planned_ && chosen.drafting != kind_) {
    counters_.adaptive_switches += 1;
    since_switch_ = 0;
    measured_since_switch_ = 0;
    probe_every_ = kProbeFirst;
    SSD_LOG_INFO("adaptive: drafting " << drafting_name(kind_) << " -> " << drafting_name(chosen.drafting)
                                       << " at batch " << b
                                       << (explore ? " (timing the forward)" : calibrate ? " (timing a verify)" : "")
                                       << ": predicted " << chosen.tokens_per_second() << " tok/s against "
                                       << o.current.tokens_per_second() << " (step factor "
                                       << step_factor(chosen.drafting, b) << " against "
                                       << step_factor(kind_, b) << ", acceptance "
                                       << acceptance.front().first << " then " << acceptance.front().next << ")");
  }
  return chosen;
}

bool AdaptivePolicy::pays_back(const StepPlan& to, const StepPlan& from, int64_t b) const {
  // The seconds `from` would take for the tokens `to` makes in a step, less
  // `to`'s, over the horizon: more than the switch costs.
  if (to.drafting == Drafting::kNone || to.threshold > 1) return true;
  if (!(from.tokens_per_second() > 0)) return true;
  const double saved = to.tokens / from.tokens_per_second() - to.seconds;
  return saved * static_cast<double>(kSwitchHorizon) > switch_seconds(to.drafting, b);
}

void AdaptivePolicy::plan(const std::vector<Sequence*>& decoding, const DraftCounters& draft_totals) {
  if (decoding.empty()) return;
  const auto t0 = Clock::now();
  // Rounds verified now that asked for trees: the draft builds them beside this forward.
  overlapped_ = config_.mode == "ssd" && std::any_of(decoding.begin(), decoding.end(), [](const Sequence* s) {
                  return s->trees && s->lookahead > 0;
                });
  learn_draft_costs(draft_totals);
  const auto b = static_cast<int64_t>(decoding.size());
  if (b < last_batch_) shrank_at_ = step_ + 1;  // the plan about to be made
  last_batch_ = b;
  context_ = 0.0;
  for (const Sequence* seq : decoding) context_ += static_cast<double>(seq->num_computed) / static_cast<double>(b);
  ++step_;
  if (!enabled_ || forward_.empty()) return;
  expect_step(decoding);
  std::vector<Acceptance> acceptance;
  for (const Sequence* seq : decoding) acceptance.push_back(acceptance_of(seq));
  const Options o = evaluate(decoding, b);
  const StepPlan chosen = choose(o, b, acceptance);
  ++since_switch_;
  kind_ = chosen.drafting;
  in_force_ = chosen;
  trees_miss_ = o.trees_miss;
  if (retiming_) in_force_ = o.none;  // for one step: autoregressive rounds, the kind in force stays
  probe_rounds_ = 0;
  probed_ = false;
  // Without speculation nothing updates the acceptance estimates: now and
  // then one sequence speculates in full for a step (the kind in force
  // stays). A probe of trees lasts two steps for the same sequence: its
  // first round is a miss (no tree was asked for before it), the second
  // looks up the tree built beside the first.
  const bool probe_on = chosen.drafting == Drafting::kNone && timing_rows_ == 0 &&
                        o.speculative.drafting != Drafting::kNone;
  if (probe_on && probe_steps_left_ > 0) {
    --probe_steps_left_;
    in_force_ = probe_plan_;
    probe_rounds_ = 1;
    probed_ = true;
    counters_.adaptive_probe_steps += 1;
  } else if (probe_on && ++since_speculation_ >= probe_every_) {
    in_force_ = o.speculative;
    in_force_.threshold = 0.0;
    probe_plan_ = in_force_;
    probe_steps_left_ = in_force_.drafting == Drafting::kTrees ? 1 : 0;
    probe_seq_.reset();  // the first sequence assigned
    probe_rounds_ = 1;
    probed_ = true;
    since_speculation_ = 0;
    probe_every_ = std::min(2 * probe_every_, kProbeMax);
    counters_.adaptive_probe_steps += 1;
  } else {
    probe_steps_left_ = 0;
  }
  if (chosen.drafting != Drafting::kNone) since_speculation_ = 0;
  planned_ = true;
  counters_.adaptive_steps += 1;
  if (in_force_.drafting == Drafting::kNone) counters_.adaptive_ar_steps += 1;
  if (in_force_.drafting == Drafting::kTrees) counters_.adaptive_tree_steps += 1;
  update_gauges(decoding, o, chosen, acceptance, b);
  counters_.adaptive_decision_seconds += since(t0);
}

void AdaptivePolicy::update_gauges(const std::vector<Sequence*>& decoding, const Options& o, const StepPlan& chosen,
                                   const std::vector<Acceptance>& acceptance, int64_t b) {
  const StepCosts costs = costs_at(b, b * (config_.k + 1), Drafting::kTrees, trees_miss_);
  double mean = 0, mean_next = 0;
  for (const Acceptance& a : acceptance) {
    mean += a.first / static_cast<double>(b);
    mean_next += a.next / static_cast<double>(b);
  }
  gauges_.policy_drafting = drafting_name(chosen.drafting);
  gauges_.policy_batch = b;
  gauges_.policy_threshold = chosen.threshold;
  gauges_.policy_acceptance = mean;
  gauges_.policy_continuation = mean_next;
  gauges_.policy_hit_rate = costs.hit_rate;
  gauges_.policy_verify_seconds = chosen.seconds;
  gauges_.policy_forward_seconds = forward_.seconds(b);
  gauges_.policy_tree_seconds = costs.tree;
  gauges_.policy_fallback_seconds = costs.fallback;
  gauges_.policy_draft_seconds = costs.draft_step;
  gauges_.policy_contention = costs.contention;
  gauges_.policy_step_factor = step_factor(chosen.drafting, b);
  gauges_.policy_switch_seconds =
      o.speculative.drafting == Drafting::kNone ? 0.0 : switch_seconds(o.speculative.drafting, b);
  gauges_.policy_fast_acceptance = config_.mode == "ssd" ? fast_acceptance().first : 0.0;
  gauges_.policy_hit_acceptance = 0.0;
  if (config_.mode == "ssd")
    for (const Sequence* seq : decoding)
      gauges_.policy_hit_acceptance += hit_acceptance(seq).first / static_cast<double>(b);
  gauges_.policy_tok_s = chosen.tokens_per_second();
  gauges_.policy_tok_s_ar = o.none.tokens_per_second();
  gauges_.policy_tok_s_best = o.best.tokens_per_second();
  if (step_ % 100 == 0)
    SSD_LOG_DEBUG("adaptive: batch " << b << ", drafting " << gauges_.policy_drafting << ", threshold "
                                     << chosen.threshold << ", acceptance " << mean << " then " << mean_next
                                     << ", hit rate " << costs.hit_rate
                                     << ", step factor " << gauges_.policy_step_factor << ", contention "
                                     << costs.contention << ", predicted " << chosen.tokens_per_second()
                                     << " tok/s (ar " << o.none.tokens_per_second() << ")");
}

void AdaptivePolicy::assign(Sequence* seq) {
  const int64_t K = config_.k;
  seq->tree_asked = seq->trees && seq->lookahead > 0;  // the round just verified: its tree, if one was built
  if (!forced_.empty()) {
    const auto n = static_cast<uint64_t>(forced_.size());
    seq->lookahead = std::clamp<int64_t>(forced_[(static_cast<uint64_t>(step_) + seq->id) % n], 0, K);
    seq->trees = true;
  } else if (!enabled_ || !planned_) {
    seq->lookahead = K;
    seq->trees = true;
  } else if (in_force_.drafting == Drafting::kNone) {
    seq->lookahead = 0;
    seq->trees = false;
  } else {
    // A probe (a speculative plan while none is in force) speculates for its first rounds only.
    const bool speculates =
        in_force_.drafting == kind_ || (probe_rounds_ > 0 && (!probe_seq_ || seq->id == *probe_seq_));
    const Acceptance acceptance = acceptance_of(seq, in_force_.drafting, trees_miss_);
    seq->lookahead = speculates ? lookahead_for(acceptance, in_force_.threshold, K) : 0;
    if (in_force_.drafting != kind_ && speculates) {
      --probe_rounds_;
      probe_seq_ = seq->id;
    }
    seq->trees = in_force_.drafting == Drafting::kTrees;
  }
  if (enabled_ || !forced_.empty()) {
    counters_.adaptive_rounds += 1;
    counters_.adaptive_lookahead_sum += seq->lookahead;
  }
}

void AdaptivePolicy::first_round(Sequence* seq) {
  started_ = true;
  assign(seq);
}

void AdaptivePolicy::stats(EngineStats& s) const {
  s.adaptive = counters_;
  s.policy = gauges_;
}

}  // namespace ssd::runtime
