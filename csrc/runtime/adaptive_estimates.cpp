// The adaptive policy's estimates: acceptance and hit rates learnt from
// rounds, and the costs learnt from timings (forwards, the draft side, the
// step factor and switch costs) that price its plans (adaptive_policy.cpp).
#include "adaptive_policy.h"

#include <algorithm>
#include <cmath>

namespace ssd::runtime {

namespace {

// Priors until measured: a draft model's proposal kept with even-ish odds,
// the n-gram fallback's first proposal less often, half the outcomes hit.
// The n-gram fallback copies a span of earlier text, which is kept on once
// its first token is: fixed ssd kept 0.80-0.93 of its proposals after a
// kept one (greedy HumanEval and MT-bench, batch 1 and 2). Its continuation
// is tried only after a kept first proposal, so it gathers few trials and
// its prior holds for long: a prior at its first proposal's odds priced the
// fallback's later proposals, and with them a tree's, far too low.
constexpr double kPriorAcceptance = 0.6, kPriorFastAcceptance = 0.3, kPriorFastContinuation = 0.8,
                 kPriorHitRate = 0.5;
// Weight of the priors, in proposals (acceptance) or lookups (hit rate): a
// few unlucky first rounds must not talk the policy out of speculating. A
// sequence's own estimate is pulled towards the batch's with kSequenceWeight.
constexpr double kPriorWeight = 8.0, kSequenceWeight = 8.0;
// Decay per round of a sequence's own estimate (recent text), and of the batch-wide ones.
constexpr double kSequenceDecay = 0.9, kGlobalDecay = 0.98, kHitDecay = 0.95;
// Learnt ratios (contention, tree per verify, measured / modelled step):
// decay per measurement and the prior's weight in measurements. Each
// measurement is clamped to within a factor kRatioStride of the current
// value, so one stalled step cannot decide alone while a lasting change is
// still followed, a factor of kRatioStride at a time.
constexpr double kRatioDecay = 0.9, kRatioPriorWeight = 2.0, kRatioStride = 2.0;
// The priors: no slowdown beside trees, a tree as long as its verify (the
// auto budget's aim), steps as the model says.
constexpr double kPriorContention = 1.0, kPriorTreePerVerify = 1.0, kPriorStepFactor = 1.0;

// Share of a forward the draft may work beside it for the forward to count as uncontended.
constexpr double kQuietDraft = 0.1;

int index_of(Drafting d) { return static_cast<int>(d); }

}  // namespace

void AdaptivePolicy::Ratio::observe(double x, double prior, double at_context) {
  if (CostCurve::context_differs(context, at_context)) sum = weight = 0.0;  // learnt at another context: replaced
  const double v = value(prior);
  sum = kRatioDecay * sum + std::clamp(x, v / kRatioStride, v * kRatioStride);
  weight = kRatioDecay * weight + 1.0;
  if (at_context > 0) context = context > 0 ? 0.8 * context + 0.2 * at_context : at_context;
}

double AdaptivePolicy::Ratio::value(double prior) const {
  return (sum + kRatioPriorWeight * prior) / (weight + kRatioPriorWeight);
}

void AdaptivePolicy::Tally::add(double first, double kept_next_add, double tried_next_add, double decay) {
  kept = decay * kept + first;
  tried = decay * tried + 1.0;
  kept_next = decay * kept_next + kept_next_add;
  tried_next = decay * tried_next + tried_next_add;
}

Acceptance AdaptivePolicy::Tally::pulled(const Acceptance& prior) const {
  return {(kept + kPriorWeight * prior.first) / (tried + kPriorWeight),
          (kept_next + kPriorWeight * prior.next) / (tried_next + kPriorWeight)};
}

Acceptance AdaptivePolicy::acceptance_of(const Sequence* seq, const Tally& g, const Acceptance& prior) const {
  const Acceptance global = g.pulled(prior);
  auto estimate = [](double kept, double tried, double global_value) {
    return std::clamp((kept + kSequenceWeight * global_value) / (tried + kSequenceWeight), 0.0, kMaxAcceptance);
  };
  return {estimate(seq->kept, seq->tried, global.first), estimate(seq->kept_next, seq->tried_next, global.next)};
}

Acceptance AdaptivePolicy::acceptance_of(const Sequence* seq) const {
  return acceptance_of(seq, model_, {kPriorAcceptance, kPriorAcceptance});
}

Acceptance AdaptivePolicy::hit_acceptance(const Sequence* seq) const {
  // Until hits were measured, as the draft model drafting a round (its global estimate).
  return acceptance_of(seq, hit_, model_.pulled({kPriorAcceptance, kPriorAcceptance}));
}

double AdaptivePolicy::hit_rate() const {
  return (hits_ + kPriorWeight * kPriorHitRate) / (lookups_ + kPriorWeight);
}

Acceptance AdaptivePolicy::fast_acceptance() const {
  const Acceptance a = fast_.pulled({kPriorFastAcceptance, kPriorFastContinuation});
  return {std::clamp(a.first, 0.0, kMaxAcceptance), std::clamp(a.next, 0.0, kMaxAcceptance)};
}

Acceptance AdaptivePolicy::acceptance_of(const Sequence* seq, Drafting kind, CacheLookup miss) const {
  const Acceptance model = acceptance_of(seq);
  if (kind != Drafting::kTrees) return model;
  // A tree's round is a hit (the draft model's tree: until hits were
  // measured, as the model drafting) or a miss, which the worker re-drafts
  // with the draft model or serves with the n-gram fallback. The mixture's
  // first and second proposals keep their expected gains.
  const Acceptance hit = hit_acceptance(seq);
  const double h = hit_rate();
  double fast_share = (fast_misses_ + kPriorWeight * 0.5) / (misses_ + kPriorWeight);
  if (miss == CacheLookup::kFastFallback) fast_share = 1.0;
  if (miss == CacheLookup::kNeuralFallback) fast_share = 0.0;
  const double w_hit = h, w_fast = (1 - h) * fast_share, w_model = (1 - h) * (1 - fast_share);
  const Acceptance fast = fast_acceptance();
  Acceptance mixed;
  mixed.first = w_hit * hit.first + w_model * model.first + w_fast * fast.first;
  if (mixed.first > 0)
    mixed.next = std::clamp(
        (w_hit * hit.first * hit.next + w_model * model.first * model.next + w_fast * fast.first * fast.next) /
            mixed.first,
        0.0, kMaxAcceptance);
  return mixed;
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
    if (forwards > 0) {
      draft_step_.observe(last_batch_, draft_s / static_cast<double>(forwards));
    } else if (rounds > 0) {
      const double tree_s = draft_s / static_cast<double>(rounds);
      tree_.observe(last_batch_, tree_s);
      if (last_overlapped_forward_ > 0)
        tree_per_verify_.observe(tree_s / last_overlapped_forward_, kPriorTreePerVerify);
    }
    if (fallbacks > 0) fallback_.observe(last_batch_, fallback_s / static_cast<double>(fallbacks));
    if (neural > 0) neural_fallback_.observe(last_batch_, neural_s / static_cast<double>(neural));
    if (neural > 0 && neural_rounds_ > 0)
      neural_runs_.observe(std::max<int64_t>(1, std::llround(neural_rounds_ / static_cast<double>(neural))),
                           neural_s / static_cast<double>(neural));
    if (fallbacks > neural)
      fast_fallback_.observe(last_batch_, (fallback_s - neural_s) / static_cast<double>(fallbacks - neural));
  }
  seen_ = totals;
  neural_rounds_ = 0.0;
}

