// Fork selection on NVIDIA GPUs: one block per (sequence, position) row. The
// candidates come out in slices of up to kSlice ranks: a radix select finds
// the key that closes the slice, the slice's keys are gathered into shared
// memory and sorted there. Keys are unique (value, id) pairs, so the result is
// exactly the CPU's, ties included.
#include "fork_select.h"
#include "rank_select.cuh"

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSlice = 1024;

// Descending bitonic sort of n keys (n a power of two) in shared memory.
__device__ void sort_desc(uint64_t* keys, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int partner = i ^ stride;
        if (partner <= i) continue;
        const bool descending = (i & size) == 0;
        if ((keys[i] < keys[partner]) == descending) {
          const uint64_t t = keys[i];
          keys[i] = keys[partner];
          keys[partner] = t;
        }
      }
      __syncthreads();
    }
  }
}

// Writes ranks [first, last) of the row to out[first..last). `upper` is the
// threshold that closed the previous slice (ignored for the first).
template <typename KeyAt>
__device__ uint64_t write_slice(int64_t vocab, int64_t first, int64_t last, uint64_t upper,
                                KeyAt key_at, int64_t* out) {
  __shared__ uint64_t keys[kSlice];
  __shared__ int filled;
  const uint64_t lower = rank_threshold(vocab, last - 1, key_at);
  const int n = static_cast<int>(last - first);
  int padded = 1;
  while (padded < n) padded <<= 1;
  if (threadIdx.x == 0) filled = 0;
  // Zero ranks below every real key: its low word ~id is never 0 for id < 2^31.
  for (int i = threadIdx.x; i < padded; i += blockDim.x) keys[i] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    uint64_t key;
    if (key_at(i, key) && key >= lower && (first == 0 || key < upper)) keys[atomicAdd(&filled, 1)] = key;
  }
  __syncthreads();
  sort_desc(keys, padded);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[first + i] = id_of_key(keys[i]);
  __syncthreads();
  return lower;
}

__global__ void __launch_bounds__(kThreads) fork_select_kernel(ForkSelectParams p) {
  const int64_t row = blockIdx.x;
  const int64_t b = row / p.positions;
  const int64_t j = row % p.positions;
  const int64_t k = p.positions - 1;
  const float* probs = p.probs + row * p.vocab;
  const int64_t excluded = j < k ? p.drafted[b * k + j] : -1;
  const int64_t count = min(p.fanout[j], p.vocab - (excluded >= 0 ? 1 : 0));
  int64_t* out = p.candidates + row * p.max_fanout;
  for (int64_t i = count + threadIdx.x; i < p.max_fanout; i += blockDim.x) out[i] = -1;
  if (threadIdx.x == 0) p.counts[row] = count;
  auto key_at = [probs, excluded](int64_t i, uint64_t& key) {
    key = rank_key(probs[i], i);
    return i != excluded;
  };
  uint64_t upper = 0;
  for (int64_t first = 0; first < count; first += kSlice)
    upper = write_slice(p.vocab, first, min(count, first + kSlice), upper, key_at, out);
}

}  // namespace

cudaError_t fork_select(const ForkSelectParams& params, cudaStream_t stream) {
  const int64_t rows = params.batch * params.positions;
  if (rows <= 0) return cudaSuccess;
  if (params.vocab >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  fork_select_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
