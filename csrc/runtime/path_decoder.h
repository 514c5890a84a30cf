// The ssd draft worker's forwards. A path is one line of draft tokens in its
// own block table: it feeds some tokens, then samples `steps` more, one per
// forward. Every path of a step goes into one batched forward, so the fork
// scoring of all sequences, or one tree step of every branch of every
// sequence, costs one forward. Each sampled row also yields its ranked best
// tokens: the next tree's fork candidates there.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "../kernels/cpu/sampling.h"
#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "fanout.h"
#include "ssd/config.h"

namespace ssd::runtime {

struct DraftSequence;

/// Whether greedy sequences take confidence-ranked branches (fan-out
/// "confidence" without an explicit list); those need ranked probabilities.
bool confidence_fanout(const EngineConfig& config);

/// A row's best draft tokens ranked by (logit desc, id asc), with their
/// probabilities under the draft at temperature 1 when asked for (the
/// confidence fan-out reads them). Under the Gumbel coupling a sampled
/// sequence's row is ranked by the draft's Gumbel-max scores q_t / E_t at
/// the row's position instead: the target's token there is the argmax of
/// p_t / E_t, so these are the draft's best guesses of it, and the "probs"
/// are the scores normalised over the listed tokens (a confidence the
/// planner calibrates like a greedy sequence's).
struct RankedTokens {
  std::vector<int32_t> tokens;
  std::vector<float> probs;

  bool empty() const { return tokens.empty(); }
  /// The probability of `token` (0 when it is not listed or no probabilities were kept).
  double prob_of(int32_t token) const;
  static RankedTokens of(const float* logits, int64_t vocab, int64_t depth, bool with_probs);
  /// q: the draft's processed row; seed and position key the noise.
  static RankedTokens perturbed(const float* q, int64_t vocab, uint64_t seed, int64_t position, int64_t depth,
                                bool with_probs);
};

struct DraftPath {
  DraftSequence* seq = nullptr;
  model::BlockTable* table = nullptr;
  int64_t pos0 = 0;           ///< position of feed[0]
  std::vector<int32_t> feed;  ///< tokens fed at step 0
  int64_t steps = 0;          ///< tokens sampled after the feed (0: score only)
  int64_t rank_from = 0;      ///< score only: fed positions >= rank_from get ranked lists
  std::vector<int32_t> out;
  std::vector<float> q;                  ///< [steps, vocab]: the rows sampled from
  std::vector<RankedTokens> ranked;      ///< per sampled token: its row's ranking
  std::vector<RankedTokens> fed_ranked;  ///< score only: per fed position >= rank_from

  /// A path that samples `steps` tokens after feeding `feed` from `pos0` on.
  static DraftPath sampling(DraftSequence& seq, model::BlockTable& table, int64_t pos0, std::vector<int32_t> feed,
                            int64_t steps);
  /// A path that only feeds `feed` from `pos0` on, ranking positions >= rank_from.
  static DraftPath scoring(DraftSequence& seq, model::BlockTable& table, int64_t pos0, std::vector<int32_t> feed,
                           int64_t rank_from);
};

/// What a batch of forwards is for: it picks the matmul kernels and whether
/// step times feed the planner's cost fit.
enum class DraftForwards { kFallback, kForkScoring, kBranches };

class PathDecoder {
 public:
  PathDecoder(const EngineConfig& config, const model::Model& model, model::KvCache& kv, kernels::ThreadPool& pool,
              FanoutPlanner& planner);

  /// Feeds every path and samples its tokens, all paths batched per step.
  /// fanout: F_0..F_K of this round, for SAGUARO sampling and list depth.
  void decode(std::vector<DraftPath>& paths, const std::vector<int64_t>& fanout, DraftForwards purpose);
  /// Bytes of logit rows the forwards have read to the host so far (any thread).
  int64_t host_bytes() const { return host_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Ranking {
    int64_t depth = 0;
    bool probs = false;
  };
  struct StepBatch;

  Ranking ranking_for(const std::vector<DraftPath>& paths, const std::vector<int64_t>& fanout) const;
  StepBatch gather(std::vector<DraftPath>& paths, int64_t step, DraftForwards purpose);
  /// The ranked list of a row that draws the token at `position` of `s`
  /// (q: the draft's processed row when at hand, or null to process the
  /// logits here). Not thread-safe: it reuses one buffer.
  RankedTokens rank_row(const DraftSequence& s, const float* logits, const float* q, int64_t position,
                        const Ranking& ranking);
  /// Ranks score rows and samples the rest; returns how many paths sampled.
  int64_t take_rows(const StepBatch& batch, const float* rows, int64_t step, const std::vector<int64_t>& fanout,
                    const Ranking& ranking);

  const EngineConfig& config_;
  const model::Model& model_;
  model::KvCache& kv_;
  kernels::ThreadPool& pool_;
  FanoutPlanner& planner_;
  int64_t vocab_;
  bool confidence_;
  bool gumbel_;
  std::vector<float> q_;  // rank_row's processed row
  std::atomic<int64_t> host_bytes_{0};
  kernels::LogitsScratch scratch_;
};

}  // namespace ssd::runtime
