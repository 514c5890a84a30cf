#include "fork_select.h"

#include <algorithm>
#include <vector>

namespace ssd::kernels {

namespace {

// Best-ranked `count` ids of probs[vocab] other than `excluded`, best first.
// A bounded heap whose front is the worst kept id; the scan runs in id order,
// so a later id enters only with a strictly larger value and the common case
// is one compare against a cached float.
void top_ids(const float* probs, int64_t vocab, int64_t excluded, int64_t count,
             std::vector<int64_t>& heap) {
  auto ranks_above = [probs](int64_t a, int64_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  };
  heap.clear();
  if (count == 0) return;
  int64_t i = 0;
  for (; static_cast<int64_t>(heap.size()) < count; ++i) {
    if (i == excluded) continue;
    heap.push_back(i);
    std::push_heap(heap.begin(), heap.end(), ranks_above);
  }
  float worst = probs[heap.front()];
  for (; i < vocab; ++i) {
    if (!(probs[i] > worst) || i == excluded) continue;
    std::pop_heap(heap.begin(), heap.end(), ranks_above);
    heap.back() = i;
    std::push_heap(heap.begin(), heap.end(), ranks_above);
    worst = probs[heap.front()];
  }
  std::sort_heap(heap.begin(), heap.end(), ranks_above);
}

}  // namespace

void fork_select(const ForkSelectParams& p) {
  const int64_t k = p.positions - 1;
  std::vector<int64_t> heap;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.positions; ++j) {
      const int64_t row = b * p.positions + j;
      const int64_t excluded = j < k ? p.drafted[b * k + j] : -1;
      const int64_t count = std::min(p.fanout[j], p.vocab - (excluded >= 0 ? 1 : 0));
      top_ids(p.probs + row * p.vocab, p.vocab, excluded, count, heap);
      int64_t* out = p.candidates + row * p.max_fanout;
      std::copy(heap.begin(), heap.end(), out);
      std::fill(out + heap.size(), out + p.max_fanout, int64_t{-1});
      p.counts[row] = count;
    }
  }
}

int64_t top_of_row(const float* row, int64_t vocab, int64_t depth, int64_t* best) {
  int64_t count = 0;
  ForkSelectParams p;
  p.probs = row;
  p.fanout = &depth;
  p.batch = 1;
  p.positions = 1;
  p.vocab = vocab;
  p.max_fanout = depth;
  p.candidates = best;
  p.counts = &count;
  fork_select(p);
  return count;
}

}  // namespace ssd::kernels
