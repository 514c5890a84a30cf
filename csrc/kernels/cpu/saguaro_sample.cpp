#include "saguaro_sample.h"

#include <algorithm>
#include <vector>

#include "sampling.h"

namespace ssd::kernels {

namespace {

struct Ranked {
  float z;
  int32_t id;
};

// (z desc, id asc); as a heap comparator it keeps the worst entry at the front.
bool ranks_above(const Ranked& a, const Ranked& b) { return a.z > b.z || (a.z == b.z && a.id < b.id); }

struct Scratch {
  LogitsScratch logits;
  std::vector<Ranked> heap;
  std::vector<int32_t> top;    // the downweighted ids, ascending
};

// Fills `top` with the `fanout` best-ranked ids of p's support in ascending id
// order, or leaves it empty when they would be the whole support. Ranking by
// the scaled logit rather than by p keeps tokens whose exact probabilities
// differ from tying after p is rounded to float. A bounded heap scanned in id
// order: a later id enters only with a strictly larger z.
void top_fanout(const float* logits, const float* p, int64_t vocab, float temperature,
                int64_t fanout, Scratch& s) {
  s.heap.clear();
  s.top.clear();
  int64_t support = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!(p[i] > 0.0f)) continue;
    ++support;
    const Ranked r{logits[i] / temperature, static_cast<int32_t>(i)};
    if (static_cast<int64_t>(s.heap.size()) < fanout) {
      s.heap.push_back(r);
      std::push_heap(s.heap.begin(), s.heap.end(), ranks_above);
    } else if (r.z > s.heap.front().z) {
      std::pop_heap(s.heap.begin(), s.heap.end(), ranks_above);
      s.heap.back() = r;
      std::push_heap(s.heap.begin(), s.heap.end(), ranks_above);
    }
  }
  if (support <= fanout) return;
  for (const Ranked& r : s.heap) s.top.push_back(r.id);
  std::sort(s.top.begin(), s.top.end());
}

// probs <- sigma: C * p on `top` (ascending ids), p elsewhere, renormalised.
// Some support lies outside `top`, so the normaliser is positive even at C = 0.
void downweight_top(float* probs, int64_t vocab, const std::vector<int32_t>& top, double c) {
  double top_mass = 0.0;
  double rest_mass = 0.0;
  size_t j = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const bool in_top = j < top.size() && top[j] == i;
    (in_top ? top_mass : rest_mass) += probs[i];
    j += in_top;
  }
  const double norm = c * top_mass + rest_mass;
  j = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const bool in_top = j < top.size() && top[j] == i;
    const double mass = in_top ? c * probs[i] : static_cast<double>(probs[i]);
    probs[i] = static_cast<float>(mass / norm);
    j += in_top;
  }
}

void sample_row(const SaguaroSampleParams& p, int64_t r, Scratch& scratch) {
  const float* logits = p.logits + r * p.vocab;
  float* probs = p.probs + r * p.vocab;
  const LogitsParams lp{p.temperature[r], p.top_k[r], p.top_p[r]};
  process_logits(logits, p.vocab, lp, probs, scratch.logits);
  // A one-hot row is its own sigma: its single token is either downweighted
  // alone (renormalised back) or not at all.
  if (lp.temperature > 0.0 && p.fanout[r] > 0 && p.downweight[r] < 1.0) {
    top_fanout(logits, probs, p.vocab, static_cast<float>(lp.temperature), p.fanout[r], scratch);
    if (!scratch.top.empty()) downweight_top(probs, p.vocab, scratch.top, p.downweight[r]);
  }
  p.tokens[r] = sample_from_probs(probs, p.vocab, p.uniforms[r]);
}

}  // namespace

void saguaro_sample(const SaguaroSampleParams& params) {
  Scratch scratch;
  for (int64_t r = 0; r < params.rows; ++r) sample_row(params, r, scratch);
}

}  // namespace ssd::kernels
