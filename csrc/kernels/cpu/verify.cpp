#include "verify.h"

#include <algorithm>
#include <vector>

#include "sampling.h"

namespace ssd::kernels {

namespace {

struct Outcome {
  int64_t accepted;
  int64_t bonus;
};

struct Scratch {
  std::vector<float> probs;
  std::vector<float> residual;
  LogitsScratch logits;
};

// Draws from norm(max(p - q, 0)); q_row == nullptr means the point mass on x.
// The residual is formed in float, like the stored p and q it comes from.
int64_t residual_draw(const float* p, const float* q_row, int64_t x, int64_t vocab, double u,
                      float* residual) {
  bool has_mass = false;
  for (int64_t v = 0; v < vocab; ++v) {
    const float q = q_row != nullptr ? q_row[v] : (v == x ? 1.0f : 0.0f);
    residual[v] = std::max(p[v] - q, 0.0f);
    has_mass = has_mass || residual[v] > 0.0f;
  }
  return sample_from_probs(has_mass ? residual : p, vocab, u);
}

Outcome verify_greedy_row(const VerifyParams& P, int64_t b, int64_t n) {
  const int64_t stride = P.vocab;
  const float* logits = P.target_logits + b * (P.k + 1) * stride;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t best = argmax(logits + i * stride, P.vocab);
    if (P.proposals[b * P.k + i] != best) return {i, best};
  }
  return {n, argmax(logits + n * stride, P.vocab)};
}

Outcome verify_sampled_row(const VerifyParams& P, int64_t b, int64_t n, Scratch& s) {
  const int64_t vocab = P.vocab;
  const float* logits = P.target_logits + b * (P.k + 1) * vocab;
  const LogitsParams lp{P.temperature[b], P.top_k[b], P.top_p[b]};
  float* p = s.probs.data();
  for (int64_t i = 0; i < n; ++i) {
    process_logits(logits + i * vocab, vocab, lp, p, s.logits);
    const int64_t x = P.proposals[b * P.k + i];
    const float* q_row = P.one_hot[b] ? nullptr : P.q_probs + (b * P.k + i) * vocab;
    const double q_x = q_row != nullptr ? q_row[x] : 1.0;
    if (!(P.accept_uniforms[b * P.k + i] * q_x < static_cast<double>(p[x])))
      return {i, residual_draw(p, q_row, x, vocab, P.bonus_uniforms[b], s.residual.data())};
  }
  process_logits(logits + n * vocab, vocab, lp, p, s.logits);
  return {n, sample_from_probs(p, vocab, P.bonus_uniforms[b])};
}

}  // namespace

void verify(const VerifyParams& params, int64_t row_begin, int64_t row_end) {
  Scratch scratch;
  scratch.probs.resize(static_cast<size_t>(params.vocab));
  scratch.residual.resize(static_cast<size_t>(params.vocab));
  for (int64_t b = row_begin; b < row_end; ++b) {
    const int64_t n = params.num_proposals[b];
    const Outcome o = params.temperature[b] == 0.0 ? verify_greedy_row(params, b, n)
                                                   : verify_sampled_row(params, b, n, scratch);
    params.accepted[b] = o.accepted;
    params.bonus[b] = o.bonus;
  }
}

}  // namespace ssd::kernels
