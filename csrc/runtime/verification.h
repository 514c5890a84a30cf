// What a round's verification decides for one sequence (computed on the
// target's device by TargetRound, target_round.h), and the counters a round
// adds to its request and to the engine.
#pragma once

#include <cstdint>

#include "speculator.h"
#include "ssd/types.h"

namespace ssd::runtime {

struct Verdict {
  int64_t accepted = 0;  ///< leading proposals accepted
  int32_t bonus = 0;     ///< the token after them (residual sample, or the target's own after all)
};

/// The round's counters: one round of `proposal`, `accepted` of its tokens
/// accepted and `emitted` tokens appended. When the round `finished` the
/// request inside the accepted run, only the proposals it emitted count.
SpecCounters round_counters(const Proposal& proposal, int64_t accepted, int64_t emitted, bool finished);

}  // namespace ssd::runtime
