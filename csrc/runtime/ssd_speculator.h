// Mode "ssd": the draft worker (its own thread) speculates while the target
// verifies. Before each verify the engine takes, for every speculative
// chunk, the speculation the worker sent for that sequence's current life,
// waiting only for those not there yet; after it, the outcome goes back.
// A sequence's life starts when its prefill is done and ends when it is
// preempted or finished; each start raises its epoch, and answers to an
// older life are dropped. Each start and outcome carries the lookahead of the
// sequence's next round (AdaptivePolicy); the worker answers only rounds with
// a lookahead > 0, and only those are waited for.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "speculator.h"
#include "ssd_draft_worker.h"

namespace ssd::runtime {

class SsdSpeculator final : public Speculator {
 public:
  SsdSpeculator(const EngineConfig& config, const TestingConfig& testing, std::shared_ptr<model::Model> draft);
  ~SsdSpeculator() override { stop(); }

  std::vector<DraftFailure> propose(std::vector<ScheduledChunk>& chunks, std::vector<Proposal>& proposals) override;
  void verified(Sequence* seq, const Proposal& proposal, int64_t accepted, int32_t bonus,
                double verify_seconds) override;
  void prefilling(Sequence* seq) override;
  void release(Sequence* seq, bool finished) override;
  void flush() override;
  double wait_seconds() const override { return wait_seconds_; }
  double draft_busy_seconds() const override { return worker_ ? worker_->busy_seconds() : 0.0; }
  void stats(EngineStats& s) const override;
  void interrupt() override;
  void stop() override;

 private:
  struct Life {
    uint64_t epoch = 0;    ///< raised each time the worker is (re)told of the sequence
    bool started = false;  ///< the worker knows this life
    int64_t told = 0;      ///< the lookahead of the round the worker was last told of (0: wants no speculation)
  };

  void start(Sequence* seq);
  /// A speculative chunk whose round the worker answers (its lookahead > 0).
  bool wants_speculation(const ScheduledChunk& c) const;
  /// Waits for the speculation of every speculative chunk's current life.
  /// Returns why some will never come (the worker ended or lost them, or
  /// interrupt()), or "" when all arrived.
  std::string await_ready(const std::vector<ScheduledChunk>& chunks);

  bool fault_truncated_q_;  // TestingConfig: deliberately wrong, see there
  std::unique_ptr<SsdDraftWorker> worker_;
  std::map<RequestId, Life> lives_;              // live requests only
  std::map<RequestId, Speculation> ready_;       // for the next verify
  std::vector<SpecMessage> outbox_;              // posted once per step
  double wait_seconds_ = 0.0;
};

}  // namespace ssd::runtime
