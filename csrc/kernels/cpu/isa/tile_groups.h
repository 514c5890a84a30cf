// The loop every packed product shares: weight tiles (4 output columns each)
// split between the threads, activation rows in panels kept in cache, and
// each panel cut into balanced groups of at most max_group rows; the bias is
// added last. Each output is computed by one group call, whatever m or the
// thread count, so the products' batch invariance is the group kernels'.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../linear.h"
#include "isa_namespace.h"

namespace ssd::kernels::SSD_ISA {

constexpr int64_t kPanelRows = 64;  // activation rows kept in cache per pass

/// run_group(i, rows, t, cols): rows i .. i + rows - 1 against tile t, whose
/// first `cols` (<= 4) columns exist, into y.
template <typename RunGroup>
void for_each_group(int64_t m, int64_t n, int64_t max_group, const float* bias, float* y, int64_t ldy,
                    ThreadPool& pool, RunGroup run_group) {
  if (m <= 0 || n <= 0) return;
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  // Tiles are the parallel dimension: each thread streams its own contiguous
  // slice of the weights once per panel of activation rows.
  pool.parallel_for(tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t i0 = 0; i0 < m; i0 += kPanelRows) {
      const int64_t i1 = std::min(m, i0 + kPanelRows);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t cols = std::min(kTileRows, n - t * kTileRows);
        for (int64_t i = i0; i < i1;) {
          const int64_t left = i1 - i;
          // Balanced groups of up to max_group rows (8 -> 4 + 4, 11 -> 6 + 5 for 6).
          const int64_t rows = left <= max_group ? left : left <= 2 * max_group ? (left + 1) / 2 : max_group;
          run_group(i, rows, t, cols);
          i += rows;
        }
      }
    }
    if (bias != nullptr)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = t0 * kTileRows; c < std::min(n, t1 * kTileRows); ++c) y[i * ldy + c] += bias[c];
  });
}

}  // namespace ssd::kernels::SSD_ISA