StepCosts AdaptivePolicy::costs_at(int64_t batch, int64_t rows, Drafting kind, CacheLookup miss) const {
  // Unmeasured parts: a tree sized to one verify (the auto budget's aim), a
  // fallback like an autoregressive step, a draft forward a K-th of one.
  StepCosts c;
  c.forward = &forward_;
  const double step = forward_.seconds(batch);
  c.draft_step = draft_step_.empty() ? step / static_cast<double>(std::max<int64_t>(config_.k, 1))
                                     : draft_step_.seconds(batch);
  c.tree = tree_.empty() ? forward_.seconds(rows) : tree_.seconds(batch);
  c.contention = contention_.value(kPriorContention);
  // The auto budget sizes each tree to the last verify: its time follows the verify's.
  if (config_.fanout_budget == 0 && config_.fanout_list.empty())
    c.tree_per_verify = tree_per_verify_.value(kPriorTreePerVerify);
  // Without trees every round drafts with the draft model (ssd_draft_worker).
  // A tree's misses: a run of the kind `miss` names (of either kind while
  // that one was never timed).
  const CostCurve* fallback = &fallback_;
  if (kind == Drafting::kMisses || miss == CacheLookup::kNeuralFallback) fallback = &neural_fallback_;
  if (kind != Drafting::kMisses && miss == CacheLookup::kFastFallback) fallback = &fast_fallback_;
  if (fallback->empty() && kind != Drafting::kMisses) fallback = &fallback_;
  c.fallback = fallback->empty() ? step : fallback->seconds(batch);
  // Without trees the draft model drafts every sequence's round: a run of
  // `batch` rounds, not a tree's misses' (a few of the batch). Priced by a
  // tree's misses' runs at batch 8 (one to three rounds each), drafting
  // without trees was taken at HumanEval T 0 and held for the dwell at
  // 0.76x fixed ssd.
  if (kind == Drafting::kMisses && !neural_runs_.empty()) c.fallback = neural_runs_.seconds(batch);
  c.hit_rate = hit_rate();
  return c;
}

