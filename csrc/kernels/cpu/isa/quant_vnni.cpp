// The quantized product with int8 activations (quant.h) on AVX-512 VNNI:
// 512-bit registers holding two tile rows' blocks side by side, and vpdpbusd
// for the integer sums. The arithmetic per output is quant.h's definition,
// so the bits are those of every other path: each 256-bit half is one tile
// row's 8 lanes, s_l is the same exact int32 sum (vpdpbusd adds the four
// products of lane l to its accumulator as maddubs + madd do, without their
// 16-bit intermediate), and d_w * dx, the fma per lane and the final tree
// are the same fp32 operations in the same order.
//
// Compiled once, with the AVX-512 flags and -mavx512vnni (CMakeLists.txt);
// quant.cpp runs it for the avx512_vnni choice (isa.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "../isa.h"
#include "../quant_tile.h"
#include "tile_groups.h"

namespace ssd::kernels::avx512_vnni {

namespace {

constexpr int64_t kAheadBytes = 8192;  // software prefetch distance, as quant_i8.cpp's
// Activation rows per group: 2 accumulators each (the tile's 4 rows, two per
// register), and the unpacked weights shared by the group.
constexpr int64_t kMaxGroup = 8;

template <QuantType Type>
constexpr int kOffset = Type == QuantType::q4_0 ? 8 : Type == QuantType::q5_0 ? 16 : Type == QuantType::q6_k ? 32 : 0;

// Tile rows 2p and 2p + 1 of one block, as vpdpbusd takes them: unsigned
// magnitudes in natural order (row 2p in bytes 0..31, row 2p + 1 in 32..63),
// and for q8_0 the lanes whose weight is negative (their activations are
// negated instead).
struct PairWeights {
  __m512i magnitude;
  __mmask64 negative;
};

template <QuantType Type>
inline PairWeights pair_weights(const uint8_t* block, int64_t p) {
  const uint8_t* quants = block + quant_tile_quants(Type) + 2 * p * quant_row_quant_bytes(Type);
  if constexpr (Type == QuantType::q8_0) {
    const __m512i w = _mm512_loadu_si512(quants);
    return {_mm512_abs_epi8(w), _mm512_movepi8_mask(w)};
  } else {
    // [row a's 16 nibble bytes, row b's] -> 128-bit lanes a, a, b, b; the
    // second of each pair shifted down 4: a's weights 0..15 then 16..31, then b's.
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants));
    const __m512i spread = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                                    _mm512_castsi256_si512(packed));
    __m512i w = _mm512_and_si512(_mm512_srlv_epi64(spread, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)),
                                 _mm512_set1_epi8(0x0f));
    const uint8_t* high = block + quant_tile_high(Type) + 2 * p * quant_row_high_bytes(Type);
    if constexpr (Type == QuantType::q5_0 || Type == QuantType::q5_1) {
      // Row a's uint32 then row b's: bit i of the pair's 64 is byte i's 5th bit.
      uint64_t bits;
      std::memcpy(&bits, high, 8);
      w = _mm512_mask_add_epi8(w, bits, w, _mm512_set1_epi8(0x10));  // bit 4 is clear: add is or
    } else if constexpr (Type == QuantType::q6_k) {
      // 64-bit lane 4r + g holds weights 8g .. 8g + 7 of row r of the pair:
      // bit pair g of each of that row's 8 bytes, moved to bits 4-5.
      const __m512i pairs = _mm512_permutexvar_epi64(_mm512_set_epi64(1, 1, 1, 1, 0, 0, 0, 0),
                                                     _mm512_castsi128_si512(_mm_loadu_si128(
                                                         reinterpret_cast<const __m128i*>(high))));
      const __m512i shifted = _mm512_srlv_epi64(pairs, _mm512_set_epi64(6, 4, 2, 0, 6, 4, 2, 0));
      w = _mm512_or_si512(w, _mm512_and_si512(_mm512_slli_epi64(shifted, 4), _mm512_set1_epi8(0x30)));
    }
    return {w, 0};
  }
}

// The block's d per lane of both register pairs: pair p's lanes 0..7 take
// row 2p's d, lanes 8..15 row 2p + 1's (q6_k: the d of each half, per 4 lanes).
template <QuantType Type>
inline void pair_scales(const uint8_t* block, __m512 d[2]) {
  if constexpr (Type == QuantType::q6_k) {
    for (int64_t p = 0; p < 2; ++p) {
      const __m512 four = _mm512_castps128_ps512(_mm_loadu_ps(reinterpret_cast<const float*>(block + 16 * p)));
      d[p] = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), four);
    }
  } else {
    const __m512 four = _mm512_castps128_ps512(_mm_loadu_ps(reinterpret_cast<const float*>(block)));
    d[0] = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), four);
    d[1] = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2), four);
  }
}

