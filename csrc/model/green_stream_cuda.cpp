#include "green_stream_cuda.h"

#ifdef SSD_WITH_CUDA

#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace ssd::model {

namespace {

std::invalid_argument refused(const std::string& why) {
  return std::invalid_argument("draft_sm_share: " + why);
}

// The driver function `name` in the version of the headers this file was
// built with (their struct layouts are what it passes; cuGreenCtxStreamCreate
// first came with CUDA 12.5).
template <typename Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess || fn == nullptr)
    throw refused(std::string("this CUDA driver has no ") + name + " of CUDA " + std::to_string(CUDA_VERSION) +
                  " (green contexts need a driver of CUDA 12.5 or later; this build's headers are " +
                  std::to_string(CUDA_VERSION) + "'s)");
  return reinterpret_cast<Fn>(fn);
}

// The backend orders its role streams with the caller's through events made
// in the primary context: refused here, not wrong later, where the driver
// will not record one on the green context's stream or make it wait.
void check_events(cudaStream_t green) {
  cudaEvent_t e = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(e, green);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(green, e, 0);
  if (err == cudaSuccess) err = cudaEventSynchronize(e);
  if (e != nullptr) (void)cudaEventDestroy(e);
  if (err != cudaSuccess)
    throw refused(std::string("events between the green context's stream and the device's fail here: ") +
                  cudaGetErrorString(err));
}

void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) throw refused(std::string(call) + " failed (CUresult " + std::to_string(r) + ")");
}

GreenStream make(int device, double share, int priority) {
  const auto get_device = driver_entry<CUresult (*)(CUdevice*, int)>("cuDeviceGet");
  const auto get_resource =
      driver_entry<CUresult (*)(CUdevice, CUdevResource*, CUdevResourceType)>("cuDeviceGetDevResource");
  const auto split = driver_entry<CUresult (*)(CUdevResource*, unsigned*, const CUdevResource*, CUdevResource*,
                                               unsigned, unsigned)>("cuDevSmResourceSplitByCount");
  const auto describe =
      driver_entry<CUresult (*)(CUdevResourceDesc*, CUdevResource*, unsigned)>("cuDevResourceGenerateDesc");
  const auto create = driver_entry<CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned)>("cuGreenCtxCreate");
  const auto stream_create = driver_entry<CUresult (*)(CUstream*, CUgreenCtx, unsigned, int)>("cuGreenCtxStreamCreate");
  // The primary context is active (the backend made its tensors there) before a green one is made.
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess)
    throw refused("CUDA device " + std::to_string(device) + " cannot be made current");
  CUdevice dev;
  check(get_device(&dev, device), "cuDeviceGet");
  CUdevResource all{};
  check(get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  const unsigned total = all.sm.smCount;
  // The driver rounds a partition up to a multiple of smCoscheduledAlignment:
  // the count it will make is checked, not the one asked for.
  const unsigned align = std::max(1u, all.sm.smCoscheduledAlignment);
  const unsigned asked = std::max(all.sm.minSmPartitionSize, static_cast<unsigned>(std::ceil(share * total)));
  const unsigned want = (asked + align - 1) / align * align;
  if (want >= total)
    throw refused(std::to_string(share) + " of " + std::to_string(total) + " SMs leaves the target none of its own " +
                  "(the least partition is " + std::to_string(all.sm.minSmPartitionSize) + " SMs, and partitions come in " +
                  "multiples of " + std::to_string(align) + ")");
  CUdevResource part{}, rest{};
  unsigned groups = 1;
  check(split(&part, &groups, &all, &rest, 0, want), "cuDevSmResourceSplitByCount");
  if (groups < 1) throw refused("the driver made no partition of " + std::to_string(want) + " SMs");
  CUdevResourceDesc desc;
  check(describe(&desc, &part, 1), "cuDevResourceGenerateDesc");
  CUgreenCtx ctx;
  check(create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
  CUstream stream;
  check(stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, priority), "cuGreenCtxStreamCreate");
  check_events(stream);
  return {stream, static_cast<int>(part.sm.smCount), static_cast<int>(total)};
}

}  // namespace

GreenStream green_stream(int device, double share, int priority) {
  if (!(share > 0 && share < 1)) throw refused("must be in (0, 1), got " + std::to_string(share));
  static std::mutex mutex;
  static std::map<std::tuple<int, double, int>, GreenStream> made;  // kept for the process's life
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, share, priority);
  auto it = made.find(key);
  if (it == made.end()) it = made.emplace(key, make(device, share, priority)).first;
  return it->second;
}

}  // namespace ssd::model

#endif  // SSD_WITH_CUDA
