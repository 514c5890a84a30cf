// RMSNorm on NVIDIA GPUs: one block per row, bitwise the math of
// kernels/cpu/rms_norm.cpp. The CPU's sum of squares is kernels::dot (isa/vec.h):
// 16 lanes, lane l a sequential fused multiply-add chain over the elements
// i = l (mod 16) in index order (the masked tail adds exact zeros), then the
// pairwise tree l + 8, + 4, + 2, + 1. Here the row goes through shared memory
// a tile at a time and 16 threads run those chains; then mean_sq = sum / n,
// inv = 1 / sqrt(mean_sq + eps) and out = w * (x * inv), each correctly
// rounded (the _rn intrinsics, so no compiler flag can contract or
// approximate them).
#include "rms_norm.h"

#include <cuda_runtime.h>

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 16;    // kernels::kLanes
constexpr int kTile = 2048;   // a multiple of kLanes, so tile offsets keep lane order

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float tile[kTile];
  __shared__ float lanes[kLanes];
  __shared__ float s_inv;
  const float* x = p.x + static_cast<int64_t>(blockIdx.x) * p.ldx;
  float* out = p.out + static_cast<int64_t>(blockIdx.x) * p.ldo;
  float acc = 0.0f;  // lane threadIdx.x's chain (threads < kLanes)
  for (int64_t base = 0; base < p.n; base += kTile) {
    const int len = static_cast<int>(min(static_cast<int64_t>(kTile), p.n - base));
    for (int j = threadIdx.x; j < len; j += kThreads) tile[j] = x[base + j];
    __syncthreads();
    if (threadIdx.x < kLanes) {
#pragma unroll 8
      for (int j = threadIdx.x; j < len; j += kLanes) acc = __fmaf_rn(tile[j], tile[j], acc);
    }
    __syncthreads();
  }
  if (threadIdx.x < kLanes) lanes[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v[kLanes];
    for (int l = 0; l < kLanes; ++l) v[l] = lanes[l];
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) v[l] = __fadd_rn(v[l], v[l + w]);
    const float mean_sq = __fdiv_rn(v[0], static_cast<float>(p.n));
    s_inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_sq, p.eps)));
  }
  __syncthreads();
  const float inv = s_inv;
  for (int64_t i = threadIdx.x; i < p.n; i += kThreads) out[i] = __fmul_rn(p.weight[i], __fmul_rn(x[i], inv));
}

}  // namespace

cudaError_t rms_norm(const RmsNormParams& params, cudaStream_t stream) {
  if (params.rows <= 0) return cudaSuccess;
  if (params.rows > 0x7fffffff) return cudaErrorInvalidValue;
  rms_norm_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
