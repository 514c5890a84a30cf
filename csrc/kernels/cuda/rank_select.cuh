// Device helpers for ranking a row by (value desc, token id asc), shared by
// saguaro_sample.cu and fork_select.cu. Every reduction has a fixed shape, so
// a row's result never depends on scheduling.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// Unsigned bits ordered like the float value; -0 and +0 map alike, as they
/// compare equal on the CPU. NaN (either sign) maps to 0, below -inf (0x007fffff):
/// the CPU's ranking scans (argmax, the fork-select and top-F heaps) never let
/// a NaN displace a number, so a NaN ranks below every number here.
__device__ __forceinline__ uint32_t float_key(float f) {
  if (f != f) return 0u;
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// The float of a float_key (0, the NaN key, gives a NaN).
__device__ __forceinline__ float key_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
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
/// select, high digit to low, stopping as soon as the rest of the current
/// bucket is wholly selected: integer counts only, so exact.
/// The digits are 12, 10, 10 bits over the float word, then 8-bit digits
/// over the id word. Logits' float keys share their sign and high exponent
/// bits, so an 8-bit first digit (sign + 7 exponent bits) sent nearly the
/// whole row to one or two bins (serialised shared atomics, and a pass that
/// narrows nothing); 12 bits reach 3 mantissa bits, so the first pass already
/// splits a row into unit-wide (at |z| in [8, 16)) value bins. The digit is
/// picked by a parallel suffix scan over the bins.
/// blockDim.x must be a multiple of 32.
template <typename KeyAt>
__device__ uint64_t rank_threshold(int64_t n, int64_t rank, KeyAt key_at) {
  constexpr int kMaxBins = 1 << 12;
  __shared__ uint32_t hist[kMaxBins];
  __shared__ uint32_t warp_total[32];
  __shared__ uint64_t s_prefix;
  __shared__ int64_t s_rank;
  __shared__ bool s_done;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5);
  uint64_t prefix = 0;
  int high = 64;  // key bits at and above `high` are fixed to prefix's
  for (int pass = 0; high > 0; ++pass) {
    const int bits = pass == 0 ? 12 : pass < 3 ? 10 : 8;
    const int shift = high - bits;
    const int bins = 1 << bits;
    const uint64_t fixed = high == 64 ? 0 : ~0ull << high;
    for (int d = threadIdx.x; d < bins; d += blockDim.x) hist[d] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      uint64_t key;
      if (key_at(i, key) && (key & fixed) == prefix)
        atomicAdd(&hist[static_cast<uint32_t>(key >> shift) & static_cast<uint32_t>(bins - 1)], 1u);
    }
    __syncthreads();
    // Thread t owns bins [lo, hi); `above` counts the bucket's keys in bins >= hi.
    const int per = (bins + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
    const int lo = min(bins, static_cast<int>(threadIdx.x) * per);
    const int hi = min(bins, lo + per);
    uint32_t own = 0;
    for (int d = lo; d < hi; ++d) own += hist[d];
    uint32_t suffix = own;  // over lanes >= lane of this warp
    for (int offset = 1; offset < 32; offset <<= 1) {
      const uint32_t up = __shfl_down_sync(0xffffffffu, suffix, offset);
      if (lane + offset < 32) suffix += up;
    }
    if (lane == 0) warp_total[warp] = suffix;
    __syncthreads();
    int64_t above = suffix - own;
    for (int w = warp + 1; w < warps; ++w) above += warp_total[w];
    if (above <= rank && rank < above + own) {
      for (int d = hi - 1; d >= lo; --d) {
        if (rank < above + hist[d]) {
          const int64_t left = rank - above;
          s_prefix = prefix | (static_cast<uint64_t>(d) << shift);
          s_rank = left;
          s_done = left + 1 == hist[d];
          break;
        }
        above += hist[d];
      }
    }
    __syncthreads();
    prefix = s_prefix;
    rank = s_rank;
    const bool done = s_done;
    __syncthreads();
    if (done) break;
    high = shift;
  }
  return prefix;
}

}  // namespace ssd::kernels::cuda
