// The ssd draft worker's forwards. A path is one line of draft tokens in its
// own block table: it feeds some tokens, then samples `steps` more, one per
// forward. Every path of a step goes into one batched forward, so the fork
// scoring of all sequences, or one tree step of every branch of every
// sequence, costs one forward. Each sampled row also yields its ranked best
// tokens: the next tree's fork candidates there.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "device_io.h"
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
/// planner calibrates like a greedy sequence's). Both rankings run on the
/// draft's device (Backend::top_tokens, Backend::gumbel_top); these lists are
/// what comes back of a row.
struct RankedTokens {
  std::vector<int32_t> tokens;
  std::vector<float> probs;

  bool empty() const { return tokens.empty(); }
  /// The probability of `token` (0 when it is not listed or no probabilities were kept).
  double prob_of(int32_t token) const;
  /// A row of top_tokens' output read back: ids [depth] (-1 past the list),
  /// probs [depth] or null.
  static RankedTokens top(const int64_t* ids, const float* probs, int64_t depth);
  /// A row of gumbel_top's output read back: ids and scores [depth].
  static RankedTokens perturbed(const int64_t* ids, const double* scores, int64_t depth, bool with_probs);
};

struct DraftPath {
  DraftSequence* seq = nullptr;
  model::BlockTable* table = nullptr;
  int64_t pos0 = 0;           ///< position of feed[0]
  std::vector<int32_t> feed;  ///< tokens fed at step 0
  int64_t steps = 0;          ///< tokens sampled after the feed (0: score only)
  int64_t rank_from = 0;      ///< score only: fed positions >= rank_from get ranked lists
  /// A tree branch: the table of the sequence it forks from at pos0, whose
  /// keys below pos0 it reads (fork attention); its own `table` then holds
  /// its path from pos0 on, in blocks of its own from pos0's block on.
  const model::BlockTable* prefix = nullptr;
  std::vector<int32_t> out;
  at::Tensor q;                          ///< [steps, vocab] f32 on the draft's device: the rows sampled from
  std::vector<RankedTokens> ranked;      ///< per sampled token: its row's ranking
  std::vector<RankedTokens> fed_ranked;  ///< score only: per fed position >= rank_from

  /// A path that samples `steps` tokens after feeding `feed` from `pos0` on.
  static DraftPath sampling(DraftSequence& seq, model::BlockTable& table, int64_t pos0, std::vector<int32_t> feed,
                            int64_t steps);
  /// A branch forking from `prefix` (its sequence's table) at pos0: it feeds
  /// `feed` there into `table` and samples `steps` tokens.
  static DraftPath branch(DraftSequence& seq, const model::BlockTable& prefix, model::BlockTable& table, int64_t pos0,
                          std::vector<int32_t> feed, int64_t steps);
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
  /// The logits, the draws and the rankings stay on the draft's device; the
  /// tokens and the ranked lists come back.
  void decode(std::vector<DraftPath>& paths, const std::vector<int64_t>& fanout, DraftForwards purpose);
  /// Bytes the forwards' draws and rankings have read to the host so far (any thread).
  int64_t host_bytes() const { return reads_.bytes(); }

 private:
  struct Ranking {
    int64_t depth = 0;
    bool probs = false;
  };
  struct StepBatch;
  struct RankJobs;

  Ranking ranking_for(const std::vector<DraftPath>& paths, const std::vector<int64_t>& fanout) const;
  StepBatch gather(std::vector<DraftPath>& paths, int64_t step, DraftForwards purpose);
  /// Samples the sampling paths' rows, ranks every row that wants a list;
  /// q_all [paths, steps, vocab] receives the rows sampled from. Returns how
  /// many paths sampled.
  int64_t take_rows(const StepBatch& batch, const at::Tensor& logits, int64_t step,
                    const std::vector<int64_t>& fanout, const Ranking& ranking, const at::Tensor& q_all);
  /// Ranks the rows the jobs list, on the device, and fills their lists.
  void rank(const RankJobs& jobs, const at::Tensor& logits, const at::Tensor& q, const Ranking& ranking);

  const EngineConfig& config_;
  const model::Model& model_;
  model::KvCache& kv_;
  kernels::ThreadPool& pool_;
  FanoutPlanner& planner_;
  int64_t vocab_;
  bool confidence_;
  bool gumbel_;
  HostReads reads_;
};

}  // namespace ssd::runtime
