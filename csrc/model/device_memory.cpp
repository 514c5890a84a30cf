#include "device_memory.h"

#include <ATen/Context.h>
#include <unistd.h>

#include "backend.h"

#ifdef SSD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace ssd::model {

int cuda_device_count() { return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0; }

DeviceMemory device_memory(const std::string& device) {
  const std::string canonical = canonical_device(device);
  if (canonical == "cpu") {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const int64_t bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
    return {bytes, bytes};
  }
  const int index = std::stoi(canonical.substr(canonical.find(':') + 1));
  if (index >= cuda_device_count()) return {};
#ifdef SSD_WITH_CUDA
  // Blocks torch's allocator caches but no tensor uses count as used in the
  // driver's figure; released first, they count as free.
  c10::cuda::CUDACachingAllocator::emptyCache();
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the caller reports unknown memory
    return {};
  }
  return {static_cast<int64_t>(free), static_cast<int64_t>(total)};
#else
  return {};
#endif
}

}  // namespace ssd::model
