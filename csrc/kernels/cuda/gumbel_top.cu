// The Gumbel top-d ranking on NVIDIA GPUs; kernels/cpu/gumbel.cpp is the
// oracle. One block per row. The scores p_t / E_t are positive doubles, whose
// bit patterns order like their values, so the radix select of rank_select.cuh
// runs on those 64 bits (every pass recomputes the scores, which costs
// arithmetic, not memory): it finds the d-th best score exactly. The tokens
// scoring at least that much (d of them, more only if scores tie at the cut,
// which needs two bitwise-equal doubles) are gathered into shared memory and
// sorted by (score desc, id asc), as the CPU's heap orders them.
// Tolerance against the CPU: the scores' logarithms (see gumbel_sample.cu),
// so a list may differ only where two scores lie within ~1e-16 (relative).
#include <cstdint>

#include "../cpu/gumbel.h"
#include "gumbel_top.h"
#include "rank_select.cuh"

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 256;
// Room for the list and any ties at its cut; a power of two for the sort.
constexpr int kCapacity = 1024;
static_assert(kGumbelTopMaxDepth <= kCapacity / 2, "the list must leave room for ties at its cut");

// (score bits desc, id asc): whether entry a goes before entry b.
__device__ __forceinline__ bool before(uint64_t key_a, int32_t id_a, uint64_t key_b, int32_t id_b) {
  return key_a > key_b || (key_a == key_b && id_a < id_b);
}

// Bitonic sort of kCapacity entries in shared memory, best first.
__device__ void sort_entries(uint64_t* keys, int32_t* ids) {
  for (int size = 2; size <= kCapacity; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < kCapacity; i += blockDim.x) {
        const int partner = i ^ stride;
        if (partner <= i) continue;
        const bool ascending = (i & size) == 0;  // "ascending" in the order `before`
        if (before(keys[partner], ids[partner], keys[i], ids[i]) == ascending) {
          const uint64_t k = keys[i];
          keys[i] = keys[partner];
          keys[partner] = k;
          const int32_t t = ids[i];
          ids[i] = ids[partner];
          ids[partner] = t;
        }
      }
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kThreads) gumbel_top_kernel(GumbelTopParams p) {
  __shared__ uint64_t keys[kCapacity];
  __shared__ int32_t ids[kCapacity];
  __shared__ int filled;
  const int64_t r = blockIdx.x;
  const float* probs = p.probs + r * p.vocab;
  const uint64_t row_key = gumbel_row_key(p.seeds[r], static_cast<uint64_t>(p.positions[r]));
  int64_t* out_ids = p.ids + r * p.depth;
  double* out_scores = p.scores + r * p.depth;

  int64_t own = 0;
  for (int64_t t = threadIdx.x; t < p.vocab; t += blockDim.x) own += probs[t] > 0.0f ? 1 : 0;
  const int64_t support = block_reduce(own, int64_t{0}, Sum{});
  const int64_t count = min(p.depth, support);
  for (int64_t i = count + threadIdx.x; i < p.depth; i += blockDim.x) {
    out_ids[i] = -1;
    out_scores[i] = 0.0;
  }
  if (count == 0) return;

  // A support token's key: its score's bits (the CPU's gumbel_exponential, compiled for the device).
  auto key_at = [probs, row_key](int64_t t, uint64_t& key) {
    const float prob = probs[t];
    if (!(prob > 0.0f)) return false;
    key = static_cast<uint64_t>(__double_as_longlong(static_cast<double>(prob) / gumbel_exponential(row_key, t)));
    return true;
  };
  const uint64_t cut = rank_threshold(p.vocab, count - 1, key_at);

  if (threadIdx.x == 0) filled = 0;
  for (int i = threadIdx.x; i < kCapacity; i += blockDim.x) {
    keys[i] = 0;  // below every score: positive doubles have nonzero bits
    ids[i] = INT32_MAX;
  }
  __syncthreads();
  for (int64_t t = threadIdx.x; t < p.vocab; t += blockDim.x) {
    uint64_t key;
    if (!key_at(t, key) || key < cut) continue;
    const int slot = atomicAdd(&filled, 1);
    if (slot < kCapacity) {  // more ties than room needs > 500 bitwise-equal scores
      keys[slot] = key;
      ids[slot] = static_cast<int32_t>(t);
    }
  }
  __syncthreads();
  sort_entries(keys, ids);
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    out_ids[i] = ids[i];
    out_scores[i] = __longlong_as_double(static_cast<long long>(keys[i]));
  }
}

}  // namespace

cudaError_t gumbel_top(const GumbelTopParams& params, cudaStream_t stream) {
  if (params.rows <= 0 || params.depth <= 0) return cudaSuccess;
  if (params.vocab >= (int64_t{1} << 31) || params.depth > kGumbelTopMaxDepth) return cudaErrorInvalidValue;
  gumbel_top_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
