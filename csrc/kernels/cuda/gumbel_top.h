// Host launcher of the CUDA gumbel_top: the ranking of kernels/cpu/gumbel.h on
// device pointers (same params struct, every pointer on the GPU).
#pragma once

#include <cuda_runtime.h>

#include "../cpu/gumbel.h"

namespace ssd::kernels::cuda {

using GumbelTopParams = kernels::GumbelTopParams;

/// The most a row's list may hold (the tree ranks at most a few dozen).
inline constexpr int64_t kGumbelTopMaxDepth = 512;

/// One block per row. vocab must be below 2^31 and depth at most
/// kGumbelTopMaxDepth. Returns the launch error.
cudaError_t gumbel_top(const GumbelTopParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
