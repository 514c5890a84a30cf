// Mode "sd": the draft drafts every speculative chunk's proposals on the
// engine thread, then the target verifies them (the two take turns).
#pragma once

#include <memory>

#include "sd_drafter.h"
#include "speculator.h"

namespace ssd::runtime {

class SdSpeculator final : public Speculator {
 public:
  SdSpeculator(const EngineConfig& config, std::shared_ptr<model::Model> draft);

  std::vector<DraftFailure> propose(std::vector<ScheduledChunk>& chunks, std::vector<Proposal>& proposals) override;
  void verified(Sequence* seq, const Proposal& proposal, int64_t accepted, int32_t bonus,
                double verify_seconds) override;
  void release(Sequence* seq, bool finished) override;
  /// Its drafting time (draft_round_seconds per drafting call, draft_forwards).
  void stats(EngineStats& s) const override {
    s.draft = counters_;
    s.draft.draft_host_bytes = drafter_.host_bytes();
  }

 private:
  SdDrafter drafter_;
  int64_t vocab_;
  DraftCounters counters_;
  DraftBatch drafts_;  // owns the q rows of this round's proposals
};

}  // namespace ssd::runtime
