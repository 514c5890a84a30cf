#include "fanout.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ssd::runtime {

std::vector<int64_t> geometric_fanout(int64_t k, int64_t budget, double acceptance, double miss_exponent) {
  const double a = std::clamp(acceptance, 0.01, 0.99);
  const double e = 1.0 / (1.0 + std::max(miss_exponent, 1e-3));
  std::vector<double> w(static_cast<size_t>(k + 1));
  for (int64_t j = 0; j < k; ++j) w[j] = std::pow(a, j * e);
  w[k] = std::pow(a, k * e) * std::pow(1.0 - a, -e);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int64_t> f(w.size());
  std::vector<std::pair<double, int64_t>> rest;  // (fractional part, index)
  int64_t used = 0;
  for (size_t j = 0; j < w.size(); ++j) {
    const double x = static_cast<double>(budget) * w[j] / total;
    f[j] = static_cast<int64_t>(std::floor(x));
    used += f[j];
    rest.emplace_back(x - std::floor(x), static_cast<int64_t>(j));
  }
  // Largest remainders first; ties go to the later fork point (the larger weight).
  std::sort(rest.begin(), rest.end(), [](const auto& l, const auto& r) {
    return l.first != r.first ? l.first > r.first : l.second > r.second;
  });
  for (size_t i = 0; i < rest.size() && used < budget; ++i, ++used) f[rest[i].second] += 1;
  return f;
}

std::vector<std::pair<int64_t, int64_t>> confidence_branches(const std::vector<ForkPoint>& forks, int64_t budget,
                                                             const std::function<double(double)>& acceptance) {
  struct Value {
    double v;
    int64_t j, c;
  };
  std::vector<Value> values;
  const auto K = static_cast<int64_t>(forks.size()) - 1;
  double reach = 1.0;  // P(the first j proposals are accepted)
  for (int64_t j = 0; j <= K; ++j) {
    const ForkPoint& f = forks[static_cast<size_t>(j)];
    const double a = j < K ? std::clamp(acceptance(f.proposed_prob), 0.0, 1.0) : 0.0;
    const double here = reach * (1.0 - a);
    const double rest = j < K ? std::max(1e-9, 1.0 - f.proposed_prob) : 1.0;
    for (size_t c = 0; c < f.candidates.size(); ++c)
      values.push_back({here * std::min(1.0, static_cast<double>(f.candidates[c]) / rest), j,
                        static_cast<int64_t>(c)});
    reach *= a;
  }
  const auto n = std::min<size_t>(values.size(), static_cast<size_t>(std::max<int64_t>(budget, 0)));
  std::partial_sort(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n), values.end(),
                    [](const Value& l, const Value& r) {
                      if (l.v != r.v) return l.v > r.v;
                      return l.j != r.j ? l.j < r.j : l.c < r.c;
                    });
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.emplace_back(values[i].j, values[i].c);
  return out;
}

FanoutPlanner::FanoutPlanner(int64_t k, std::vector<int64_t> fixed, int64_t budget, int64_t max_budget)
    : k_(k),
      fixed_(std::move(fixed)),
      auto_budget_(budget == 0),
      budget_(budget == 0 ? std::min(k + 1, max_budget) : budget),
      max_budget_(max_budget),
      rank_counts_(static_cast<size_t>(max_budget + 2), 0.0) {}

double FanoutPlanner::acceptance() const {
  // A weak prior of 0.7 until outcomes arrive.
  return (accepted_ + 0.7 * 4.0) / (proposed_ + 4.0);
}

void FanoutPlanner::observe_outcome(int64_t accepted, int64_t proposed, int64_t rank, int64_t listed) {
  constexpr double kForget = 0.995;
  accepted_ = accepted_ * kForget + static_cast<double>(accepted);
  proposed_ = proposed_ * kForget + static_cast<double>(proposed);
  if (listed <= 0) return;
  for (double& c : rank_counts_) c *= kForget;
  const int64_t cap = static_cast<int64_t>(rank_counts_.size()) - 1;
  rank_counts_[static_cast<size_t>(rank > 0 && rank <= std::min(listed, cap) ? rank : 0)] += 1.0;
  // Fit log(1 - p_hit(F)) = c - r log F over the listed ranks.
  const double total = std::accumulate(rank_counts_.begin(), rank_counts_.end(), 0.0);
  if (total < 16.0) return;
  double hit = 0.0, n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int64_t f = 1; f < std::min(listed, cap); ++f) {
    hit += rank_counts_[static_cast<size_t>(f)];
    const double miss = 1.0 - hit / total;
    if (miss < 0.01) break;
    const double x = std::log(static_cast<double>(f)), y = std::log(miss);
    n += 1; sx += x; sy += y; sxx += x * x; sxy += x * y;
  }
  const double var = n * sxx - sx * sx;
  if (n >= 2 && var > 1e-9) miss_exponent_ = std::clamp(-(n * sxy - sx * sy) / var, 0.1, 4.0);
}

