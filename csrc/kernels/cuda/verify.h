// Lossless speculative verification on NVIDIA GPUs: the same contract as
// kernels/cpu/verify.h, which is its oracle.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../cpu/verify.h"

namespace ssd::kernels::cuda {

// Params are kernels::VerifyParams (kernels/cpu/verify.h) holding device pointers.

/// Scratch the launcher needs: one summary of the processed distribution per (row, position).
size_t verify_workspace_bytes(int64_t batch, int64_t k);

/// Enqueues verification of every row on `stream`. num_proposals outside
/// [0, K] is clamped and a proposal outside the vocabulary is rejected (the
/// CPU glue reports both as errors instead).
/// `workspace`: device scratch of verify_workspace_bytes(batch, k) bytes.
cudaError_t verify(const VerifyParams& params, void* workspace, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
