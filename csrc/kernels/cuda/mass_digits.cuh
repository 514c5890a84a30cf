// The digit step of the mass-weighted radix selects (verify's top-k / top-p
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

}  // namespace ssd::kernels::cuda
