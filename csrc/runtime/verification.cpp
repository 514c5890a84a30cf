#include "verification.h"

namespace ssd::runtime {

SpecCounters round_counters(const Proposal& proposal, int64_t accepted, int64_t emitted, bool finished) {
  auto count = static_cast<int64_t>(proposal.tokens.size());
  // The request ended inside the accepted run: the proposals after its last
  // token were never used, so they count neither as proposed nor as accepted.
  if (finished && emitted <= accepted) count = accepted = emitted;
  SpecCounters c;
  c.rounds = 1;
  c.draft_tokens_proposed = count;
  c.draft_tokens_accepted = accepted;
  switch (proposal.lookup) {
    case CacheLookup::kNone:
      return c;
    case CacheLookup::kHit:
      c.cache_hits = 1;
      c.hit_tokens = emitted;
      break;
    case CacheLookup::kFastFallback:
      c.fallback_fast = 1;
      c.fast_tokens_proposed = count;
      c.fast_tokens_accepted = accepted;
      c.miss_tokens = emitted;
      break;
    case CacheLookup::kNeuralFallback:
      c.fallback_neural = 1;
      c.miss_tokens = emitted;
      break;
  }
  c.cache_lookups = 1;
  return c;
}

}  // namespace ssd::runtime
