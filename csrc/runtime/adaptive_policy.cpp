#include "adaptive_policy.h"

#include <algorithm>
#include <chrono>

#include "ssd/log.h"

namespace ssd::runtime {

namespace {

// Priors until measured: a proposal kept with even-ish odds, half the outcomes hit.
constexpr double kPriorAcceptance = 0.6, kPriorHitRate = 0.5;
// Weight of the priors, in proposals (acceptance) or lookups (hit rate): a
// few unlucky first rounds must not talk the policy out of speculating. A
// sequence's own estimate is pulled towards the batch's with kSequenceWeight.
constexpr double kPriorWeight = 8.0, kSequenceWeight = 4.0;
// Autoregressive steps between probes (one speculative step re-measuring
// acceptance and costs), doubling after each probe that confirms them.
constexpr int64_t kProbeFirst = 64, kProbeMax = 512;
// Verified proposals (decayed) before the policy may stop speculating: until
// then every round verifies k proposals with the best speculative kind, so
// the first rounds' luck does not decide.
constexpr double kWarmupTrials = 16.0;
// Decay per round of a sequence's own estimate (recent text), and of the batch-wide ones.
constexpr double kSequenceDecay = 0.8, kGlobalDecay = 0.98, kHitDecay = 0.95;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

AdaptivePolicy::AdaptivePolicy(const EngineConfig& config, const TestingConfig& testing)
    : config_(config), enabled_(config.adaptive && config.mode != "ar"), forced_(testing.forced_lookahead) {
  if (config.mode == "sd") kinds_ = {Drafting::kNone, Drafting::kSequential};
  if (config.mode == "ssd") kinds_ = {Drafting::kNone, Drafting::kTrees, Drafting::kMisses};
  gauges_.policy_drafting = enabled_ ? "unplanned" : "off";
}

double AdaptivePolicy::acceptance_of(const Sequence* seq) const {
  const double global = (kept_ + kPriorWeight * kPriorAcceptance) / (tried_ + kPriorWeight);
  const double a = (seq->kept + kSequenceWeight * global) / (seq->tried + kSequenceWeight);
  return std::clamp(a, 0.0, kMaxAcceptance);
}

void AdaptivePolicy::learn_draft_costs(const DraftCounters& totals) {
  const int64_t rounds = totals.draft_rounds - seen_.draft_rounds;
  const int64_t forwards = totals.draft_forwards - seen_.draft_forwards;
  const int64_t fallbacks = totals.fallback_batches - seen_.fallback_batches;
  const double draft_s = totals.draft_round_seconds - seen_.draft_round_seconds;
  const double fallback_s = totals.fallback_seconds - seen_.fallback_seconds;
  const int64_t neural = totals.neural_fallback_batches - seen_.neural_fallback_batches;
  const double neural_s = totals.neural_fallback_seconds - seen_.neural_fallback_seconds;
  if (last_batch_ > 0) {
    // sd counts its draft forwards; an ssd draft round is a tree.
    if (forwards > 0) draft_step_.observe(last_batch_, draft_s / static_cast<double>(forwards));
    else if (rounds > 0) tree_.observe(last_batch_, draft_s / static_cast<double>(rounds));
    if (fallbacks > 0) fallback_.observe(last_batch_, fallback_s / static_cast<double>(fallbacks));
    if (neural > 0) neural_fallback_.observe(last_batch_, neural_s / static_cast<double>(neural));
  }
  seen_ = totals;
}

StepCosts AdaptivePolicy::costs_at(int64_t batch, int64_t rows, Drafting kind) const {
  // Unmeasured parts: a tree sized to one verify (the auto budget's aim), a
  // fallback like an autoregressive step, a draft forward a K-th of one.
  StepCosts c;
  c.forward = &forward_;
  const double step = forward_.seconds(batch);
  c.draft_step = draft_step_.empty() ? step / static_cast<double>(std::max<int64_t>(config_.k, 1))
                                     : draft_step_.seconds(batch);
  c.tree = tree_.empty() ? forward_.seconds(rows) : tree_.seconds(batch);
  // Without trees every round drafts with the draft model (ssd_draft_worker).
  const CostCurve& fallback = kind == Drafting::kMisses ? neural_fallback_ : fallback_;
  c.fallback = fallback.empty() ? step : fallback.seconds(batch);
  c.hit_rate = (hits_ + kPriorWeight * kPriorHitRate) / (lookups_ + kPriorWeight);
  return c;
}

void AdaptivePolicy::plan(const std::vector<Sequence*>& decoding, const DraftCounters& draft_totals) {
  if (decoding.empty()) return;
  const auto t0 = Clock::now();
  learn_draft_costs(draft_totals);
  const auto b = static_cast<int64_t>(decoding.size());
  last_batch_ = b;
  ++step_;
  if (!enabled_ || forward_.empty()) return;
  const int64_t K = config_.k;
  std::vector<double> acceptance;
  for (const Sequence* seq : decoding) acceptance.push_back(acceptance_of(seq));
  const StepCosts costs = costs_at(b, b * (K + 1), Drafting::kTrees);
  StepPlan best, current, none, speculative;
  for (Drafting kind : kinds_) {
    const StepPlan p = plan_step(kind, acceptance, K, costs_at(b, b * (K + 1), kind));
    if (kind == Drafting::kNone) none = p;
    else if (p.tokens_per_second() > speculative.tokens_per_second()) speculative = p;
    if (kind == kind_) current = p;
    if (p.tokens_per_second() > best.tokens_per_second()) best = p;
  }
  // An autoregressive step where this batch's forward was never timed:
  // without it the curve would only guess the cost of not speculating.
  const bool explore = forced_.empty() && !forward_.measured_near(b);
  // After an exploring or warming step the choice is free (no dwell, no hysteresis).
  const bool warming = tried_ < kWarmupTrials && speculative.drafting != Drafting::kNone;
  StepPlan chosen = current;
  if (explore) {
    chosen = none;
  } else if (warming) {
    chosen = speculative;
    chosen.threshold = 0.0;  // every proposal: the fixed mode's rounds
  } else if (!planned_ || explored_ ||
             (best.drafting != kind_ && since_switch_ >= kDwellSteps &&
              best.tokens_per_second() > current.tokens_per_second() * (1 + kHysteresis))) {
    chosen = best;
  }
  explored_ = explore || warming;
  if (planned_ && chosen.drafting != kind_) {
    counters_.adaptive_switches += 1;
    since_switch_ = 0;
    probe_every_ = kProbeFirst;
    SSD_LOG_INFO("adaptive: drafting " << drafting_name(kind_) << " -> " << drafting_name(chosen.drafting)
                                       << " at batch " << b << (explore ? " (timing this batch's forward)" : "")
                                       << ": predicted " << chosen.tokens_per_second() << " tok/s against "
                                       << current.tokens_per_second() << " (acceptance "
                                       << acceptance.front() << ", hit rate " << costs.hit_rate << ")");
  }
  ++since_switch_;
  kind_ = chosen.drafting;
  in_force_ = chosen;
  // Without speculation nothing updates the acceptance estimates: now and
  // then one step speculates in full (the kind in force stays).
  if (chosen.drafting == Drafting::kNone && !explore && speculative.drafting != Drafting::kNone &&
      ++since_speculation_ >= probe_every_) {
    in_force_ = speculative;
    in_force_.threshold = 0.0;
    since_speculation_ = 0;
    probe_every_ = std::min(2 * probe_every_, kProbeMax);
    counters_.adaptive_probe_steps += 1;
  }
  if (chosen.drafting != Drafting::kNone) since_speculation_ = 0;
  planned_ = true;
  counters_.adaptive_steps += 1;
  if (in_force_.drafting == Drafting::kNone) counters_.adaptive_ar_steps += 1;
  if (in_force_.drafting == Drafting::kTrees) counters_.adaptive_tree_steps += 1;
  double mean = 0;
  for (double a : acceptance) mean += a / static_cast<double>(b);
  gauges_.policy_drafting = drafting_name(chosen.drafting);
  gauges_.policy_batch = b;
  gauges_.policy_threshold = chosen.threshold;
  gauges_.policy_acceptance = mean;
  gauges_.policy_hit_rate = costs.hit_rate;
  gauges_.policy_verify_seconds = chosen.seconds;
  gauges_.policy_forward_seconds = forward_.seconds(b);
  gauges_.policy_tree_seconds = costs.tree;
  gauges_.policy_fallback_seconds = costs.fallback;
  gauges_.policy_draft_seconds = costs.draft_step;
  gauges_.policy_tok_s = chosen.tokens_per_second();
  gauges_.policy_tok_s_ar = none.tokens_per_second();
  gauges_.policy_tok_s_best = best.tokens_per_second();
  if (step_ % 100 == 0)
    SSD_LOG_DEBUG("adaptive: batch " << b << ", drafting " << gauges_.policy_drafting << ", threshold "
                                     << chosen.threshold << ", acceptance " << mean << ", hit rate " << costs.hit_rate
                                     << ", predicted " << chosen.tokens_per_second() << " tok/s (ar "
                                     << none.tokens_per_second() << ")");
  counters_.adaptive_decision_seconds += since(t0);
}

void AdaptivePolicy::assign(Sequence* seq) {
  const int64_t K = config_.k;
  if (!forced_.empty()) {
    const auto n = static_cast<uint64_t>(forced_.size());
    seq->lookahead = std::clamp<int64_t>(forced_[(static_cast<uint64_t>(step_) + seq->id) % n], 0, K);
    seq->trees = true;
  } else if (!enabled_ || !planned_) {
    seq->lookahead = K;
    seq->trees = true;
  } else {
    seq->lookahead = in_force_.drafting == Drafting::kNone
                         ? 0
                         : lookahead_for(acceptance_of(seq), in_force_.threshold, K);
    seq->trees = in_force_.drafting == Drafting::kTrees;
  }
  if (enabled_ || !forced_.empty()) {
    counters_.adaptive_rounds += 1;
    counters_.adaptive_lookahead_sum += seq->lookahead;
  }
}

void AdaptivePolicy::first_round(Sequence* seq) { assign(seq); }

void AdaptivePolicy::after_round(Sequence* seq, int64_t proposed, int64_t accepted, CacheLookup lookup) {
  if (proposed > 0) {
    const double tried = static_cast<double>(accepted + (accepted < proposed ? 1 : 0));
    seq->kept = kSequenceDecay * seq->kept + static_cast<double>(accepted);
    seq->tried = kSequenceDecay * seq->tried + tried;
    kept_ = kGlobalDecay * kept_ + static_cast<double>(accepted);
    tried_ = kGlobalDecay * tried_ + tried;
  }
  // Hit rates are learnt from rounds whose tree was asked for.
  if (seq->trees && (lookup == CacheLookup::kHit || lookup == CacheLookup::kNeuralFallback ||
                     lookup == CacheLookup::kFastFallback)) {
    hits_ = kHitDecay * hits_ + (lookup == CacheLookup::kHit ? 1.0 : 0.0);
    lookups_ = kHitDecay * lookups_ + 1.0;
  }
  assign(seq);
}

void AdaptivePolicy::stats(EngineStats& s) const {
  s.adaptive = counters_;
  s.policy = gauges_;
}

}  // namespace ssd::runtime
