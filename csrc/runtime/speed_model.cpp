#include "ssd/speed_model.h"

#include <algorithm>
#include <cmath>
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
  return m;
}

SpeedMetrics speed_metrics(const RequestMetrics& r) { return counting_metrics(r.spec, r.generated_tokens); }

}  // namespace ssd
