// Host launcher of the CUDA saguaro_sample: the law of kernels/cpu/saguaro_sample.h
// on device pointers (same params struct, every pointer on the GPU).
#pragma once

#include <cuda_runtime.h>

#include "../cpu/saguaro_sample.h"

namespace ssd::kernels::cuda {

using SaguaroSampleParams = kernels::SaguaroSampleParams;

/// One block per row. vocab must be below 2^31. Returns the launch error.
cudaError_t saguaro_sample(const SaguaroSampleParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
