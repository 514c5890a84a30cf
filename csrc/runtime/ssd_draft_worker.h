// The draft worker of mode "ssd": its own thread, thread pool, model and KV
// cache. Per round it answers the target's verification outcomes with the
// next speculation (from the speculation cache on a hit, from a fallback
// speculator on a miss), and then, while the target verifies that
// speculation, builds the cache for its possible outcomes (TreeBuilder).
// The engine talks to it only through post() and collect(), with the
// messages of ssd_messages.h.
//
// Parts, each owned here and used on the worker thread only:
//   SpeculationCache  per-sequence state and the cached speculations
//   TreeBuilder       fork points, candidates, branches
//   PathDecoder       the batched draft forwards and sampling
//   Fallback          what answers a miss, and which kind does
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "fallback.h"
#include "fanout.h"
#include "path_decoder.h"
#include "speculation_cache.h"
#include "ssd/config.h"
#include "ssd/types.h"
#include "ssd_messages.h"
#include "tree_builder.h"

namespace ssd::runtime {

class SsdDraftWorker {
 public:
  SsdDraftWorker(const EngineConfig& config, std::shared_ptr<model::Model> draft, const TestingConfig& testing = {});
  ~SsdDraftWorker();
  SsdDraftWorker(const SsdDraftWorker&) = delete;
  SsdDraftWorker& operator=(const SsdDraftWorker&) = delete;

  void post(std::vector<SpecMessage> messages);
  /// Moves every ready speculation into `out`; waits up to timeout_s for one
  /// (returns early after interrupt()).
  void collect(std::vector<Speculation>& out, double timeout_s);
  /// From any thread: collect() stops waiting, now and from now on.
  void interrupt();
  bool interrupted() const;
  /// Seconds spent handling batches so far, the one under way included.
  double busy_seconds() const;
  /// True when nothing more will arrive without a new message: every message
  /// posted was handled and its answers collected, or the thread has ended.
  /// `why` says which (empty while running).
  bool settled(std::string& why) const;
  /// Stops and joins the thread (idempotent).
  void stop();
  /// The worker's counters and its current plan, copied under its lock.
  void stats(DraftCounters& counters, DraftGauges& gauges) const;

 private:
  struct Batch;

  void loop();
  /// Ends the sequences a batch asked about with `error` (the batch failed as a whole).
  void fail_batch(const std::vector<SpecMessage>& messages, const std::string& error);
  void handle(std::vector<SpecMessage>& messages);
  void read(std::vector<SpecMessage>& messages, Batch& batch);
  void outcome(DraftSequence& s, const SpecMessage& m, Batch& batch);
  void plan_fanout(int64_t sequences);
  void answer_misses(Batch& batch);
  void answer_starts(Batch& batch);
  /// Hands the batch's answers and counters to the engine, with the current plan.
  void publish(Batch& batch);
  void build_trees(const std::vector<DraftSequence*>& seqs);
  /// Feeds the committed tokens of sequences that want no speculation (best
  /// effort), once kCatchUpTokens of them are waiting.
  void catch_up(const std::vector<DraftSequence*>& seqs);
  static constexpr int64_t kCatchUpTokens = 16;

  EngineConfig config_;
  TestingConfig testing_;
  std::shared_ptr<model::Model> model_;
  bool confidence_;
  // The parts, in dependency order (each may refer to those above it).
  std::unique_ptr<model::KvCache> kv_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  FanoutPlanner planner_;
  SpeculationCache sequences_;
  PathDecoder decoder_;
  TreeBuilder trees_;
  Fallback fallback_;
  std::vector<int64_t> fanout_;  // the plan of the current round

  mutable std::mutex mu_;
  std::condition_variable wake_, ready_;
  std::deque<SpecMessage> inbox_;
  std::vector<Speculation> outbox_;
  DraftCounters counters_;
  DraftGauges gauges_;
  bool stopping_ = false;
  bool interrupted_ = false;
  bool busy_ = false;       // handling a batch
  std::chrono::steady_clock::time_point busy_since_;  // when the batch under way began
  double busy_seconds_ = 0.0;                         // batches handled before it
  std::string ended_;       // why the thread ended (empty while it runs)
  std::thread thread_;
};

}  // namespace ssd::runtime
