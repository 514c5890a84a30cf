// The target's side of a round, for one sequence: its own token where it
// has no proposals (sampling or argmax), and the lossless verification of a
// speculative chunk's proposals. The uniforms are keyed by (request seed,
// position, purpose), so a seeded request's draws do not depend on the batch.
#pragma once

#include <cstdint>
#include <vector>

#include "../kernels/cpu/sampling.h"
#include "coupling.h"
#include "scheduler.h"
#include "speculator.h"
#include "ssd/config.h"
#include "ssd/types.h"

namespace ssd::runtime {

struct Verdict {
  int64_t accepted = 0;  ///< leading proposals accepted
  int32_t bonus = 0;     ///< the token after them (residual sample, or the target's own after all)
};

/// Verifies `proposal` against the target's 1 + n rows at `target_rows`
/// ([1 + n, vocab] logits, n = proposal.tokens.size()); `start` is the
/// position of the first proposal. Throws std::runtime_error on NaN logits.
/// fault_fast_argmax (TestingConfig): verifies one-hot proposals greedily.
Verdict verify_proposal(const float* target_rows, int64_t vocab, const Proposal& proposal,
                        const SamplingParams& params, uint64_t seed, int64_t start, bool fault_fast_argmax);

/// The Gumbel coupling's verification: the target's token at each position
/// is its Gumbel-max draw (the token ar samples there); the proposals are
/// accepted while they equal it, and the first draw they miss (or the one
/// after them all) is the bonus. q is never read. Temperature 0: greedy.
/// probs and scratch: buffers reused between calls.
Verdict verify_gumbel(const float* target_rows, int64_t vocab, const Proposal& proposal,
                      const SamplingParams& params, uint64_t seed, int64_t start, const Coupling& coupling,
                      std::vector<float>& probs, kernels::LogitsScratch& scratch);

/// The engine's verifier: verifies a sequence's round at its current length,
/// with the sequence's own settings and keyed draws. Its only state serves
/// TestingConfig's deliberate faults (fault_resume_stream,
/// fault_batch_top_kp, fault_fast_argmax, fault_peek_target, and the coupling's
/// fault_shared_noise); without them it is verify_proposal, or verify_gumbel
/// under the Gumbel coupling.
class Verifier {
 public:
  Verifier(const TestingConfig& testing, const Coupling& coupling) : testing_(testing), coupling_(coupling) {}

  /// `seq`'s round: the first proposal sits at position seq.len().
  Verdict verify(const float* target_rows, int64_t vocab, const Proposal& proposal, const Sequence& seq);

 private:
  TestingConfig testing_;
  Coupling coupling_;
  std::vector<float> probs_;  // verify_gumbel's buffers
  kernels::LogitsScratch scratch_;
  bool has_first_ = false;  // fault_batch_top_kp: the first request's settings are taken
  SamplingParams first_;
};

/// The target's token at `position` from its logits row ([vocab]): an
/// inverse-CDF draw of the keyed kSample uniform, or with the Gumbel coupling
/// the Gumbel-max draw at that position. Throws std::runtime_error on NaN logits.
class TokenSampler {
 public:
  explicit TokenSampler(const Coupling& coupling) : coupling_(coupling) {}

  int32_t sample(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t seed,
                 int64_t position);

 private:
  Coupling coupling_;
  std::vector<float> probs_;
  kernels::LogitsScratch scratch_;
};

/// The log-probabilities a request asked for (SamplingParams::logprobs) of
/// the token emitted at a position, from the target's logits row there: the
/// distribution it was drawn from, through the one logits-processing routine.
class LogprobReporter {
 public:
  TokenLogprobs report(const float* logits, int64_t vocab, const SamplingParams& params, int32_t token);

 private:
  std::vector<float> probs_;
  std::vector<int64_t> best_;
  kernels::LogitsScratch scratch_;
};

/// The round's counters: one round of `proposal`, `accepted` of its tokens
/// accepted and `emitted` tokens appended. When the round `finished` the
/// request inside the accepted run, only the proposals it emitted count.
SpecCounters round_counters(const Proposal& proposal, int64_t accepted, int64_t emitted, bool finished);

}  // namespace ssd::runtime
