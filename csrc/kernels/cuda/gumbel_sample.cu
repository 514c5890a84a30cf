// Gumbel-max draws on NVIDIA GPUs; kernels/cpu/gumbel.cpp is the oracle. One
// block per row: every thread computes its tokens' noise with the CPU's own
// inline functions (gumbel.h, compiled for the device), scores p_t / E_t in
// double over the support, and the block takes the best score, then the
// lowest id holding it. Both reductions are exact (max, min), so the token
// never depends on scheduling. The full scan needs none of the CPU's
// pruning, which provably never changes the result.
// Tolerance against the CPU: CUDA's double log and glibc's are each within
// 1 ulp of the exact value (so up to 2 ulp apart): E_t can differ in its last
// bits, and the draw only where the two best scores lie within ~1e-16
// (relative) of each other.
#include <cstdint>

#include "../cpu/gumbel.h"
#include "gumbel_sample.h"
#include "rank_select.cuh"

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 512;
// p / E_t, E_t as the CPU's gumbel_exponential (the same inline function, compiled for the device).
__device__ double score(float p, uint64_t key, int64_t token) {
  return static_cast<double>(p) / gumbel_exponential(key, token);
}

__global__ void __launch_bounds__(kThreads) gumbel_sample_kernel(GumbelSampleParams p) {
  const int64_t r = blockIdx.x;
  const float* probs = p.probs + r * p.vocab;
  const uint64_t key = gumbel_row_key(p.seeds[r], static_cast<uint64_t>(p.positions[r]));
  // Scores of the support are > 0; -1 marks a thread (or row) without support.
  double best = -1.0;
  int64_t best_id = INT64_MAX;
  // A thread's ids rise, so a strict > keeps its lowest id among equal scores.
  for (int64_t t = threadIdx.x; t < p.vocab; t += blockDim.x) {
    const float prob = probs[t];
    if (!(prob > 0.0f)) continue;
    const double s = score(prob, key, t);
    if (s > best) {
      best = s;
      best_id = t;
    }
  }
  const double top = block_reduce(best, -1.0, Max{});
  const int64_t id = block_reduce(best == top ? best_id : INT64_MAX, INT64_MAX, Min{});
  if (threadIdx.x == 0) p.tokens[r] = top > 0.0 ? id : 0;
}

}  // namespace

cudaError_t gumbel_sample(const GumbelSampleParams& params, cudaStream_t stream) {
  if (params.rows <= 0) return cudaSuccess;
  if (params.vocab >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  gumbel_sample_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
