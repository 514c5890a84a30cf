#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ssd::kernels {

namespace {

inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

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

void process_logits(const float* logits, int64_t vocab, const LogitsParams& params, float* probs,
                    std::vector<int32_t>& order) {
  if (params.temperature == 0.0) {
    std::fill(probs, probs + vocab, 0.0f);
    probs[argmax(logits, vocab)] = 1.0f;
    return;
  }
  // probs doubles as the scaled logits until the final softmax.
  const auto t = static_cast<float>(params.temperature);
  for (int64_t i = 0; i < vocab; ++i) probs[i] = logits[i] / t;
  const float* z = probs;

  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  int64_t kept = vocab;
  bool permuted = false;
  if (params.top_k > 0 && params.top_k < vocab) {
    kept = params.top_k;
    std::nth_element(order.begin(), order.begin() + (kept - 1), order.end(), RankDesc{z});
    permuted = true;
    // Everything before the (kept-1)-th ranks above it; the rest ranks below.
  }
  const float max_z = z[*std::min_element(order.begin(), order.begin() + kept, RankDesc{z})];
  if (params.top_p < 1.0) {
    std::sort(order.begin(), order.begin() + kept, RankDesc{z});
    double total = 0.0;
    for (int64_t i = 0; i < kept; ++i) total += std::exp(static_cast<double>(z[order[i]] - max_z));
    const double target = params.top_p * total;
    double cum = 0.0;
    int64_t n = 0;
    while (n < kept) {
      cum += std::exp(static_cast<double>(z[order[n]] - max_z));
      ++n;
      if (cum >= target) break;
    }
    kept = n;
    permuted = true;
  }
  // Softmax over the kept set, summed in token-id order.
  if (permuted) std::sort(order.begin(), order.begin() + kept);
  std::vector<double> e(static_cast<size_t>(kept));
  double total = 0.0;
  for (int64_t i = 0; i < kept; ++i) {
    e[i] = std::exp(static_cast<double>(z[order[i]] - max_z));
    total += e[i];
  }
  std::fill(probs, probs + vocab, 0.0f);
  for (int64_t i = 0; i < kept; ++i) probs[order[i]] = static_cast<float>(e[i] / total);
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