void FanoutPlanner::observe_proposal(double prob, bool accepted) {
  constexpr double kForget = 0.998;
  const int b = std::clamp(static_cast<int>(prob * kBins), 0, kBins - 1);
  bin_accepted_[b] = bin_accepted_[b] * kForget + (accepted ? 1.0 : 0.0);
  bin_seen_[b] = bin_seen_[b] * kForget + 1.0;
  ++proposals_;
}

double FanoutPlanner::proposal_acceptance(double prob) const {
  constexpr double kPrior = 2.0;
  const int b = std::clamp(static_cast<int>(prob * kBins), 0, kBins - 1);
  return (bin_accepted_[b] + kPrior * acceptance()) / (bin_seen_[b] + kPrior);
}

void FanoutPlanner::observe_tree_step(int64_t rows, double seconds) {
  constexpr double kForget = 0.95;
  const double x = static_cast<double>(rows);
  s1_ = s1_ * kForget + 1; sx_ = sx_ * kForget + x; sy_ = sy_ * kForget + seconds;
  sxx_ = sxx_ * kForget + x * x; sxy_ = sxy_ * kForget + x * seconds;
}

void FanoutPlanner::observe_round(double fork_seconds, double tree_seconds, double verify_seconds,
                                  int64_t sequences) {
  auto ema = [this](double& v, double x) { v = timed_ ? 0.8 * v + 0.2 * x : x; };
  ema(fork_s_, fork_seconds);
  ema(tree_s_, tree_seconds);
  ema(verify_s_, verify_seconds);
  timed_ = true;
  const double rows = static_cast<double>(budget_ * std::max<int64_t>(sequences, 1));
  if (fork_seconds + tree_seconds > verify_seconds && tree_seconds > 0)
    tree_rows_ = rows * std::clamp((0.95 * verify_seconds - fork_seconds) / tree_seconds, 0.0, 1.0);
  else
    tree_rows_ = rows + static_cast<double>(std::max<int64_t>(sequences, 1));
}

double FanoutPlanner::step_seconds(double rows) const {
  if (s1_ <= 0) return 0.0;
  const double var = s1_ * sxx_ - sx_ * sx_;
  if (var <= 1e-9) return sy_ / s1_;  // one row count seen so far: its mean time
  const double beta = (s1_ * sxy_ - sx_ * sy_) / var;
  const double alpha = (sy_ - beta * sx_) / s1_;
  return std::max(0.0, alpha + beta * rows);
}

std::vector<int64_t> FanoutPlanner::plan(int64_t num_seqs) {
  if (!fixed_.empty()) return fixed_;
  if (auto_budget_ && timed_ && verify_s_ > 0) {
    const double seqs = static_cast<double>(std::max<int64_t>(num_seqs, 1));
    const double var = s1_ * sxx_ - sx_ * sx_;
    const double beta = var > 1e-9 ? (s1_ * sxy_ - sx_ * sy_) / var : 0.0;
    if (beta > 0) {
      // fork + K (alpha + beta rows) <= verify, with a little slack; a fit
      // through negative seconds at no rows is taken as none there (fewer rows).
      const double alpha = std::max((sy_ - beta * sx_) / std::max(s1_, 1e-9), 0.0);
      const double rows = ((0.95 * verify_s_ - fork_s_) / static_cast<double>(k_) - alpha) / beta;
      budget_ = static_cast<int64_t>(std::floor(rows / seqs));
    } else {
      budget_ = static_cast<int64_t>(std::floor(tree_rows_ / seqs));
    }
    budget_ = std::clamp<int64_t>(budget_, 1, max_budget_);
  }
  return geometric_fanout(k_, budget_, acceptance(), miss_exponent_);
}

}  // namespace ssd::runtime
