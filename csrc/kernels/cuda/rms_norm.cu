// RMSNorm on NVIDIA GPUs: one block per row, the same math as
// kernels/cpu/rms_norm.cpp (mean of squares, then x * rsqrt(ms + eps) * w).
#include <cuda_runtime.h>

#include <cstdint>

namespace ssd::kernels::cuda {

struct RmsNormParams {
  const float* x = nullptr;
  const float* weight = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t ldx = 0;
  int64_t ldo = 0;
  float eps = 1e-6f;
};

namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(RmsNormParams p) {
  __shared__ float partial[kThreads];
  const float* x = p.x + blockIdx.x * p.ldx;
  float* out = p.out + blockIdx.x * p.ldo;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) acc = fmaf(x[i], x[i], acc);
  partial[threadIdx.x] = acc;
  __syncthreads();
  // Fixed-shape tree: the reduction order depends only on n, never on the batch.
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / static_cast<float>(p.n) + p.eps);
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) out[i] = p.weight[i] * (x[i] * inv);
}

}  // namespace

cudaError_t rms_norm(const RmsNormParams& params, cudaStream_t stream) {
  if (params.rows <= 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
