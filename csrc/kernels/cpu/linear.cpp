#include "linear.h"

#include <algorithm>

#include "vec.h"

namespace ssd::kernels {

namespace {

constexpr int64_t kNr = 4;  // weight rows per micro tile
constexpr int64_t kMr = 4;  // activation rows per micro tile
constexpr int64_t kPanel = 64;  // activation rows per cache panel

// MR x NR outputs; the per-element operation sequence is identical to dot().
template <int64_t MR, int64_t NR, typename WT>
inline void micro_tile(const float* x, int64_t ldx, const WT* w, int64_t k, float* out,
                       int64_t ldo) {
  Vec acc[MR][NR];
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < NR; ++j) acc[i][j] = vzero();
  int64_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    Vec wv[NR];
    for (int64_t j = 0; j < NR; ++j) wv[j] = vload(w + j * k + p);
    for (int64_t i = 0; i < MR; ++i) {
      Vec xv = vload(x + i * ldx + p);
      for (int64_t j = 0; j < NR; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  if (p < k) {
    const int64_t rest = k - p;
    Vec wv[NR];
    for (int64_t j = 0; j < NR; ++j) wv[j] = vload_tail(w + j * k + p, rest);
    for (int64_t i = 0; i < MR; ++i) {
      Vec xv = vload_tail(x + i * ldx + p, rest);
      for (int64_t j = 0; j < NR; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < NR; ++j) out[i * ldo + j] = vsum(acc[i][j]);
}

template <int64_t NR, typename WT>
void rows_block(const float* x, int64_t ldx, const WT* w, int64_t k, float* y, int64_t ldy,
                int64_t m) {
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr) micro_tile<kMr, NR>(x + i * ldx, ldx, w, k, y + i * ldy, ldy);
  switch (m - i) {
    case 3: micro_tile<3, NR>(x + i * ldx, ldx, w, k, y + i * ldy, ldy); break;
    case 2: micro_tile<2, NR>(x + i * ldx, ldx, w, k, y + i * ldy, ldy); break;
    case 1: micro_tile<1, NR>(x + i * ldx, ldx, w, k, y + i * ldy, ldy); break;
    default: break;
  }
}

}  // namespace

template <typename WT>
void linear(const float* x, int64_t ldx, const WT* w, const float* bias, float* y, int64_t ldy,
            int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  if (m <= 0 || n <= 0) return;
  // Weight rows are the parallel dimension: each thread streams its own slice
  // of the weights once, however many activation rows there are.
  pool.parallel_for(n, kNr, [&](int64_t n0, int64_t n1) {
    // Activation rows in panels that stay in cache while the weights stream by.
    for (int64_t i0 = 0; i0 < m; i0 += kPanel) {
      const int64_t mp = std::min(kPanel, m - i0);
      const float* xp = x + i0 * ldx;
      float* yp = y + i0 * ldy;
      int64_t j = n0;
      for (; j + kNr <= n1; j += kNr) rows_block<kNr>(xp, ldx, w + j * k, k, yp + j, ldy, mp);
      for (; j < n1; ++j) rows_block<1>(xp, ldx, w + j * k, k, yp + j, ldy, mp);
    }
    if (bias != nullptr)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = n0; c < n1; ++c) y[i * ldy + c] += bias[c];
  });
}

template void linear<float>(const float*, int64_t, const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t, ThreadPool&);
template void linear<uint16_t>(const float*, int64_t, const uint16_t*, const float*, float*,
                               int64_t, int64_t, int64_t, int64_t, ThreadPool&);

}  // namespace ssd::kernels