double AdaptivePolicy::step_prior(Drafting kind, int64_t batch) const {
  double prior = step_all_[index_of(kind)].value(kPriorStepFactor);
  // A speculative kind not yet measured at this batch is priced at least
  // as any other kind measured there: what autoregressive steps cost beyond
  // the model (the engine's own work) every step costs, and the waits a
  // speculative kind pays (the draft side's) any kind that drafts. Priced at
  // autoregressive steps' factor, drafting without trees (0.998) looked 6 %
  // ahead of trees measured at 1.14 at HumanEval T 0 batch 4, was taken, and
  // its steps sent the policy to autoregressive steps for the dwell (0.64x
  // fixed ssd).
  if (kind == Drafting::kNone) return prior;
  for (Drafting other : kinds_) {
    if (other == kind) continue;
    const auto& measured = step_by_batch_[index_of(other)];
    if (const auto m = measured.find(batch); m != measured.end())
      prior = std::max(prior, m->second.value(step_all_[index_of(other)].value(kPriorStepFactor)));
  }
  return prior;
}

double AdaptivePolicy::step_factor(Drafting kind, int64_t batch) const {
  const auto& by_batch = step_by_batch_[index_of(kind)];
  const auto it = by_batch.find(batch);
  return it == by_batch.end() ? step_prior(kind, batch) : it->second.value(step_prior(kind, batch));
}

void AdaptivePolicy::observe_forward(int64_t rows, double seconds, double draft_busy) {
  // A forward the draft worked beside for more than a little (catching up,
  // a tree of an earlier round) is slowed by it: it times no forward by
  // rows, unless none near its rows was timed yet.
  const bool quiet = draft_busy <= kQuietDraft * seconds || !forward_.measured_near(rows, context_);
  if (!overlapped_ && quiet) {
    forward_.observe(rows, seconds, context_);
  } else if (overlapped_ && !forward_.empty()) {
    contention_.observe(seconds / forward_.seconds(rows), kPriorContention);
    last_overlapped_forward_ = seconds;
  }
  overlapped_ = false;
  context_ = 0.0;  // a forward without a plan (prefill only) is at no known context
}

void AdaptivePolicy::observe_step(double seconds, bool decode_only) {
  const Expected e = std::move(expected_);
  expected_ = {};
  if (!decode_only || e.lookaheads.empty() || !(seconds > 0)) return;
  int64_t rows = 0;
  for (int64_t v : e.lookaheads) rows += 1 + v;
  // A tree's step is modelled with the runs of the fallback kind that
  // served its misses (of the kind its plan was priced with if all hit), so
  // that a change of the worker's kind does not move the step factor.
  StepCosts costs = costs_at(e.batch, rows, e.drafting, e.missed == CacheLookup::kNone ? e.priced : e.missed);
  // Past a switch's first steps (whose first round misses whatever the
  // text: part of the switch's cost), with its lookups as they fell: the
  // fallback ran in full or not at all. The step factor is the model's error
  // in costs, not one step's luck in lookups: priced at the mean hit rate,
  // a step whose round missed measured 1.3 and one that hit 1.05 (batch 1).
  if (!e.switching) costs.hit_rate = e.missed == CacheLookup::kNone ? 1.0 : 0.0;
  const double modelled = step_seconds(e.drafting, e.lookaheads, costs);
  if (!(modelled > 0)) return;
  if (e.switching) {
    // A switch's first steps: what they took beyond the model is its cost.
    switch_excess_ += std::max(0.0, seconds - modelled * step_factor(e.drafting, e.batch));
    if (e.switching == kSwitchSteps) {
      switch_by_batch_[index_of(e.drafting)][e.batch].observe(switch_excess_, switch_seconds(e.drafting, e.batch));
    }
    return;
  }
  const double prior = step_prior(e.drafting, e.batch);
  step_by_batch_[index_of(e.drafting)][e.batch].observe(seconds / modelled, prior, e.context);
  step_all_[index_of(e.drafting)].observe(seconds / modelled, kPriorStepFactor, e.context);
  if (e.drafting == kind_) ++measured_since_switch_;
}

