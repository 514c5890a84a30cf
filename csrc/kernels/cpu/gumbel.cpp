#include "gumbel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ssd::kernels {

namespace {

// Skips a token only when 1 - u_t >= probs_t / threshold * (1 + margin):
// then E_t > probs_t / threshold by far more than rounding, so the score
// probs_t / E_t is strictly below the threshold.
constexpr double kPruneMargin = 1e-9;

struct Entry {
  double score;
  int32_t id;
};

// (score desc, id asc); as a heap comparator it keeps the worst entry at the front.
bool better(const Entry& a, const Entry& b) { return a.score > b.score || (a.score == b.score && a.id < b.id); }

}  // namespace

int64_t gumbel_top(const float* probs, int64_t vocab, uint64_t row_key, int64_t depth, int32_t* ids,
                   double* scores) {
  if (depth <= 0) return 0;
  std::vector<Entry> heap;
  heap.reserve(static_cast<size_t>(depth));
  double skip_scale = 0.0;  // (1 + margin) / the list's worst score, once the list is full
  for (int64_t t = 0; t < vocab; ++t) {
    const float p = probs[t];
    if (!(p > 0.0f)) continue;
    const uint64_t m = gumbel_bits(row_key, t);
    if (skip_scale > 0.0) {
      // 1 - u_t, exactly: (2^52 - 1 - m + 0.5) * 2^-52.
      const double one_minus_u = (static_cast<double>(((uint64_t{1} << 52) - 1) - m) + 0.5) * kGumbelGridStep;
      if (one_minus_u >= static_cast<double>(p) * skip_scale) continue;
    }
    const double e = gumbel_exponential(row_key, t);
    const Entry entry{static_cast<double>(p) / e, static_cast<int32_t>(t)};
    if (static_cast<int64_t>(heap.size()) < depth) {
      heap.push_back(entry);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(entry, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = entry;
      std::push_heap(heap.begin(), heap.end(), better);
    } else {
      continue;
    }
    if (static_cast<int64_t>(heap.size()) == depth) skip_scale = (1.0 + kPruneMargin) / heap.front().score;
  }
  std::sort_heap(heap.begin(), heap.end(), better);
  for (size_t i = 0; i < heap.size(); ++i) {
    ids[i] = heap[i].id;
    if (scores != nullptr) scores[i] = heap[i].score;
  }
  return static_cast<int64_t>(heap.size());
}

int32_t gumbel_argmax(const float* probs, int64_t vocab, uint64_t seed, uint64_t position) {
  int32_t id = 0;
  gumbel_top(probs, vocab, gumbel_row_key(seed, position), 1, &id, nullptr);
  return id;
}

void gumbel_sample(const GumbelSampleParams& params) {
  for (int64_t r = 0; r < params.rows; ++r)
    params.tokens[r] = gumbel_argmax(params.probs + r * params.vocab, params.vocab, params.seeds[r],
                                     static_cast<uint64_t>(params.positions[r]));
}

void gumbel_top(const GumbelTopParams& params) {
  std::vector<int32_t> ids(static_cast<size_t>(params.depth));
  for (int64_t r = 0; r < params.rows; ++r) {
    int64_t* out = params.ids + r * params.depth;
    double* scores = params.scores + r * params.depth;
    const int64_t count = gumbel_top(params.probs + r * params.vocab, params.vocab,
                                     gumbel_row_key(params.seeds[r], static_cast<uint64_t>(params.positions[r])),
                                     params.depth, ids.data(), scores);
    std::copy(ids.begin(), ids.begin() + count, out);
    std::fill(out + count, out + params.depth, int64_t{-1});
    std::fill(scores + count, scores + params.depth, 0.0);
  }
}

}  // namespace ssd::kernels
