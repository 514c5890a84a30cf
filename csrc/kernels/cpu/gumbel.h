// The Gumbel-max coupling: keyed noise per (seed, position, token) and the
// draws it defines. A token is argmax_t log p_t + g_t with g_t = -log E_t,
// E_t = -log u_t: the same token as argmax_t p_t / E_t (the form computed
// here, in double). The target's token and the draft's proposal at a
// position use the same noise, so a proposal is accepted exactly when it is
// the target's own draw and the output is the autoregressive sample itself.
#pragma once

#include <cmath>
#include <cstdint>

#include "keyed_hash.h"
#include "sampling.h"

namespace ssd::kernels {

/// The noise stream of one (seed, position): keyed_uniform's hash of
/// (seed, position, kGumbel), hashed once per row; the token is mixed in last.
SSD_HOST_DEVICE inline uint64_t gumbel_row_key(uint64_t seed, uint64_t position) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ position);
  return mix64(h ^ static_cast<uint64_t>(RandomPurpose::kGumbel));
}

/// 2^-52: the step of the uniforms' grid.
inline constexpr double kGumbelGridStep = 1.0 / 4503599627370496.0;

/// The top 52 bits of the token's hash under the row key.
SSD_HOST_DEVICE inline uint64_t gumbel_bits(uint64_t row_key, int64_t token) {
  return mix64(row_key ^ static_cast<uint64_t>(token)) >> 12;
}

/// u_t in the open interval (0, 1) with 52 random bits of (row key, token):
/// u = (m + 0.5) * 2^-52 with m = gumbel_bits, so u and 1 - u are exact doubles.
SSD_HOST_DEVICE inline double gumbel_uniform(uint64_t row_key, int64_t token) {
  return (static_cast<double>(gumbel_bits(row_key, token)) + 0.5) * kGumbelGridStep;
}

/// E_t = -log(u_t): an Exp(1) variate; p_t / E_t ranks tokens like log p_t + g_t.
SSD_HOST_DEVICE inline double gumbel_exponential(uint64_t row_key, int64_t token) {
  return -::log(gumbel_uniform(row_key, token));  // ::, not ssd::log (ssd/log.h)
}

/// The `depth` best tokens of probs' support (probs_t > 0) by probs_t / E_t
/// (descending; ties to the lowest id), written to ids[0..count) with their
/// scores; returns count = min(depth, support). Tokens that provably cannot
/// enter the list are skipped before the logarithms (E_t >= 1 - u_t), which
/// never changes the result.
int64_t gumbel_top(const float* probs, int64_t vocab, uint64_t row_key, int64_t depth, int32_t* ids,
                   double* scores);

/// The Gumbel-max draw from probs at (seed, position): gumbel_top's first
/// token. A row without support gives token 0.
int32_t gumbel_argmax(const float* probs, int64_t vocab, uint64_t seed, uint64_t position);

/// Row-major buffers of one gumbel_sample call: probs [rows, vocab] (any
/// processed distribution, e.g. saguaro_sample's sigma); seeds, positions
/// [rows] (the request seed and the absolute position of the drawn token);
/// tokens [rows] (written).
struct GumbelSampleParams {
  const float* probs = nullptr;
  const uint64_t* seeds = nullptr;
  const int64_t* positions = nullptr;
  int64_t* tokens = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
};

/// tokens[r] = gumbel_argmax(probs[r], seeds[r], positions[r]).
void gumbel_sample(const GumbelSampleParams& params);

/// Row-major buffers of one batched gumbel_top call (the ssd tree's ranking of
/// a row's candidates): probs [rows, vocab]; seeds, positions [rows] as for
/// gumbel_sample; ids [rows, depth] (written; -1 past a row's count) and
/// scores [rows, depth] (written: probs_t / E_t, 0 past the count).
struct GumbelTopParams {
  const float* probs = nullptr;
  const uint64_t* seeds = nullptr;
  const int64_t* positions = nullptr;
  int64_t* ids = nullptr;
  double* scores = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t depth = 0;
};

/// Row r: gumbel_top(probs[r], gumbel_row_key(seeds[r], positions[r]), depth).
void gumbel_top(const GumbelTopParams& params);

}  // namespace ssd::kernels