void AdaptivePolicy::expect_step(const std::vector<Sequence*>& decoding) {
  // The rounds verified now were planned a step ago; their lookaheads say
  // what ran. The first step of a kind pays for the switch, and a step that
  // starts a sequence waits for the draft's prefill: neither is compared.
  std::vector<int64_t> lookaheads;
  bool speculating = false, trees = false;
  for (const Sequence* seq : decoding) {
    lookaheads.push_back(seq->lookahead);
    speculating = speculating || seq->lookahead > 0;
    trees = trees || (seq->lookahead > 0 && seq->trees);
  }
  Drafting ran = Drafting::kNone;
  if (speculating) ran = config_.mode == "sd" ? Drafting::kSequential : trees ? Drafting::kTrees : Drafting::kMisses;
  const auto b = static_cast<int64_t>(decoding.size());
  // since_switch_ counts the plans since the kind in force changed, the one
  // that planned these rounds included. A switch's first steps measure its
  // cost, unless a probe or the policy's first plans (timing, warming) made it.
  // Autoregressive steps have no switch cost (the draft idles): they are
  // compared from the first, so that the forward's timing step also measures
  // what an autoregressive step costs beyond the model at this batch (the
  // engine's own work, which every kind pays).
  if (since_switch_ == 1) switch_excess_ = 0.0;
  const int64_t switching = since_switch_ <= kSwitchSteps && ran != Drafting::kNone ? since_switch_ : 0;
  expected_ = {};
  // A probe's steps are not compared either: one sequence drafts after
  // autoregressive rounds (the draft catches up, its first round misses),
  // which no step of the kind in force pays.
  if (planned_ && !started_ && !probed_ && (switching == 0 || (ran != Drafting::kNone && !explored_)))
    expected_ = {ran, std::move(lookaheads), b, switching, context_, CacheLookup::kNone, trees_miss_};
  started_ = false;
}

double AdaptivePolicy::switch_seconds(Drafting kind, int64_t b) const {
  // Until measured: the draft catches up and drafts once without a tree, and builds the first tree.
  const StepCosts costs = costs_at(b, b * (config_.k + 1), kind);
  double prior = 0.0;
  if (kind == Drafting::kSequential) prior = static_cast<double>(config_.k) * costs.draft_step;
  if (kind == Drafting::kMisses) prior = costs.fallback;
  if (kind == Drafting::kTrees) prior = costs.fallback + costs.tree;
  const auto& by_batch = switch_by_batch_[index_of(kind)];
  const auto it = by_batch.find(b);
  return it == by_batch.end() ? prior : it->second.value(prior);
}

void AdaptivePolicy::after_round(Sequence* seq, int64_t proposed, int64_t accepted, CacheLookup lookup) {
  if (proposed > 0) {
    // The first proposal: one trial. Each kept proposal opens a trial of the next, if it was verified.
    const double first = accepted > 0 ? 1.0 : 0.0;
    const double kept_next = static_cast<double>(std::max<int64_t>(accepted - 1, 0));
    const double tried_next = kept_next + (accepted > 0 && accepted < proposed ? 1.0 : 0.0);
    if (lookup == CacheLookup::kFastFallback) {
      // The n-gram fallback's proposals: their own estimates, not the draft model's.
      fast_.add(first, kept_next, tried_next, kGlobalDecay);
    } else {
      // The draft model's: the sequence's own (recent text), and by source over all sequences.
      seq->kept = kSequenceDecay * seq->kept + first;
      seq->tried = kSequenceDecay * seq->tried + 1.0;
      seq->kept_next = kSequenceDecay * seq->kept_next + kept_next;
      seq->tried_next = kSequenceDecay * seq->tried_next + tried_next;
      (lookup == CacheLookup::kHit ? hit_ : model_).add(first, kept_next, tried_next, kGlobalDecay);
    }
  }
  // Hit rates (and how misses were served) are learnt from rounds whose tree
  // was asked for: one round before (the draft builds it beside that
  // round's verify). The first round of trees after rounds without is a miss
  // whatever the text, and says nothing of the hit rate.
  const bool missed = lookup == CacheLookup::kNeuralFallback || lookup == CacheLookup::kFastFallback;
  if (lookup == CacheLookup::kNeuralFallback && proposed > 0) neural_rounds_ += 1.0;
  // Any round's miss ran the fallback: the step is modelled with it (observe_step).
  if (missed && proposed > 0 && expected_.missed != CacheLookup::kNeuralFallback) expected_.missed = lookup;
  if (seq->tree_asked && (lookup == CacheLookup::kHit || missed)) {
    hits_ = kHitDecay * hits_ + (lookup == CacheLookup::kHit ? 1.0 : 0.0);
    lookups_ = kHitDecay * lookups_ + 1.0;
    if (lookup != CacheLookup::kHit) {
      fast_misses_ = kHitDecay * fast_misses_ + (lookup == CacheLookup::kFastFallback ? 1.0 : 0.0);
      misses_ = kHitDecay * misses_ + 1.0;
    }
  }
  assign(seq);
}

}  // namespace ssd::runtime
