// This machine's devices as the placement and KV budget checks see them
// (EngineConfig::validate / resolve): how many GPUs, and a device's memory.
#pragma once

#include <string>

#include "ssd/config.h"

namespace ssd::model {

/// CUDA devices this torch build sees on this machine (0 without CUDA).
int cuda_device_count();

/// Free and total bytes of `device` ("cpu" or "cuda:N", N < cuda_device_count()):
/// "cpu" is the physical memory (free = total); "cuda:N" what the driver
/// reports free after releasing torch's cached, unused blocks. {0, 0} when
/// unknown (a build without CUDA cannot read a GPU's memory).
DeviceMemory device_memory(const std::string& device);

}  // namespace ssd::model
