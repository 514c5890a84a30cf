// SAGUARO sampling: draw each row's draft token from sigma_{F,C} of the
// processed distribution and hand back the exact row it was drawn from (the
// verifier uses that row as q, so it is written, never recomputed).
#pragma once

#include <cstdint>

namespace ssd::kernels {

/// Per-row settings are arrays of length `rows`; logits and probs are [rows, vocab].
struct SaguaroSampleParams {
  const float* logits = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  const double* temperature = nullptr;  ///< 0: greedy, one-hot row at the argmax
  const int64_t* top_k = nullptr;       ///< 0: off
  const double* top_p = nullptr;        ///< 1: off
  const int64_t* fanout = nullptr;      ///< F >= 0: size of the downweighted set
  const double* downweight = nullptr;   ///< C in [0, 1]
  const double* uniforms = nullptr;     ///< u in [0, 1), one per row
  float* probs = nullptr;               ///< out: the row sampled from
  int64_t* tokens = nullptr;            ///< out: [rows]
};

/// For each row: p = process_logits(row); top_F = the F highest-ranked tokens
/// of p's support, ranked by (logit / temperature desc, token id asc) -- the
/// order of the exact probabilities, immune to rounding of p; sigma_t is
/// C * p_t on top_F and p_t elsewhere, renormalised. When top_F holds the whole
/// support (which covers the C = 0 case that would leave no mass) sigma = p.
/// The token is the inverse-CDF draw of u in token-id order. Inputs are
/// assumed validated by the caller.
void saguaro_sample(const SaguaroSampleParams& params);

}  // namespace ssd::kernels
