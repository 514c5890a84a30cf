// The ssd draft worker's speculation trees. While the target verifies a
// speculation x_1..x_K, the draft prepares the next speculation for the
// outcomes likely to come back. An outcome is (j, c): j proposals accepted,
// then the bonus token c at fork point j. The builder
// 1. feeds the draft up to the last proposal, so its distribution at every
//    fork point 0..K is known (the ranked lists of RankedTokens);
// 2. chooses candidates at the fork points the round can reach (0..V when
//    the target verifies V of the K proposals): the top F_j tokens at fork
//    point j other than the proposal x_{j+1} there (verification never
//    draws the bonus from the rejected proposal; at j = V < K nothing was
//    rejected, so x_{V+1} is a candidate like any other), or, under the confidence fan-out for greedy
//    sequences and for every sequence under the Gumbel coupling (whose
//    outcome the noise fixes as greedy decoding's is fixed), the budget's
//    most probable outcomes over all fork points;
// 3. gives each candidate a branch with KV blocks of its own and decodes K
//    tokens along every branch of every sequence, one batched forward per
//    step, filling the speculation cache.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "../model/kv_cache.h"
#include "fanout.h"
#include "path_decoder.h"
#include "speculation_cache.h"
#include "ssd/config.h"

namespace ssd::runtime {

/// What one build made of its plan.
struct TreeReport {
  int64_t sequences = 0;
  int64_t planned = 0;            ///< branches chosen
  int64_t branches = 0;           ///< branches that got KV blocks and were decoded
  std::vector<int64_t> per_fork;  ///< [K + 1] decoded branches per fork point
  double fork_seconds = 0.0;      ///< step 1
  double branch_seconds = 0.0;    ///< the branch decode
  double seconds = 0.0;           ///< the whole build
};

class TreeBuilder {
 public:
  TreeBuilder(const EngineConfig& config, model::KvCache& kv, PathDecoder& decoder, FanoutPlanner& planner);

  /// Teaches the planner from a verified speculation of `s` (before its
  /// outcome is committed): where the bonus ranked among the fork point's
  /// candidates, and, for the confidence fan-out, how its proposals fared.
  void observe_outcome(const DraftSequence& s, int64_t accepted, int64_t proposed, int32_t bonus);
  /// Builds the trees of `seqs` under fan-out F_0..F_K.
  TreeReport build(const std::vector<DraftSequence*>& seqs, const std::vector<int64_t>& fanout,
                   double verify_seconds);

 private:
  using Candidate = std::pair<int64_t, int32_t>;  // (fork point, bonus token)

  /// Whether `s` takes the confidence-ranked outcomes (greedy, or Gumbel-coupled).
  bool confidence_ranked(const DraftSequence& s) const;
  /// The proposals of the outstanding speculation the target verifies (V <= K).
  int64_t verified(const DraftSequence& s) const;
  /// The last fork point to score: V when V < K, else fork_end.
  int64_t last_fork(const DraftSequence& s, int64_t fork_end) const;
  void score_forks(const std::vector<DraftSequence*>& seqs, const std::vector<int64_t>& fanout, int64_t fork_end);
  std::vector<Candidate> candidates(const DraftSequence& s, const std::vector<int64_t>& fanout) const;
  std::vector<Candidate> confidence_candidates(const DraftSequence& s) const;
  /// Gives the candidate a branch; false when the draft KV has no room for it.
  bool add_branch(DraftSequence& s, const Candidate& candidate);
  void decode_branches(const std::vector<DraftSequence*>& seqs, const std::vector<int64_t>& fanout,
                       TreeReport& report);

  int64_t K_;
  bool confidence_;
  bool gumbel_;
  model::KvCache& kv_;
  PathDecoder& decoder_;
  FanoutPlanner& planner_;
};

}  // namespace ssd::runtime
