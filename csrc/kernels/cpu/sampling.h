// Logits processing and keyed sampling. process_logits is THE routine that
// turns logits into the distribution a token is drawn from; sampling and
// (later) verification both call it.
#pragma once

#include <cstdint>
#include <vector>

namespace ssd::kernels {

struct LogitsParams {
  double temperature = 1.0;  ///< 0: greedy (one-hot at the argmax)
  int64_t top_k = 0;         ///< 0: off
  double top_p = 1.0;        ///< 1: off
};

/// Index of the largest value; ties go to the lowest index.
int32_t argmax(const float* x, int64_t n);

/// Buffers process_logits reuses between calls (one per thread of work).
struct LogitsScratch {
  std::vector<int32_t> order;
  std::vector<double> weights;
};

/// probs[V] = the processed distribution of logits[V]: temperature, then
/// top-k, then top-p. Candidates are ranked by (value desc, token id asc), so
/// ties at a cut keep the lowest ids. Temperature 0 gives a one-hot row.
void process_logits(const float* logits, int64_t vocab, const LogitsParams& params, float* probs,
                    LogitsScratch& scratch);

/// Inverse-CDF draw over probs[V] in token-id order with u in [0, 1).
int32_t sample_from_probs(const float* probs, int64_t vocab, double u);

/// Purposes of the keyed random streams.
enum class RandomPurpose : uint64_t { kSample = 1, kAccept = 2, kResidual = 3, kDraft = 4, kGumbel = 5 };

/// A uniform in [0, 1) determined only by (seed, position, purpose).
double keyed_uniform(uint64_t seed, uint64_t position, RandomPurpose purpose);

}  // namespace ssd::kernels
