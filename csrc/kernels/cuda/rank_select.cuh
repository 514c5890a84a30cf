// Device helpers for ranking a row by (value desc, token id asc), shared by
// saguaro_sample.cu and fork_select.cu. Every reduction has a fixed shape, so
// a row's result never depends on scheduling.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// Unsigned bits ordered like the float value; -0 and +0 map alike, as they
/// compare equal on the CPU.
__device__ __forceinline__ uint32_t float_key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// One unique key per token: larger key = ranks higher under (value desc, id
/// asc). The low word holds ~id, so ids must be below 2^32.
__device__ __forceinline__ uint64_t rank_key(float value, int64_t id) {
  return (static_cast<uint64_t>(float_key(value)) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

__device__ __forceinline__ int64_t id_of_key(uint64_t key) {
  return static_cast<int64_t>(~static_cast<uint32_t>(key));
}

/// Threshold selecting {key >= threshold}: the token of id `id` at float key
/// `value`, together with every token ranking above it.
__device__ __forceinline__ uint64_t cut_key(uint32_t value, int64_t id) {
  return (static_cast<uint64_t>(value) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

/// Reduces one value per thread and hands every thread the result. blockDim.x
/// must be a multiple of 32. The tree is fixed by blockDim alone.
template <typename T, typename Op>
__device__ T block_reduce(T v, T identity, Op op) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : identity;
    v = warp_reduce(v, op);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  const T result = partial[0];
  __syncthreads();
  return result;
}

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

/// A threshold t such that exactly rank + 1 eligible keys of the row are >= t
/// (rank 0 = the best). key_at(i, key) sets token i's key and returns whether
/// it is eligible; rank must be below the number of eligible tokens. Radix
/// select over 8-bit digits, high to low, stopping as soon as the rest of
/// the current bucket is wholly selected: integer counts only, so exact.
template <typename KeyAt>
__device__ uint64_t rank_threshold(int64_t n, int64_t rank, KeyAt key_at) {
  __shared__ uint32_t hist[256];
  __shared__ uint64_t s_prefix;
  __shared__ int64_t s_rank;
  __shared__ bool s_done;
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
    __syncthreads();
    const uint64_t fixed = shift == 56 ? 0 : ~0ull << (shift + 8);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      uint64_t key;
      if (key_at(i, key) && (key & fixed) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t left = rank;
      int d = 255;
      for (; d > 0 && left >= hist[d]; --d) left -= hist[d];
      s_prefix = prefix | (static_cast<uint64_t>(d) << shift);
      s_rank = left;
      s_done = left + 1 == hist[d];
    }
    __syncthreads();
    prefix = s_prefix;
    rank = s_rank;
    const bool done = s_done;
    __syncthreads();
    if (done) break;
  }
  return prefix;
}

}  // namespace ssd::kernels::cuda
