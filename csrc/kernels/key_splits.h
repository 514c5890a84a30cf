// The split of an attention query's key range, shared by the CPU kernels
// (cpu/attention_splits.h) and the CUDA ones (cuda/attention_common.cuh):
// keys are cut at multiples of kSplitKeys of their index (position 0 is key
// 0), so a query's splits depend on its own key range only. Plain C++.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SSD_KEY_SPLITS_FN __host__ __device__ inline
#else
#define SSD_KEY_SPLITS_FN inline
#endif

namespace ssd::kernels {

/// Keys per split: split j holds keys j * kSplitKeys .. (j + 1) * kSplitKeys - 1.
constexpr int64_t kSplitKeys = 256;

/// The first key a query of `end_key` keys attends to: 0, or with a sliding
/// window > 0 the last `window` keys only.
SSD_KEY_SPLITS_FN int64_t window_first_key(int64_t end_key, int64_t window) {
  return window > 0 && end_key > window ? end_key - window : 0;
}

/// The number of splits keys [first_key, end_key) span (0 when empty).
SSD_KEY_SPLITS_FN int64_t key_splits(int64_t first_key, int64_t end_key) {
  return end_key > first_key ? (end_key - 1) / kSplitKeys - first_key / kSplitKeys + 1 : 0;
}

/// The most splits (at least 1) any of n queries at positions[0..n) spans
/// (host memory): what a CUDA launch sizes its split workspace by.
inline int64_t max_key_splits(const int32_t* positions, int64_t n, int64_t window) {
  int64_t most = 1;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t end = int64_t{positions[t]} + 1;
    const int64_t splits = key_splits(window_first_key(end, window), end);
    if (splits > most) most = splits;
  }
  return most;
}

/// At least the most splits a query at any position below key_bound spans
/// (key_bound >= 1): a launch sized by it serves every such query (a query
/// leaves the splits past its own unused).
inline int64_t max_key_splits_below(int64_t key_bound, int64_t window) {
  const int64_t all = key_splits(0, key_bound);
  // A window of w keys starting anywhere spans at most (w - 1) / kSplitKeys + 2 splits.
  return window > 0 && (window - 1) / kSplitKeys + 2 < all ? (window - 1) / kSplitKeys + 2 : all;
}

}  // namespace ssd::kernels
