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

/// The number of splits keys [first_key, end_key) span (0 when empty).
SSD_KEY_SPLITS_FN int64_t key_splits(int64_t first_key, int64_t end_key) {
  return end_key > first_key ? (end_key - 1) / kSplitKeys - first_key / kSplitKeys + 1 : 0;
}

}  // namespace ssd::kernels
