// The pair layout's product on AVX512-BF16 (vdpbf16ps), compiled once with
// the avx512 kernels' flags plus -mavx512bf16 and called only where the CPU
// has them (linear.cpp's linear_pairs).
#include <immintrin.h>

#include <algorithm>

#include "../linear.h"
#include "pairs_bf16.h"

namespace ssd::kernels::avx512_bf16 {

namespace {

constexpr int64_t kAheadBytes = 8192;  // software prefetch distance

// Up to kPairGroup rows against one 64-column panel: 4 column vectors, k pairs.
template <int64_t MR>
inline void panel_block(const uint32_t* xp, int64_t pairs, const uint16_t* panel, float* const* out,
                        const float* bias, int64_t cols) {
  __m512 acc[MR][4];
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_ps();
  const uint16_t* w = panel;
  for (int64_t p = 0; p < pairs; ++p, w += kPanelCols * 2) {
    for (int64_t l = 0; l < kPanelCols * 2; l += 32) __builtin_prefetch(w + kAheadBytes / 2 + l, 0, 2);
    __m512i wv[4];
    for (int64_t v = 0; v < 4; ++v) wv[v] = _mm512_loadu_si512(w + v * 32);
    for (int64_t i = 0; i < MR; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[i * pairs + p]));
      for (int64_t v = 0; v < 4; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], xb, (__m512bh)wv[v]);
    }
  }
  for (int64_t v = 0; v < 4; ++v) {
    const int64_t valid = std::clamp<int64_t>(cols - v * 16, 0, 16);
    if (valid == 0) break;
    const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + v * 16) : _mm512_setzero_ps();
    for (int64_t i = 0; i < MR; ++i) _mm512_mask_storeu_ps(out[i] + v * 16, mask, _mm512_add_ps(acc[i][v], b));
  }
}

}  // namespace

void pair_panel_rows(int64_t rows, const uint32_t* xp, int64_t pairs, const uint16_t* panel, float* const* out,
                     const float* bias, int64_t cols) {
  switch (rows) {
    case 1: panel_block<1>(xp, pairs, panel, out, bias, cols); break;
    case 2: panel_block<2>(xp, pairs, panel, out, bias, cols); break;
    case 3: panel_block<3>(xp, pairs, panel, out, bias, cols); break;
    case 4: panel_block<4>(xp, pairs, panel, out, bias, cols); break;
    case 5: panel_block<5>(xp, pairs, panel, out, bias, cols); break;
    default: panel_block<6>(xp, pairs, panel, out, bias, cols); break;
  }
}

}  // namespace ssd::kernels::avx512_bf16
