// Host launcher of the CUDA gumbel_sample: the draw of kernels/cpu/gumbel.h on
// device pointers (same params struct, every pointer on the GPU).
#pragma once

#include <cuda_runtime.h>

#include "../cpu/gumbel.h"

namespace ssd::kernels::cuda {

using GumbelSampleParams = kernels::GumbelSampleParams;

/// One block per row. vocab must be below 2^31. Returns the launch error.
cudaError_t gumbel_sample(const GumbelSampleParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
