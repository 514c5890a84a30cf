// The draft worker of mode "ssd": its own thread, thread pool, model and KV
// cache. Per round it answers the target's verification outcomes with the
// next speculation (from the speculation cache on a hit, from a fallback
// speculator on a miss), and then, while the target verifies that
// speculation, builds the cache for its possible outcomes: the draft's
// distributions at the K + 1 fork points, the top-F_j candidate bonus tokens
// there, and K tree-decode steps of every branch of every sequence in one
// batch per step.
//
// Messages: outcomes (accepted count and bonus) flow target -> draft; K
// tokens plus the K exact rows they were sampled from flow back. A sequence
// is (re)introduced by a start message carrying its tokens; its epoch
// increases each time, so answers to a sequence's older life are dropped.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "fanout.h"
#include "ssd/config.h"
#include "ssd/types.h"

namespace ssd::runtime {

/// Where a speculation came from.
enum class SpecSource { kStart, kHit, kNeural, kFast };

struct SpecMessage {
  enum class Kind { kStart, kOutcome, kRelease };
  Kind kind = Kind::kStart;
  RequestId id = 0;
  uint64_t epoch = 0;
  // kStart
  std::vector<int32_t> tokens;
  SamplingParams params;
  uint64_t seed = 0;
  // kOutcome
  int64_t accepted = 0;
  int64_t proposed = 0;
  int32_t bonus = 0;
  double verify_seconds = 0.0;  ///< the target forward that verified this round
};

struct Speculation {
  RequestId id = 0;
  uint64_t epoch = 0;
  SpecSource source = SpecSource::kStart;
  std::vector<int32_t> tokens;  ///< K proposals
  std::vector<float> q;         ///< [K, vocab] exact rows; empty when one_hot
  bool one_hot = false;
  std::string error;            ///< non-empty: drafting failed for this sequence
};

class DraftWorker {
 public:
  DraftWorker(const EngineConfig& config, std::shared_ptr<model::Model> draft, const TestingConfig& testing = {});
  ~DraftWorker();
  DraftWorker(const DraftWorker&) = delete;
  DraftWorker& operator=(const DraftWorker&) = delete;

  void post(std::vector<SpecMessage> messages);
  /// Moves every ready speculation into `out`; waits up to timeout_s for one.
  void collect(std::vector<Speculation>& out, double timeout_s);
  /// Stops and joins the thread (idempotent).
  void stop();
  /// The worker's counters and its current plan, copied under its lock.
  void stats(DraftCounters& counters, DraftGauges& gauges) const;

 private:
  struct Seq;
  struct Path;
  struct Ranked;
  enum class Fallback { kNeural, kFast };

  void loop();
  void handle(std::vector<SpecMessage>& messages);
  void outcome(Seq& s, const SpecMessage& m, std::vector<Seq*>& misses, std::vector<Speculation>& out);
  /// The fallback for this round's misses (logs a switch of kind).
  Fallback choose_fallback(int64_t batch);
  Fallback pick_fallback(int64_t batch) const;
  /// Scores the pending n-gram shadow proposals the committed text now decides.
  void score_shadow(Seq& s);
  void run_fallback(std::vector<Seq*>& seqs, Fallback kind, std::vector<Speculation>& out, bool starts = false);
  void build_trees(std::vector<Seq*>& seqs);
  /// Feeds every path and samples its tokens, all paths batched per step.
  /// tree: the forwards belong to the speculation tree (fork scoring or,
  /// with branches, the branch steps whose times feed the planner).
  void decode_paths(std::vector<Path>& paths, const std::vector<int64_t>& fanout, bool tree = false,
                    bool branches = false);
  void free_tree(Seq& s);
  void release(Seq& s);
  Speculation answer(const Seq& s, SpecSource source, std::vector<float> q, bool one_hot) const;
  void copy_slots(const model::BlockTable& from, const model::BlockTable& to, int64_t begin, int64_t end);

  EngineConfig config_;
  TestingConfig testing_;
  std::shared_ptr<model::Model> model_;
  int64_t vocab_;
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<kernels::ThreadPool> pool_;  // created on the worker thread
  FanoutPlanner planner_;
  std::map<RequestId, std::unique_ptr<Seq>> seqs_;  // worker thread only
  // Speed-model inputs of the "auto" fallback (worker thread only), per kind:
  // tokens per round verifying its proposals and its time relative to a verify.
  struct KindStats {
    double e = 0.0, tb = 0.0;
    int64_t rounds = 0, runs = 0;
  };
  KindStats kinds_[2];  // [Fallback::kNeural, Fallback::kFast]
  Fallback in_force_ = Fallback::kNeural;
  double hit_rate_ = 0.5, e_hit_ = 2.0, tp_ = 1.0;
  double last_verify_s_ = 0.0;
  std::vector<int64_t> fanout_;  // the plan of the current round
  // Confidence-ranked branches for greedy sequences (fanout "confidence"),
  // and how deep a fork point's candidate list goes for them.
  static constexpr int64_t kMaxConfidenceRank = 32;
  bool confidence_ = false;

  mutable std::mutex mu_;
  std::condition_variable wake_, ready_;
  std::deque<SpecMessage> inbox_;
  std::vector<Speculation> outbox_;
  DraftCounters counters_;
  DraftGauges gauges_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ssd::runtime
