// Host launcher of the CUDA fork_select: the selection of kernels/cpu/fork_select.h
// on device pointers (same params struct, every pointer on the GPU).
#pragma once

#include <cuda_runtime.h>

#include "../cpu/fork_select.h"

namespace ssd::kernels::cuda {

using ForkSelectParams = kernels::ForkSelectParams;

/// One block per (sequence, position) row. vocab must be below 2^31.
cudaError_t fork_select(const ForkSelectParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
