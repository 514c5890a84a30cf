#include "adaptive_policy.h"

#include <algorithm>
#include <chrono>

#include "ssd/log.h"

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

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

AdaptivePolicy::AdaptivePolicy(const EngineConfig& config, const TestingConfig& testing)
    : config_(config), enabled_(config.adaptive && config.mode != "ar"), forced_(testing.forced_lookahead) {
  if (config.mode == "sd") kinds_ = {Drafting::kNone, Drafting::kSequential};
  if (config.mode == "ssd") kinds_ = {Drafting::kNone, Drafting::kTrees, Drafting::kMisses};
  gauges_.policy_drafting = enabled_ ? "unplanned" : "off";
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
    if (fallbacks > neural)
      fast_fallback_.observe(last_batch_, (fallback_s - neural_s) / static_cast<double>(fallbacks - neural));
  }
  seen_ = totals;
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
  c.hit_rate = hit_rate();
  return c;
}

double AdaptivePolicy::step_prior(Drafting kind, int64_t batch) const {
  double prior = step_all_[index_of(kind)].value(kPriorStepFactor);
  // What autoregressive steps at this batch cost beyond the model (the
  // engine's own work) a speculative step costs too: a kind not yet
  // measured here is not priced below them.
  const auto& none = step_by_batch_[index_of(Drafting::kNone)];
  if (const auto n = none.find(batch); kind != Drafting::kNone && n != none.end())
    prior = std::max(prior, n->second.value(step_all_[index_of(Drafting::kNone)].value(kPriorStepFactor)));
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
  const bool free_plan = forced_.empty();
  const bool explore = free_plan && !forward_.measured_near(b) && timing_rows_ != b;
  const bool calibrate = free_plan && !explore && config_.mode == "ssd" && !forward_.measured_near(full) &&
                         timing_rows_ != full;
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
  const bool warming =
      model_.trials() + hit_.trials() < kWarmupTrials && o.speculative.drafting != Drafting::kNone;
  StepPlan chosen = o.current;
  const bool hold = holding_;
  holding_ = retiming_;
  if (explore) {
    chosen = o.none;
  } else if (retiming_ || hold) {
    if (retiming_) SSD_LOG_DEBUG("adaptive: timing the forward of batch " << b << " again at context " << context_);
  } else if (calibrate) {
    chosen = o.misses;
  } else if (warming) {
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

void AdaptivePolicy::stats(EngineStats& s) const {
  s.adaptive = counters_;
  s.policy = gauges_;
}

}  // namespace ssd::runtime
