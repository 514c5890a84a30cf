// Batch-invariant matrix product: one warp per output column and a group of R
// rows. Lane j owns the k-elements [256 i + 8 j, 256 i + 8 j + 8) of every
// sweep i (then, past the last whole sweep, elements j, j + 32, ...) and adds
// them in that order with explicit fmaf; the 32 partial sums meet in a fixed
// xor tree. The order of every y[r, c] thus depends on k alone: R (picked by
// m, so a decode step reads the weights once) only sets how many rows share a
// weight load. Weights stream once per group of R rows (up to 32: 128
// registers, no spills on sm_90; 64 rows take 255 and spill), so a prefill of
// m rows re-reads them m / 32 times; a product tiled through shared memory is
// still to come.
#include <cuda_runtime.h>

#include <cstdint>

#include "linear.h"

namespace ssd::kernels::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 8;  // k-elements per lane per sweep: one 16-byte bf16 load
constexpr int kSweep = 32 * kChunk;

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

template <bool kBf16>
__device__ __forceinline__ void load_chunk(const void* weight, int64_t offset, float (&w)[kChunk]) {
  if constexpr (kBf16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(weight) + offset);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = bf16_bits_to_float(words[i] & 0xffffu);
      w[2 * i + 1] = bf16_bits_to_float(words[i] >> 16);
    }
  } else {
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(weight) + offset);
    const float4 a = src[0], b = src[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
  }
}

template <bool kBf16>
__device__ __forceinline__ float load_one(const void* weight, int64_t offset) {
  if constexpr (kBf16) return bf16_bits_to_float(static_cast<const uint16_t*>(weight)[offset]);
  else return static_cast<const float*>(weight)[offset];
}

template <int R, bool kBf16>
__global__ void __launch_bounds__(kThreads) linear_kernel(LinearParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * R;
  if (col >= p.n) return;
  const int64_t left = p.m - row0;
  const int rows = left < R ? static_cast<int>(left) : R;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int64_t w_row = col * p.k;
  const int64_t full = (p.k % kChunk == 0) ? p.k / kSweep * kSweep : 0;
#pragma unroll 2
  for (int64_t base = lane * kChunk; base < full; base += kSweep) {
    float w[kChunk];
    load_chunk<kBf16>(p.weight, w_row + base, w);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows) {
        const float4* xr = reinterpret_cast<const float4*>(p.x + (row0 + r) * p.ldx + base);
        const float4 a = xr[0], b = xr[1];
        const float xs[kChunk] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < kChunk; ++j) acc[r] = fmaf(w[j], xs[j], acc[r]);
      }
    }
  }
  for (int64_t i = full + lane; i < p.k; i += 32) {
    const float w = load_one<kBf16>(p.weight, w_row + i);
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < rows) acc[r] = fmaf(w, p.x[(row0 + r) * p.ldx + i], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {  // a compile-time bound keeps acc[] in registers
      if (r < rows) p.y[(row0 + r) * p.ldy + col] = p.bias != nullptr ? acc[r] + p.bias[col] : acc[r];
    }
  }
}

template <int R>
cudaError_t launch(const LinearParams& p, cudaStream_t stream) {
  const int64_t groups = (p.m + R - 1) / R;
  if (groups > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.n + kWarps - 1) / kWarps), static_cast<unsigned>(groups));
  if (p.weight_bf16)
    linear_kernel<R, true><<<grid, kThreads, 0, stream>>>(p);
  else
    linear_kernel<R, false><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

cudaError_t linear(const LinearParams& p, cudaStream_t stream) {
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.ldx < p.k || p.ldy < p.n) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (p.n > static_cast<int64_t>(kWarps) * 0x7fffffff) return cudaErrorInvalidValue;
  if (p.k % kChunk == 0 && (!aligned16(p.x) || !aligned16(p.weight) || p.ldx % 4 != 0))
    return cudaErrorInvalidValue;
  if (p.m == 1) return launch<1>(p, stream);
  if (p.m <= 2) return launch<2>(p, stream);
  if (p.m <= 4) return launch<4>(p, stream);
  if (p.m <= 8) return launch<8>(p, stream);
  if (p.m <= 16) return launch<16>(p, stream);
  return launch<32>(p, stream);
}

}  // namespace ssd::kernels::cuda
