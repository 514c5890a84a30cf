#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "keyed_hash.h"

namespace ssd::kernels {

namespace {

// Ranks candidate ids by (value desc, id asc).
struct RankDesc {
  const float* z;
  bool operator()(int32_t a, int32_t b) const { return z[a] > z[b] || (z[a] == z[b] && a < b); }
};

}  // namespace

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

namespace {

// Number of ranked candidates (order[0..kept) are the kept ids) forming the
// smallest prefix whose mass reaches top_p of the total. Only as much of the
// ranking as the cut needs is sorted: nucleus cuts are usually short.
int64_t top_p_cut(const float* z, double max_z, double top_p, int64_t kept,
                  std::vector<int32_t>& order) {
  double total = 0.0;
  for (int64_t i = 0; i < kept; ++i) total += std::exp(static_cast<double>(z[order[i]]) - max_z);
  const double target = top_p * total;
  const RankDesc rank{z};
  double cum = 0.0;
  int64_t sorted = 0;
  int64_t n = 0;
  for (int64_t want = std::min<int64_t>(kept, 64);; want = std::min(kept, want * 4)) {
    if (want < kept)
      std::nth_element(order.begin() + sorted, order.begin() + want, order.begin() + kept, rank);
    std::sort(order.begin() + sorted, order.begin() + want, rank);
    sorted = want;
    for (; n < sorted; ++n) {
      cum += std::exp(static_cast<double>(z[order[n]]) - max_z);
      if (cum >= target) return n + 1;
    }
    if (sorted == kept) return kept;
  }
}

}  // namespace

void process_logits(const float* logits, int64_t vocab, const LogitsParams& params, float* probs,
                    LogitsScratch& scratch) {
  if (params.temperature == 0.0) {
    std::fill(probs, probs + vocab, 0.0f);
    probs[argmax(logits, vocab)] = 1.0f;
    return;
  }
  // probs doubles as the scaled logits until the final softmax.
  const auto t = static_cast<float>(params.temperature);
  for (int64_t i = 0; i < vocab; ++i) probs[i] = logits[i] / t;
  const float* z = probs;
  const bool top_k = params.top_k > 0 && params.top_k < vocab;
  const bool top_p = params.top_p < 1.0;
  auto& w = scratch.weights;
  w.resize(static_cast<size_t>(vocab));
  if (!top_k && !top_p) {
    // Everything is kept: a plain softmax in token-id order.
    const double max_z = *std::max_element(z, z + vocab);
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += (w[i] = std::exp(static_cast<double>(z[i]) - max_z));
    for (int64_t i = 0; i < vocab; ++i) probs[i] = static_cast<float>(w[i] / total);
    return;
  }
  auto& order = scratch.order;
  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  int64_t kept = vocab;
  if (top_k) {
    kept = params.top_k;
    // Afterwards order[0..kept) are the kept ids: every one ranks above the rest.
    std::nth_element(order.begin(), order.begin() + (kept - 1), order.end(), RankDesc{z});
  }
  const double max_z = z[*std::min_element(order.begin(), order.begin() + kept, RankDesc{z})];
  if (top_p) kept = top_p_cut(z, max_z, params.top_p, kept, order);
  // Softmax over the kept set, summed in token-id order.
  std::sort(order.begin(), order.begin() + kept);
  double total = 0.0;
  for (int64_t i = 0; i < kept; ++i) total += (w[i] = std::exp(static_cast<double>(z[order[i]]) - max_z));
  std::fill(probs, probs + vocab, 0.0f);
  for (int64_t i = 0; i < kept; ++i) probs[order[i]] = static_cast<float>(w[i] / total);
}

int32_t sample_from_probs(const float* probs, int64_t vocab, double u) {
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += probs[i];
  const double target = u * total;
  double cum = 0.0;
  int64_t last_nonzero = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0f) continue;
    last_nonzero = i;
    cum += probs[i];
    if (target < cum) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last_nonzero);
}

double keyed_uniform(uint64_t seed, uint64_t position, RandomPurpose purpose) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ position);
  h = mix64(h ^ static_cast<uint64_t>(purpose));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace ssd::kernels
