// What a speculative mode gives the engine each round: proposals for the
// speculative chunks, and what it must hear back. The engine's loop is the
// same for every mode; each Speculator owns its mode's state (sd: the draft's
// KV per sequence; ssd: the draft worker, the epochs of each sequence's life
// and the speculations ready for the next verify). ar has none.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../model/model.h"
#include "scheduler.h"
#include "ssd/config.h"
#include "ssd/types.h"

namespace ssd::runtime {

/// Where an ssd speculation came from, as the round's counters see it.
enum class CacheLookup { kNone, kHit, kNeuralFallback, kFastFallback };

/// The proposals one speculative chunk verifies this round.
struct Proposal {
  std::vector<int64_t> tokens;  ///< the proposals verified (at most the chunk's draft_tokens)
  /// [>= tokens.size(), vocab] f32: the exact rows the proposals were drawn
  /// from (row i: proposal i), on the draft's device (host memory for drafts
  /// made on the CPU); undefined when one_hot.
  at::Tensor q;
  bool one_hot = false;         ///< q is the one-hot of each token (the n-gram fallback)
  CacheLookup lookup = CacheLookup::kNone;  ///< ssd rounds after a sequence's first
};

/// A chunk the speculator could not draft for; the engine ends its request.
struct DraftFailure {
  Sequence* seq = nullptr;
  std::string error;
};

class Speculator {
 public:
  virtual ~Speculator() = default;

  /// Fills proposals[i] for every speculative chunks[i] (proposals has one
  /// entry per chunk). Chunks whose drafting failed are removed from both
  /// vectors and returned. Proposal rows stay valid until the next call.
  virtual std::vector<DraftFailure> propose(std::vector<ScheduledChunk>& chunks,
                                            std::vector<Proposal>& proposals) = 0;
  /// A round of `seq` verified: `accepted` proposals and the `bonus` token,
  /// by a target forward of `verify_seconds`. Called before the tokens are
  /// appended (seq->len() is the position of the first proposal).
  virtual void verified(Sequence* seq, const Proposal& proposal, int64_t accepted, int32_t bonus,
                        double verify_seconds) = 0;
  /// The sequence's prefill (or its prefill after a preemption) begins this
  /// step: its tokens are final up to its first speculative round, whose
  /// lookahead is set. ssd's draft side prefills them beside the target.
  virtual void prefilling(Sequence* /*seq*/) {}
  /// The sequence leaves the running set: preempted (it comes back later) or
  /// finished (for good). Its draft state is freed.
  virtual void release(Sequence* seq, bool finished) = 0;
  /// End of a step: what this step decided goes to the draft side.
  virtual void flush() {}
  /// Seconds the last propose() waited for drafts the target could not run without.
  virtual double wait_seconds() const { return 0.0; }
  /// Seconds a draft side running beside the target has been busy so far (0: none runs beside it).
  virtual double draft_busy_seconds() const { return 0.0; }
  /// The draft side's counters and plan.
  virtual void stats(EngineStats& /*s*/) const {}
  /// From another thread (the engine's shutdown): a propose() waiting on the
  /// draft side returns without the drafts it waits for (idempotent).
  virtual void interrupt() {}
  /// Stops whatever the speculator runs (idempotent).
  virtual void stop() {}
};

/// The speculator of config.mode ("sd" or "ssd"); nullptr for "ar".
std::unique_ptr<Speculator> make_speculator(const EngineConfig& config, const TestingConfig& testing,
                                            std::shared_ptr<model::Model> draft);

}  // namespace ssd::runtime
