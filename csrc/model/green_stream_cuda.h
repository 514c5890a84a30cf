// A CUDA stream whose kernels run on a share of a GPU's SMs only: a stream of
// a CUDA green context (drivers of CUDA 12.5 and later), for the draft role
// of a model sharing the target's GPU (BackendOptions::draft_sm_share). The
// driver's entry points are looked up at run time
// (cudaGetDriverEntryPointByVersion), so the build does not link libcuda.
// Only built with SSD_WITH_CUDA.
#pragma once

#ifdef SSD_WITH_CUDA

#include <cuda_runtime.h>

namespace ssd::model {

struct GreenStream {
  cudaStream_t stream = nullptr;
  int sm_count = 0;         ///< SMs the stream's kernels may run on
  int device_sm_count = 0;  ///< SMs of the device
};

/// The stream of a green context holding about `share` (0 < share < 1) of
/// the SMs of CUDA device `device` (rounded up to the driver's partition
/// granularity), at stream priority `priority`. One per (device, share,
/// priority) for the process's life, shared by every model asking for it.
/// Throws std::invalid_argument naming draft_sm_share and the driver's
/// answer where the driver or the GPU cannot make it.
GreenStream green_stream(int device, double share, int priority);

}  // namespace ssd::model

#endif  // SSD_WITH_CUDA
