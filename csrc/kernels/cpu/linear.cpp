#include "linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "vec.h"

namespace ssd::kernels {

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kTileChunk = kTileRows * kLanes;  // elements per k-chunk of a tile
constexpr int64_t kMaxGroup = 6;                    // activation rows per register block
constexpr int64_t kPanelRows = 64;                  // activation rows kept in cache per pass
constexpr int64_t kAheadBytes = 8192;               // software prefetch distance

// Up to kMaxGroup activation rows against the 4 rows of one packed tile;
// writes `cols` (<= 4) outputs per row. Per output the operation sequence is
// dot()'s: fused multiply-adds over 16-lane chunks in index order, the tail
// chunk with zero lanes, then vsum.
template <int64_t MR, typename WT>
inline void tile_block(const float* x, int64_t ldx, const WT* tile, int64_t k, float* out,
                       int64_t ldo, int64_t cols) {
  Vec acc[MR][kTileRows];
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < kTileRows; ++j) acc[i][j] = vzero();
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(WT));
  constexpr int64_t kAhead = kAheadBytes / static_cast<int64_t>(sizeof(WT));
  const int64_t full = k / kLanes;
  const WT* w = tile;
  for (int64_t c = 0; c < full; ++c, w += kTileChunk) {
    // One activation row is bound by memory latency: pull the stream into L1.
    // With more rows the loop is busier and L2 is close enough.
    for (int64_t l = 0; l < kTileChunk; l += kLine) __builtin_prefetch(w + kAhead + l, 0, MR == 1 ? 3 : 2);
    // From 3 rows the block is bound by multiply-adds, not memory: operands
    // stay in registers (vpin) so that each is loaded once per chunk.
    Vec wv[kTileRows];
    for (int64_t j = 0; j < kTileRows; ++j) {
      wv[j] = vload(w + j * kLanes);
      if constexpr (MR >= 3) vpin(wv[j]);
    }
    for (int64_t i = 0; i < MR; ++i) {
      Vec xv = vload(x + i * ldx + c * kLanes);
      if constexpr (MR >= 3) vpin(xv);
      for (int64_t j = 0; j < kTileRows; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  if (const int64_t rest = k - full * kLanes; rest > 0) {
    Vec wv[kTileRows];  // padded lanes are zero, as vload_tail would give
    for (int64_t j = 0; j < kTileRows; ++j) wv[j] = vload(w + j * kLanes);
    for (int64_t i = 0; i < MR; ++i) {
      const Vec xv = vload_tail(x + i * ldx + full * kLanes, rest);
      for (int64_t j = 0; j < kTileRows; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * ldo + j] = vsum(acc[i][j]);
}

template <typename WT>
void group_block(int64_t rows, const float* x, int64_t ldx, const WT* tile, int64_t k, float* out,
                 int64_t ldo, int64_t cols) {
  switch (rows) {
    case 1: tile_block<1>(x, ldx, tile, k, out, ldo, cols); break;
    case 2: tile_block<2>(x, ldx, tile, k, out, ldo, cols); break;
    case 3: tile_block<3>(x, ldx, tile, k, out, ldo, cols); break;
    case 4: tile_block<4>(x, ldx, tile, k, out, ldo, cols); break;
    case 5: tile_block<5>(x, ldx, tile, k, out, ldo, cols); break;
    default: tile_block<6>(x, ldx, tile, k, out, ldo, cols); break;
  }
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float as_float(float v) { return v; }
inline float as_float(uint16_t v) { return bf16_to_float(v); }

}  // namespace

int64_t packed_size(int64_t n, int64_t k) { return ceil_div(n, kTileRows) * ceil_div(k, kLanes) * kTileChunk; }

template <typename WT>
void pack(const WT* w, int64_t n, int64_t k, WT* out) {
  std::fill(out, out + packed_size(n, k), WT{});
  const int64_t chunks = ceil_div(k, kLanes);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t len = std::min(kLanes, k - c * kLanes);
      std::copy(w + r * k + c * kLanes, w + r * k + c * kLanes + len,
                out + ((r / kTileRows) * chunks + c) * kTileChunk + (r % kTileRows) * kLanes);
    }
}

template <typename WT>
void linear(const float* x, int64_t ldx, const WT* wp, const float* bias, float* y, int64_t ldy,
            int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  if (m <= 0 || n <= 0) return;
  const int64_t tiles = ceil_div(n, kTileRows);
  const int64_t tile_elems = ceil_div(k, kLanes) * kTileChunk;
  // Tiles are the parallel dimension: each thread streams its own contiguous
  // slice of the weights once per panel of activation rows.
  pool.parallel_for(tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t i0 = 0; i0 < m; i0 += kPanelRows) {
      const int64_t i1 = std::min(m, i0 + kPanelRows);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t cols = std::min(kTileRows, n - t * kTileRows);
        for (int64_t i = i0; i < i1;) {
          const int64_t left = i1 - i;
          // Balanced groups of up to kMaxGroup rows (8 -> 4 + 4, 11 -> 6 + 5).
          const int64_t rows = left <= kMaxGroup ? left : left <= 2 * kMaxGroup ? (left + 1) / 2 : kMaxGroup;
          group_block(rows, x + i * ldx, ldx, wp + t * tile_elems, k, y + i * ldy + t * kTileRows, ldy, cols);
          i += rows;
        }
      }
    }
    if (bias != nullptr)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = t0 * kTileRows; c < std::min(n, t1 * kTileRows); ++c) y[i * ldy + c] += bias[c];
  });
}

