// CUDA RMSNorm: the launcher of kernels/cuda/rms_norm.cu. Plain C++ (no
// torch), includable from host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// All pointers are device pointers. Layout as kernels::rms_norm
/// (kernels/cpu/ops.h): x [rows, ldx] and out [rows, ldo] with n used per row,
/// weight [n]. out may be x itself (ldo == ldx), as the q/k norms use it.
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

/// Enqueues out = weight * (x * (1 / sqrt(mean(x^2) + eps))) per row on
/// `stream`; the results are bitwise those of kernels::rms_norm. Returns the
/// launch error.
cudaError_t rms_norm(const RmsNormParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