// quant_i8.cpp's acc_sum on one 256-bit half: l + 4, then l + 2, then l + 1.
inline float half_sum(__m256 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// MR quantized activation rows against the 4 rows of one tile.
template <QuantType Type, int64_t MR>
void tile_rows(const QuantizedRows& x, int64_t i0, const uint8_t* tile, float* out, int64_t ldo, int64_t cols) {
  constexpr int64_t kBlockBytes = quant_tile_block_bytes(Type);
  constexpr bool kHasMin = quant_tile_has_m(Type);
  const int64_t blocks = x.k / kQuantBlock;
  __m512 acc[MR][2];
  __m128 ms[MR];
  for (int64_t i = 0; i < MR; ++i) {
    acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    ms[i] = _mm_setzero_ps();
  }
  const uint8_t* block = tile;
  for (int64_t b = 0; b < blocks; ++b, block += kBlockBytes) {
    for (int64_t l = 0; l < kBlockBytes; l += 64) __builtin_prefetch(block + kAheadBytes + l, 0, MR == 1 ? 3 : 2);
    const PairWeights w[2] = {pair_weights<Type>(block, 0), pair_weights<Type>(block, 1)};
    __m512 d[2];
    pair_scales<Type>(block, d);
    for (int64_t i = 0; i < MR; ++i) {
      const int64_t row = i0 + i;
      const int8_t* xq = x.q + row * x.k + b * kQuantBlock;
      const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
      // The sums start at -offset * (the lane's activation sum): sum (q - o) x.
      __m512i start = _mm512_setzero_si512();
      if constexpr (kOffset<Type> != 0)
        start = _mm512_sub_epi32(start, _mm512_dpbusd_epi32(start, _mm512_set1_epi8(kOffset<Type>), xv));
      const __m512 dx = _mm512_set1_ps(x.dx[row * blocks + b]);
      for (int64_t p = 0; p < 2; ++p) {
        __m512i xs = xv;
        if constexpr (Type == QuantType::q8_0) xs = _mm512_mask_sub_epi8(xv, w[p].negative, _mm512_setzero_si512(), xv);
        const __m512i s = _mm512_dpbusd_epi32(start, w[p].magnitude, xs);
        acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d[p], dx), acc[i][p]);
      }
      if constexpr (kHasMin)
        ms[i] = _mm_fmadd_ps(_mm_loadu_ps(reinterpret_cast<const float*>(block + 16)),
                             _mm_set1_ps(x.sx[row * blocks + b]), ms[i]);
    }
  }
  for (int64_t i = 0; i < MR; ++i) {
    float m[4];
    _mm_storeu_ps(m, ms[i]);
    for (int64_t j = 0; j < cols; ++j) {
      const __m512 a = acc[i][j / 2];
      float y = half_sum(j % 2 == 0 ? _mm512_castps512_ps256(a) : _mm512_extractf32x8_ps(a, 1));
      if constexpr (kHasMin) y = y + m[j];
      out[i * ldo + j] = y;
    }
  }
}

template <QuantType Type, int64_t... MR>
void tile_group(int64_t rows, const QuantizedRows& x, int64_t i, const uint8_t* tile, float* out, int64_t ldo,
                int64_t cols, std::integer_sequence<int64_t, MR...>) {
  // rows is 1 .. kMaxGroup: one instantiation per size.
  ((rows == MR + 1 ? tile_rows<Type, MR + 1>(x, i, tile, out, ldo, cols) : void()), ...);
}

template <QuantType Type>
void product(const QuantizedRows& x, const uint8_t* wp, const float* bias, float* y, int64_t ldy, int64_t m,
             int64_t n, ThreadPool& pool) {
  const int64_t tile_bytes = x.k / kQuantBlock * quant_tile_block_bytes(Type);
  avx512::for_each_group(m, n, kMaxGroup, bias, y, ldy, pool, [&](int64_t i, int64_t rows, int64_t t, int64_t cols) {
    tile_group<Type>(rows, x, i, wp + t * tile_bytes, y + i * ldy + t * kTileRows, ldy, cols,
                     std::make_integer_sequence<int64_t, kMaxGroup>{});
  });
}

}  // namespace

void linear_quant_i8(QuantType type, const QuantizedRows& x, const uint8_t* wp, const float* bias, float* y,
                     int64_t ldy, int64_t m, int64_t n, ThreadPool& pool) {
  on_tile_type(type, [&](auto t) { product<decltype(t)::value>(x, wp, bias, y, ldy, m, n, pool); });
}

}  // namespace ssd::kernels::avx512_vnni
