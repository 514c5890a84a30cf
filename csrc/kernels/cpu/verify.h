// Lossless speculative verification: rejection sampling of K-token proposals
// against the target's processed distributions (process_logits), with the
// greedy path for temperature-0 rows.
#pragma once

#include <cstdint>

namespace ssd::kernels {

/// Row-major, contiguous buffers of one verify call (B rows, K proposal slots, V vocab):
///   target_logits [B, K + 1, V]; proposals [B, K]; num_proposals [B] (0..K);
///   q_probs [B, K, V] (never read on one-hot rows); one_hot, temperature, top_k, top_p [B];
///   accept_uniforms [B, K] and bonus_uniforms [B] in [0, 1);
///   accepted, bonus [B] (written).
struct VerifyParams {
  const float* target_logits = nullptr;
  const int64_t* proposals = nullptr;
  const int64_t* num_proposals = nullptr;
  const float* q_probs = nullptr;
  const bool* one_hot = nullptr;
  const double* temperature = nullptr;
  const int64_t* top_k = nullptr;
  const double* top_p = nullptr;
  const double* accept_uniforms = nullptr;
  const double* bonus_uniforms = nullptr;
  int64_t* accepted = nullptr;
  int64_t* bonus = nullptr;
  int64_t batch = 0;
  int64_t k = 0;
  int64_t vocab = 0;
};

/// Verifies rows [row_begin, row_end); rows never influence each other.
/// Row b with n = num_proposals[b], p_i = process_logits(target_logits[b, i-1])
/// and q_i = q_probs[b, i-1] (the point mass on x_i if one_hot[b]):
///   x_i is accepted iff accept_uniforms[b, i-1] * q_i(x_i) < p_i(x_i), in order,
///   stopping at the first rejection; accepted[b] = the number accepted.
///   The bonus is drawn with bonus_uniforms[b] by inverse CDF in token-id order
///   from norm(max(p_i - q_i, 0)) at the first rejection i, or from p_{n+1}.
///   If rounding leaves that residual without mass (p and q equal wherever
///   p > 0), the bonus is drawn from p_i instead.
/// Temperature 0: x_i is accepted iff it is argmax(target_logits[b, i-1])
/// (ties: lowest id); the bonus is the argmax at the first rejection or at n+1.
/// Proposals past num_proposals[b] are never read.
void verify(const VerifyParams& params, int64_t row_begin, int64_t row_end);

}  // namespace ssd::kernels
