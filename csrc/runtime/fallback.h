// What answers an outcome the speculation cache missed: the neural kind (the
// draft model drafts K tokens, as the tree would have) or the fast kind (an
// n-gram proposal off the sequence's own text, one-hot, nearly free), and
// the policy that picks one per round. Config "neural" and "fast" fix the
// kind; "auto" asks the speed model (ssd::predict_round) which kind makes
// the faster round, from online estimates of each kind's tokens per round and
// drafting time. The fast kind's tokens per round are also learnt while the
// neural kind answers, by scoring the n-gram proposal it would have made
// (its shadow) against the text the target commits.
#pragma once

#include <cstdint>
#include <vector>

#include "fanout.h"
#include "path_decoder.h"
#include "speculation_cache.h"
#include "ssd/config.h"
#include "ssd/types.h"
#include "ssd_messages.h"

namespace ssd::runtime {

enum class FallbackKind { kNeural, kFast };

/// How a fallback's speculation is tagged when it answers a miss.
inline SpecSource source_of(FallbackKind kind) {
  return kind == FallbackKind::kFast ? SpecSource::kFast : SpecSource::kNeural;
}

class Fallback {
 public:
  /// alternate (TestingConfig::auto_alternate): "auto" takes the kinds in turn.
  /// decoder: the draft model's (null: the neural kind cannot draft; a test of the choice).
  Fallback(const EngineConfig& config, const FanoutPlanner& planner, PathDecoder* decoder, bool alternate = false);

  /// The kind for this round's misses, `batch` outcomes verified together
  /// (logs a switch of kind).
  FallbackKind choose(int64_t batch);
  /// Drafts K tokens for each sequence with `kind` and answers it, tagged `source`.
  void draft(FallbackKind kind, SpecSource source, std::vector<DraftSequence*>& seqs,
             const std::vector<int64_t>& fanout, std::vector<Speculation>& out);

  /// Keeps for each sequence the n-gram proposal the fast kind would make now.
  void shadow(const std::vector<DraftSequence*>& seqs) const;
  /// Scores the sequence's shadows its committed text now decides.
  void score_shadows(DraftSequence& s, DraftCounters& counters);

  void observe_verify(double seconds) { verify_s_ = seconds; }
  /// Tokens a verified speculation from `source` emitted (accepted + bonus).
  /// The estimates are of what answers a tree's miss: a round that asked
  /// for no tree (tree_round false: the adaptive policy's treeless drafting)
  /// teaches only the neural kind's tokens (the draft model drafting from
  /// the committed text, as it answers a miss).
  void observe_emitted(SpecSource source, int64_t accepted, bool tree_round);
  void observe_lookup(bool hit) { hit_rate_ = 0.95 * hit_rate_ + 0.05 * (hit ? 1.0 : 0.0); }
  /// A fallback run's drafting time (as observe_emitted, only a tree
  /// round's); a tree's draft time (fork points and branches).
  void observe_run(FallbackKind kind, double seconds, bool tree_round);
  void observe_tree(double seconds);

  /// The last verify forward's time (0 before one is known).
  double verify_seconds() const { return verify_s_; }
  /// A kind's estimated tokens per round (0 before any).
  double tokens_estimate(FallbackKind kind) const;

 private:
  /// A kind's inputs to the speed model: tokens per round verifying its
  /// proposals, and its drafting time relative to a verify forward.
  struct KindEstimate {
    double tokens = 0.0, time = 0.0;
    int64_t rounds = 0, runs = 0;
  };
  FallbackKind pick(int64_t batch) const;
  double predicted_speedup(const KindEstimate& kind, int64_t batch) const;
  KindEstimate& of(FallbackKind kind) { return kind == FallbackKind::kFast ? fast_ : neural_; }
  const KindEstimate& of(FallbackKind kind) const { return kind == FallbackKind::kFast ? fast_ : neural_; }

  const EngineConfig& config_;
  const FanoutPlanner& planner_;
  PathDecoder* decoder_;
  KindEstimate neural_, fast_;
  bool alternate_;
  FallbackKind in_force_ = FallbackKind::kNeural;
  // Priors until measured: even odds of a hit, a hit emitting 2 tokens, a
  // tree costing one verify.
  double hit_rate_ = 0.5, hit_tokens_ = 2.0, tree_time_ = 1.0;
  double verify_s_ = 0.0;
};

}  // namespace ssd::runtime
