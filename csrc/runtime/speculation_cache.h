// The ssd draft worker's per-sequence state and its speculation cache: for
// each sequence, the speculation outstanding at the target, and the next
// speculation prepared for each outcome the tree covers, keyed by (accepted
// count, bonus token). A tree branch holds the KV of its bonus token and the
// K - 1 tokens drafted after it in blocks of its own, borrowing the blocks
// it shares with the sequence; on a hit that KV moves into the sequence.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "../model/kv_cache.h"
#include "path_decoder.h"
#include "ssd/config.h"
#include "ssd_messages.h"

namespace ssd::runtime {

/// One outcome the tree covers: the fork point (the accepted count) and the
/// bonus token there, with its own KV.
struct TreeBranch {
  int64_t fork = 0;
  int32_t bonus = 0;
  model::BlockTable table;  ///< the first `shared` blocks are borrowed from the sequence
  int64_t shared = 0;
};

/// The speculation drafted along a branch: what the worker answers on a hit.
struct CachedSpeculation {
  std::vector<int32_t> tokens;
  at::Tensor q;  ///< [K, vocab] on the draft's device
  std::vector<RankedTokens> ranked;
  size_t branch = 0;  ///< index into DraftSequence::branches
};

/// An n-gram proposal the fast kind would have made when the text had `at`
/// tokens, kept to be scored once the committed text decides it.
struct ShadowProposal {
  int64_t at = 0;
  std::vector<int32_t> tokens;
};

struct DraftSequence {
  RequestId id = 0;
  uint64_t epoch = 0;
  SamplingParams params;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;        ///< committed tokens (prompt + generated)
  model::BlockTable table;            ///< draft KV along tokens, then the outstanding speculation
  int64_t computed = 0;               ///< positions of `table` holding valid KV
  std::vector<int32_t> spec;          ///< the outstanding speculation; empty when none
  std::vector<RankedTokens> ranked;   ///< [K + 1] ranked draft tokens per fork point
  SpecSource source = SpecSource::kStart;
  int64_t verify = 0;                 ///< proposals of it the target verifies (the tree's last fork point)
  bool trees = true;                  ///< the target asked for a tree of its outcomes
  bool treed = false;                 ///< the cache below answers the outstanding speculation
  std::vector<ShadowProposal> shadows;
  std::vector<TreeBranch> branches;
  std::map<std::pair<int64_t, int32_t>, CachedSpeculation> cache;  ///< by (accepted, bonus)

  bool greedy() const { return params.temperature == 0.0; }
  /// Makes `tokens` the outstanding speculation, with a ranked list per fork point.
  void propose(std::vector<int32_t> proposal, std::vector<RankedTokens> lists, int64_t K, SpecSource from);
  /// The answer to the target carrying the outstanding speculation.
  Speculation answer(SpecSource from, at::Tensor q, bool one_hot) const;
};

/// Copies the KV of positions [begin, end) from one block table's slots to
/// another's, on the cache's backend (queued on its device, not waited for).
void copy_kv_slots(model::KvCache& kv, const model::BlockTable& from, const model::BlockTable& to, int64_t begin,
                   int64_t end);

class SpeculationCache {
 public:
  SpeculationCache(int64_t K, model::KvCache& kv) : K_(K), kv_(kv) {}
  ~SpeculationCache() { clear(); }
  SpeculationCache(const SpeculationCache&) = delete;
  SpeculationCache& operator=(const SpeculationCache&) = delete;

  /// A new life of sequence m.id (any older one must have been dropped).
  DraftSequence& start(SpecMessage& m);
  DraftSequence* find(RequestId id);
  /// Frees the sequence's KV and forgets it.
  void drop(RequestId id);
  void clear();

  /// Commits a verification outcome: the accepted proposals and the bonus
  /// join the text; draft KV past the accepted ones is dropped.
  void commit(DraftSequence& s, int64_t accepted, int32_t bonus);
  /// After commit: answers from the cache entry of (accepted, bonus) when
  /// the tree has one and its KV fits into the sequence; false on a miss.
  bool take_hit(DraftSequence& s, int64_t accepted, int32_t bonus, Speculation& out);
  /// Frees the tree's blocks and forgets its entries.
  void free_tree(DraftSequence& s);

 private:
  void release(DraftSequence& s);

  int64_t K_;
  model::KvCache& kv_;
  std::map<RequestId, std::unique_ptr<DraftSequence>> seqs_;
};

}  // namespace ssd::runtime
