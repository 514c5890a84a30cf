// The digit steps of the mass-weighted radix selects (verify's top-k / top-p
// cuts, saguaro_sample's top-p cut): 4-bit digits of the float word, each
// digit's bin holding the mass of the bucket's tokens with that digit.
#pragma once

namespace ssd::kernels::cuda {

constexpr int kMassDigitBits = 4;
constexpr int kMassBins = 1 << kMassDigitBits;

/// Highest digit whose bin lets the running weight reach target; when
/// rounding leaves the target out of reach, the lowest non-empty digit (keep
/// the whole bucket). `above` is the weight ranking above the bins and is
/// advanced past the digits skipped. bins: [kMassBins].
__device__ inline int choose_digit(const double* bins, double& above, double target) {
  int lowest = 0;
  double above_lowest = above;
  for (int d = kMassBins - 1; d >= 0; --d) {
    if (!(bins[d] > 0.0)) continue;
    if (above + bins[d] >= target) return d;
    lowest = d;
    above_lowest = above;
    above += bins[d];
  }
  above = above_lowest;
  return lowest;
}

/// bins[d] = the block's sum of every thread's acc[d]: each warp's lanes by an
/// xor butterfly, then warps 0, 1, ... in order, so a fixed order for a fixed
/// block size. partial: shared memory of at least [warps][kMassBins]. All
/// threads of the block must call it.
__device__ inline void sum_digit_masses(double (&acc)[kMassBins], double (*partial)[kMassBins], int warps,
                                        double (&bins)[kMassBins]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 0; d < kMassBins; ++d)
    for (int offset = 16; offset > 0; offset >>= 1) acc[d] += __shfl_xor_sync(0xffffffffu, acc[d], offset);
  if (lane == 0)
    for (int d = 0; d < kMassBins; ++d) partial[warp][d] = acc[d];
  __syncthreads();
  for (int d = 0; d < kMassBins; ++d) {
    bins[d] = partial[0][d];
    for (int w = 1; w < warps; ++w) bins[d] += partial[w][d];
  }
  __syncthreads();
}

}  // namespace ssd::kernels::cuda
