// The 64-bit mixer (splitmix64's finalizer) every keyed random stream is
// hashed with: keyed_uniform's draws and the Gumbel-max coupling's noise.
#pragma once

#include <cstdint>

// nvcc compiles mix64 and gumbel.h's noise for the device as well
// (kernels/cuda/gumbel_sample.cu), so the GPU hashes with these very
// functions rather than copies of them.
#ifdef __CUDACC__
#define SSD_HOST_DEVICE __host__ __device__
#else
#define SSD_HOST_DEVICE
#endif

namespace ssd::kernels {

SSD_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace ssd::kernels
