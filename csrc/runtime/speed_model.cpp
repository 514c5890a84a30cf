#include "ssd/speed_model.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <stdexcept>
#include <string>

namespace ssd {

namespace {

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

void check(bool ok, const char* field, const std::string& why, double v) {
  if (!ok) throw std::invalid_argument(std::string(field) + ": " + why + ", got " + std::to_string(v));
}

SpeedMetrics counting_metrics(const SpecCounters& c, int64_t generated) {
  const auto d = [](int64_t x) { return static_cast<double>(x); };
  SpeedMetrics m;
  m.acceptance_rate = ratio(d(c.draft_tokens_accepted), d(c.draft_tokens_proposed));
  m.mean_accepted_len = ratio(d(c.draft_tokens_accepted), d(c.rounds));
  m.tokens_per_round = ratio(d(generated), d(c.rounds));
  m.cache_hit_rate = ratio(d(c.cache_hits), d(c.cache_lookups));
  m.e_hit = ratio(d(c.hit_tokens), d(c.cache_hits));
  m.e_miss = ratio(d(c.miss_tokens), d(c.cache_lookups - c.cache_hits));
  m.fast_acceptance_rate = ratio(d(c.fast_tokens_accepted), d(c.fast_tokens_proposed));
  return m;
}

}  // namespace

RoundPrediction predict_round(const RoundModel& m) {
  check(m.p_hit >= 0 && m.p_hit <= 1, "p_hit", "must be in [0, 1]", m.p_hit);
  check(m.e_hit >= 0, "e_hit", "must be >= 0", m.e_hit);
  check(m.e_miss >= 0, "e_miss", "must be >= 0", m.e_miss);
  check(m.t_p >= 0, "t_p", "must be >= 0", m.t_p);
  check(m.t_b >= 0, "t_b", "must be >= 0", m.t_b);
  check(m.verify_cost > 0, "verify_cost", "must be > 0", m.verify_cost);
  check(m.batch >= 1, "batch", "must be >= 1", static_cast<double>(m.batch));
  RoundPrediction r;
  if (m.overlapped) {
    r.p_all_hit = std::pow(m.p_hit, static_cast<double>(m.batch));
    r.tokens = m.p_hit * m.e_hit + (1 - m.p_hit) * m.e_miss;
    const double draft_done = std::max(1.0, m.t_p);
    r.time = r.p_all_hit * draft_done + (1 - r.p_all_hit) * (draft_done + m.t_b);
  } else {
    r.p_all_hit = 1.0;
    r.tokens = m.e_hit;
    r.time = 1.0 + m.t_p;
  }
  r.speedup = ratio(r.tokens, r.time * m.verify_cost);
  return r;
}

SpeedMetrics speed_metrics(const EngineStats& s) {
  SpeedMetrics m = counting_metrics(s.spec, s.steps.generated_tokens);
  const double verify = ratio(s.steps.verify_seconds, static_cast<double>(s.steps.verify_steps));
  m.t_p = ratio(ratio(s.draft.draft_round_seconds, static_cast<double>(s.draft.draft_rounds)), verify);
  m.t_b = ratio(ratio(s.draft.fallback_seconds, static_cast<double>(s.draft.fallback_batches)), verify);
  m.mean_batch = ratio(static_cast<double>(s.spec.rounds), static_cast<double>(s.steps.verify_steps));
  if (s.spec.cache_lookups > 0) {
    RoundModel model;
    model.p_hit = m.cache_hit_rate;
    model.e_hit = m.e_hit;
    model.e_miss = m.e_miss;
    model.t_p = m.t_p;
    model.t_b = m.t_b;
    model.batch = std::max<int64_t>(1, std::llround(m.mean_batch));
    m.predicted_speedup = predict_round(model).speedup;
  }
  m.target_busy_fraction = ratio(s.steps.forward_seconds, s.steps.active_seconds);
  m.round_host_bytes_per_step = ratio(static_cast<double>(s.steps.round_host_bytes), static_cast<double>(s.steps.steps));
  return m;
}

namespace {

// Buckets: exact up to 32, then four per octave.
int64_t bucket_of(int64_t size) {
  if (size <= 32) return std::max<int64_t>(size, 1);
  int64_t base = 32;
  while (base * 2 <= size) base *= 2;
  const int64_t step = base / 4;
  return base + (size - base + step / 2) / step * step;
}

}  // namespace

bool CostCurve::context_differs(double a, double b) {
  if (!(a > 0) || !(b > 0)) return false;
  const double hi = std::max(a, b) + kContextSlack, lo = std::min(a, b) + kContextSlack;
  return hi > kStaleContext * lo;
}

void CostCurve::observe(int64_t size, double seconds, double context) {
  if (size < 1 || !(seconds > 0)) return;
  Point& p = points_[bucket_of(size)];
  if (context_differs(p.context, context)) p.count = 0;  // measured at another context: replaced
  const bool first = p.count <= 1;
  p.seconds = first ? seconds : 0.8 * p.seconds + 0.2 * seconds;
  if (context > 0) p.context = first || !(p.context > 0) ? context : 0.8 * p.context + 0.2 * context;
  p.count += 1;
}

double CostCurve::seconds(int64_t size) const {
  if (points_.empty()) return 0.0;
  const auto x = static_cast<double>(std::max<int64_t>(size, 1));
  auto hi = points_.lower_bound(bucket_of(size));
  if (hi == points_.begin()) return hi->second.seconds;  // at or below the smallest: flat
  if (hi == points_.end()) {                              // above the largest: proportional
    const auto& [last, p] = *points_.rbegin();
    return p.seconds * std::max(1.0, x / static_cast<double>(last));
  }
  auto lo = std::prev(hi);
  const double x0 = static_cast<double>(lo->first), x1 = static_cast<double>(hi->first);
  const double t0 = lo->second.seconds, t1 = hi->second.seconds;
  return t0 + (t1 - t0) * std::clamp((x - x0) / (x1 - x0), 0.0, 1.0);
}

bool CostCurve::measured_near(int64_t size, double context) const {
  const double x = static_cast<double>(std::max<int64_t>(size, 1));
  return std::any_of(points_.begin(), points_.end(), [&](const auto& p) {
    const double r = static_cast<double>(p.first) / x;
    return r >= 1 / 1.5 && r <= 1.5 && !context_differs(p.second.context, context);
  });
}

const char* drafting_name(Drafting d) {
  switch (d) {
    case Drafting::kNone: return "none";
    case Drafting::kSequential: return "sequential";
    case Drafting::kTrees: return "trees";
    case Drafting::kMisses: return "misses";
  }
  return "?";
}

int64_t lookahead_for(const Acceptance& acceptance, double threshold, int64_t K) {
  int64_t V = 0;
  for (double gain = acceptance.first; V < K && gain >= threshold; gain *= acceptance.next) ++V;
  return V;
}

namespace {

// A step's seconds (the formulas of speed_model.h) over `rows` rows, the
// longest lookahead max_v and `speculating` sequences with a lookahead.
double step_seconds(Drafting d, int64_t rows, int64_t max_v, int64_t speculating, const StepCosts& c) {
  const double t = c.forward->seconds(rows);
  switch (d) {
    case Drafting::kNone: return t;
    case Drafting::kSequential: return t + static_cast<double>(max_v) * c.draft_step;
    case Drafting::kTrees: {
      if (speculating == 0) return t;
      const double verify = c.contention * t;
      const double tree = c.tree_per_verify > 0 ? c.tree_per_verify * verify : c.tree;
      return std::max(verify, tree) + (1 - std::pow(c.hit_rate, static_cast<double>(speculating))) * c.fallback;
    }
    case Drafting::kMisses: return t + (speculating > 0 ? c.fallback : 0.0);
  }
  return t;
}

void check_costs(const StepCosts& c) {
  if (c.forward == nullptr || c.forward->empty()) throw std::invalid_argument("plan_step: no measured forward times");
  check(c.hit_rate >= 0 && c.hit_rate <= 1, "hit_rate", "must be in [0, 1]", c.hit_rate);
  check(c.contention > 0, "contention", "must be > 0", c.contention);
  check(c.tree_per_verify >= 0, "tree_per_verify", "must be >= 0", c.tree_per_verify);
}

}  // namespace

double step_seconds(Drafting d, const std::vector<int64_t>& lookaheads, const StepCosts& costs) {
  check_costs(costs);
  int64_t rows = 0, max_v = 0, speculating = 0;
  for (int64_t v : lookaheads) {
    check(v >= 0, "lookahead", "must be >= 0", static_cast<double>(v));
    rows += 1 + v;
    max_v = std::max(max_v, v);
    speculating += v > 0 ? 1 : 0;
  }
  return step_seconds(d, rows, max_v, d == Drafting::kNone ? 0 : speculating, costs);
}

StepPlan plan_step(Drafting d, const std::vector<Acceptance>& acceptance, int64_t K, const StepCosts& c,
                   double threshold) {
  check_costs(c);
  check(K >= 0, "K", "must be >= 0", static_cast<double>(K));
  for (const Acceptance& a : acceptance) {
    check(a.first >= 0 && a.first < 1, "acceptance", "must be in [0, 1)", a.first);
    check(a.next >= 0 && a.next < 1, "continuation", "must be in [0, 1)", a.next);
  }
  const auto b = static_cast<int64_t>(acceptance.size());
  // Every proposal's gain, best first; a sequence's gains fall with depth,
  // so a prefix of this order verifies a prefix of each sequence's proposals.
  struct Gain {
    double gain;
    size_t seq;
  };
  std::vector<Gain> gains;
  if (d != Drafting::kNone)
    for (size_t i = 0; i < acceptance.size(); ++i) {
      double gain = acceptance[i].first;  // as lookahead_for() computes it, so thresholds match exactly
      for (int64_t j = 1; j <= K; ++j, gain *= acceptance[i].next) gains.push_back({gain, i});
    }
  std::stable_sort(gains.begin(), gains.end(), [](const Gain& x, const Gain& y) { return x.gain > y.gain; });
  std::vector<int64_t> V(acceptance.size(), 0);
  int64_t max_v = 0, speculating = 0;
  double tokens = static_cast<double>(b);
  StepPlan best;
  best.drafting = d;
  best.tokens = tokens;
  best.seconds = step_seconds(d, b, 0, 0, c);
  size_t taken = 0;  // gains in the best plan
  for (size_t n = 0; n < gains.size(); ++n) {
    const Gain& g = gains[n];
    if (threshold >= 0 && g.gain < threshold) break;
    if (V[g.seq]++ == 0) ++speculating;
    max_v = std::max(max_v, V[g.seq]);
    tokens += g.gain;
    const double t = step_seconds(d, b + static_cast<int64_t>(n) + 1, max_v, speculating, c);
    if (t > 0 && (threshold >= 0 || tokens / t > best.tokens_per_second())) {
      best.tokens = tokens;
      best.seconds = t;
      taken = n + 1;
    }
  }
  // The threshold lies between the last gain taken and the first left out
  // (geometric mean), not on either: the plan is applied after the round's
  // outcome has moved the estimates a little, which must not move a
  // sequence's lookahead across the cut. Everything taken: 0.
  if (threshold >= 0) best.threshold = threshold;
  else if (taken == gains.size() && taken > 0) best.threshold = 0.0;
  else if (taken > 0) best.threshold = std::sqrt(gains[taken - 1].gain * gains[taken].gain);
  return best;
}

SpeedMetrics speed_metrics(const RequestMetrics& r) { return counting_metrics(r.spec, r.generated_tokens); }

}  // namespace ssd