int64_t pair_packed_size(int64_t n, int64_t k) { return ceil_div(n, kPanelCols) * ceil_div(k, 2) * kPanelCols * 2; }

template <typename WT>
void pack_pairs(const WT* wp, int64_t n, int64_t k, uint16_t* out) {
  const int64_t pairs = ceil_div(k, 2), chunks = ceil_div(k, kLanes);
  std::fill(out, out + pair_packed_size(n, k), uint16_t{0});
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* dst = out + (r / kPanelCols) * pairs * kPanelCols * 2 + (r % kPanelCols) * 2;
    for (int64_t c = 0; c < chunks; ++c) {
      const WT* src = wp + ((r / kTileRows) * chunks + c) * kTileChunk + (r % kTileRows) * kLanes;
      for (int64_t l = 0; l < std::min(kLanes, k - c * kLanes); ++l) {
        const int64_t col = c * kLanes + l;
        dst[(col / 2) * kPanelCols * 2 + col % 2] = float_to_bf16(as_float(src[l]));
      }
    }
  }
}

#if defined(__AVX512BF16__) && SSD_AVX512
bool pairs_native() { return true; }

namespace {

// Up to kMaxGroup rows against one 64-column panel: 4 column vectors, k pairs.
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
    const __mmask16 mask = tail_mask(valid);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + v * 16) : _mm512_setzero_ps();
    for (int64_t i = 0; i < MR; ++i) _mm512_mask_storeu_ps(out[i] + v * 16, mask, _mm512_add_ps(acc[i][v], b));
  }
}

void panel_rows(int64_t rows, const uint32_t* xp, int64_t pairs, const uint16_t* panel, float* const* out,
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

}  // namespace
#else
bool pairs_native() { return false; }

namespace {

// Emulates vdpbf16ps lane by lane: acc + x0 * w0 + x1 * w1 in fp32.
void panel_rows(int64_t rows, const uint32_t* xp, int64_t pairs, const uint16_t* panel, float* const* out,
                const float* bias, int64_t cols) {
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
#endif

void linear_pairs(const float* x, int64_t ldx, const uint16_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  if (m <= 0 || n <= 0) return;
  const int64_t pairs = ceil_div(k, 2);
  // Activations as bf16 pairs, the low half holding the even column.
  std::vector<uint32_t> xp(static_cast<size_t>(m * pairs), 0u);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c)
      xp[i * pairs + c / 2] |= static_cast<uint32_t>(float_to_bf16(x[i * ldx + c])) << (16 * (c % 2));
  const int64_t panels = ceil_div(n, kPanelCols);
  pool.parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    float* out[kMaxGroup];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t cols = std::min(kPanelCols, n - p * kPanelCols);
      const float* b = bias ? bias + p * kPanelCols : nullptr;
      for (int64_t i = 0; i < m;) {
        const int64_t rows = std::min(kMaxGroup, m - i);
        for (int64_t r = 0; r < rows; ++r) out[r] = y + (i + r) * ldy + p * kPanelCols;
        panel_rows(rows, xp.data() + i * pairs, pairs, wp + p * pairs * kPanelCols * 2, out, b, cols);
        i += rows;
      }
    }
  });
}

template void pack<float>(const float*, int64_t, int64_t, float*);
template void pack<uint16_t>(const uint16_t*, int64_t, int64_t, uint16_t*);
template void linear<float>(const float*, int64_t, const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t, ThreadPool&);
template void linear<uint16_t>(const float*, int64_t, const uint16_t*, const float*, float*,
                               int64_t, int64_t, int64_t, int64_t, ThreadPool&);
template void pack_pairs<float>(const float*, int64_t, int64_t, uint16_t*);
template void pack_pairs<uint16_t>(const uint16_t*, int64_t, int64_t, uint16_t*);

}  // namespace ssd::kernels
