// What crosses between the engine and the ssd draft worker (SsdDraftWorker).
//
// Outcomes (accepted count and bonus token) flow target -> draft; K tokens
// plus the K exact rows they were sampled from flow back. A sequence is
// (re)introduced by a start message carrying its tokens; its epoch increases
// each time, so answers to a sequence's older life can be told apart and
// dropped.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

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
  // kStart and kOutcome: the sequence's next round (AdaptivePolicy). With
  // lookahead 0 the target runs an autoregressive step and wants no
  // speculation; otherwise it verifies the first `lookahead` proposals.
  int64_t lookahead = 0;
  bool trees = true;  ///< build the cache for that round's outcomes
};

struct Speculation {
  RequestId id = 0;
  uint64_t epoch = 0;
  SpecSource source = SpecSource::kStart;
  std::vector<int32_t> tokens;  ///< K proposals
  at::Tensor q;                 ///< [K, vocab] f32 exact rows on the draft's device; undefined when one_hot
  bool one_hot = false;
  std::string error;            ///< non-empty: drafting failed for this sequence
};

}  // namespace ssd::runtime
