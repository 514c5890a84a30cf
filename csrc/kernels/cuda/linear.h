// CUDA matrix product of the model forward: the launcher of
// kernels/cuda/linear.cu. Plain C++ (no torch), includable from host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// y[m, n] = x[m, k] @ weight[n, k]^T + bias[n], fp32 accumulation. All
/// pointers are device pointers; weight is row-major contiguous, fp32 or bf16
/// (weight_bf16); bias may be null. Batch-invariant: y[r, c] is reduced over k
/// in one order that depends on k alone, never on m or on the other rows, so a
/// row's result is bitwise the same alone, in a batch or in a prefill chunk.
struct LinearParams {
  const float* x = nullptr;
  int64_t ldx = 0;
  const void* weight = nullptr;
  bool weight_bf16 = false;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
};

/// Enqueues the kernel on `stream`; cudaErrorInvalidValue for bad shapes or,
/// when k % 8 == 0 (the vectorized path), pointers or strides not aligned to
/// 16 bytes; else the launch error.
cudaError_t linear(const LinearParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
