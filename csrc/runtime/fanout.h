// SAGUARO fan-out: how many candidate bonus tokens F_0..F_K the draft prepares
// branches for at each fork point, under a budget B = sum F_j.
//
// Geometric fan-out, with primary acceptance rate a and power-law miss rate
// 1 - p_hit(F) = F^-r:  F_j ~ a^(j / (1 + r)) for j < K and
// F_K ~ a^(K / (1 + r)) (1 - a)^(-1 / (1 + r)), scaled to B and rounded by
// largest remainders. a and r are estimated online from the outcomes; the
// budget is either fixed or sized so that the draft's tree fits inside one
// verify forward, from measured times.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace ssd::runtime {

/// The integer fan-out for budget `budget` (sum <= budget), K + 1 entries.
std::vector<int64_t> geometric_fanout(int64_t k, int64_t budget, double acceptance, double miss_exponent);

/// One fork point of a speculation as the draft saw it: its probability of the
/// token it proposed there (fork points 0..K-1) and the ranked probabilities of
/// the other candidate bonus tokens.
struct ForkPoint {
  double proposed_prob = 0.0;
  std::vector<float> candidates;
};

/// Confidence-ranked branches: the `budget` (fork point j, candidate index)
/// pairs most likely to be the verification outcome, P(accept j) * P(bonus |
/// j). P(accept j) = prod_{i<j} a_i * (1 - a_j) (a_K = 0 past the last
/// proposal), a_i = acceptance(proposed_prob_i); P(bonus = c | j) =
/// p_c / (1 - proposed_prob_j) for j < K and p_c at K (the target's token
/// differs from the rejected proposal). Ties: lower j, then lower index first.
/// Sorted by value, best first.
std::vector<std::pair<int64_t, int64_t>> confidence_branches(const std::vector<ForkPoint>& forks, int64_t budget,
                                                             const std::function<double(double)>& acceptance);

class FanoutPlanner {
 public:
  /// fixed: explicit F_0..F_K (empty: geometric); budget 0 means auto.
  FanoutPlanner(int64_t k, std::vector<int64_t> fixed, int64_t budget, int64_t max_budget);

  /// Records one verification: `accepted` of `proposed` draft tokens, and the
  /// rank (1-based) of the bonus among the candidate list at the fork point,
  /// or 0 when it was not among the `listed` ranked candidates.
  void observe_outcome(int64_t accepted, int64_t proposed, int64_t rank, int64_t listed);
  /// Records whether a greedy proposal the draft gave probability `prob` was accepted.
  void observe_proposal(double prob, bool accepted);
  /// Calibrated chance that a greedy proposal of draft probability `prob` is
  /// accepted: per probability decile, accepted / seen with forgetting, and a
  /// prior of the overall acceptance rate worth two proposals.
  double proposal_acceptance(double prob) const;
  /// Greedy proposals observed so far (the calibration is trusted from kCalibrated on).
  int64_t proposals_observed() const { return proposals_; }
  static constexpr int64_t kCalibrated = 32;
  /// Records one tree step over `rows` branches that took `seconds`, and the
  /// per-round fork-point forward time.
  void observe_tree_step(int64_t rows, double seconds);
  /// Records a tree of `sequences` sequences, built at the current budget,
  /// and the verify forward it was sized to.
  void observe_round(double fork_seconds, double tree_seconds, double verify_seconds, int64_t sequences = 1);

  /// Fan-out for the next tree of `num_seqs` sequences. The auto budget is
  /// per sequence: a tree of more sequences gets fewer branches each.
  std::vector<int64_t> plan(int64_t num_seqs);
  int64_t budget() const { return budget_; }
  double acceptance() const;
  double miss_exponent() const { return miss_exponent_; }
  /// Fitted seconds of one draft step over `rows` rows (0 before any tree step).
  double step_seconds(double rows) const;

 private:
  int64_t k_;
  std::vector<int64_t> fixed_;
  bool auto_budget_;
  int64_t budget_;
  int64_t max_budget_;
  double accepted_ = 0.0, proposed_ = 0.0;
  std::vector<double> rank_counts_;  // [max_budget + 2]: index r = rank r, 0 = not listed
  double miss_exponent_ = 1.0;
  static constexpr int kBins = 10;
  double bin_accepted_[kBins] = {}, bin_seen_[kBins] = {};
  int64_t proposals_ = 0;
  // Exponentially weighted least squares of tree step time against rows.
  double s1_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  double fork_s_ = 0, verify_s_ = 0, tree_s_ = 0;
  bool timed_ = false;
  // Until the step time's fit has spread: the branches of a whole tree
  // (all its sequences) the next one aims at, moved only by a new
  // measurement: down in proportion when the last tree overran its verify,
  // one branch per sequence up when it did not.
  double tree_rows_ = 0;
};

}  // namespace ssd::runtime
