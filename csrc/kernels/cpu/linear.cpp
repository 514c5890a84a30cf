#include "linear.h"

#include <algorithm>
#include <vector>

#include "bf16.h"
#include "isa.h"
#if defined(SSD_X86_ISAS)
#include "isa/pairs_bf16.h"
#endif

namespace ssd::kernels {

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kTileChunk = kTileRows * kTileLanes;  // elements per k-chunk of a tile
constexpr int64_t kPairGroup = 6;                       // activation rows per pair_panel_rows call

inline float as_float(float v) { return v; }
inline float as_float(uint16_t v) { return bf16_to_float(v); }

// Emulates vdpbf16ps lane by lane: acc + x0 * w0 + x1 * w1 in fp32.
void emulated_pair_panel_rows(int64_t rows, const uint32_t* xp, int64_t pairs, const uint16_t* panel,
                              float* const* out, const float* bias, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      float acc = 0.0f;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint32_t xv = xp[i * pairs + p];
        const uint16_t* w = panel + p * kPanelCols * 2 + c * 2;
        acc += bf16_to_float(static_cast<uint16_t>(xv & 0xffffu)) * bf16_to_float(w[0]) +
               bf16_to_float(static_cast<uint16_t>(xv >> 16)) * bf16_to_float(w[1]);
      }
      out[i][c] = acc + (bias ? bias[c] : 0.0f);
    }
}

}  // namespace

int64_t packed_size(int64_t n, int64_t k) { return ceil_div(n, kTileRows) * ceil_div(k, kTileLanes) * kTileChunk; }

template <typename WT>
void pack(const WT* w, int64_t n, int64_t k, WT* out) {
  std::fill(out, out + packed_size(n, k), WT{});
  const int64_t chunks = ceil_div(k, kTileLanes);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t len = std::min(kTileLanes, k - c * kTileLanes);
      std::copy(w + r * k + c * kTileLanes, w + r * k + c * kTileLanes + len,
                out + ((r / kTileRows) * chunks + c) * kTileChunk + (r % kTileRows) * kTileLanes);
    }
}

template <typename WT>
void linear(const float* x, int64_t ldx, const WT* wp, const float* bias, float* y, int64_t ldy, int64_t m,
            int64_t n, int64_t k, ThreadPool& pool) {
  SSD_ON_ACTIVE_ISA(linear<WT>(x, ldx, wp, bias, y, ldy, m, n, k, pool))
}

int64_t pair_packed_size(int64_t n, int64_t k) { return ceil_div(n, kPanelCols) * ceil_div(k, 2) * kPanelCols * 2; }

template <typename WT>
void pack_pairs(const WT* wp, int64_t n, int64_t k, uint16_t* out) {
  const int64_t pairs = ceil_div(k, 2), chunks = ceil_div(k, kTileLanes);
  std::fill(out, out + pair_packed_size(n, k), uint16_t{0});
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* dst = out + (r / kPanelCols) * pairs * kPanelCols * 2 + (r % kPanelCols) * 2;
    for (int64_t c = 0; c < chunks; ++c) {
      const WT* src = wp + ((r / kTileRows) * chunks + c) * kTileChunk + (r % kTileRows) * kTileLanes;
      for (int64_t l = 0; l < std::min(kTileLanes, k - c * kTileLanes); ++l) {
        const int64_t col = c * kTileLanes + l;
        dst[(col / 2) * kPanelCols * 2 + col % 2] = float_to_bf16(as_float(src[l]));
      }
    }
  }
}

bool pairs_native() { return cpu_has_avx512_bf16(); }

void linear_pairs(const float* x, int64_t ldx, const uint16_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  if (m <= 0 || n <= 0) return;
  auto panel_rows = &emulated_pair_panel_rows;
#if defined(SSD_X86_ISAS)
  if (pairs_native()) panel_rows = &avx512_bf16::pair_panel_rows;
#endif
  const int64_t pairs = ceil_div(k, 2);
  // Activations as bf16 pairs, the low half holding the even column.
  std::vector<uint32_t> xp(static_cast<size_t>(m * pairs), 0u);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c)
      xp[i * pairs + c / 2] |= static_cast<uint32_t>(float_to_bf16(x[i * ldx + c])) << (16 * (c % 2));
  const int64_t panels = ceil_div(n, kPanelCols);
  pool.parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    float* out[kPairGroup];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t cols = std::min(kPanelCols, n - p * kPanelCols);
      const float* b = bias ? bias + p * kPanelCols : nullptr;
      for (int64_t i = 0; i < m;) {
        const int64_t rows = std::min(kPairGroup, m - i);
        for (int64_t r = 0; r < rows; ++r) out[r] = y + (i + r) * ldy + p * kPanelCols;
        panel_rows(rows, xp.data() + i * pairs, pairs, wp + p * pairs * kPanelCols * 2, out, b, cols);
        i += rows;
      }
    }
  });
}

template void pack<float>(const float*, int64_t, int64_t, float*);
template void pack<uint16_t>(const uint16_t*, int64_t, int64_t, uint16_t*);
template void pack<Fp16>(const Fp16*, int64_t, int64_t, Fp16*);
template void linear<float>(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t,
                            int64_t, ThreadPool&);
template void linear<uint16_t>(const float*, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t,
                               int64_t, int64_t, ThreadPool&);
template void linear<Fp16>(const float*, int64_t, const Fp16*, const float*, float*, int64_t, int64_t, int64_t,
                           int64_t, ThreadPool&);
template void pack_pairs<float>(const float*, int64_t, int64_t, uint16_t*);
template void pack_pairs<uint16_t>(const uint16_t*, int64_t, int64_t, uint16_t*);

}  // namespace ssd::kernels
