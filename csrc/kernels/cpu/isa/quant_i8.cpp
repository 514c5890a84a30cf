// The quantized product with int8 activations (quant.h), compiled once per
// instruction set: 256-bit integer code (AVX2's maddubs; the AVX-512 build
// compiles the same code with 32 registers) or portable C++. The arithmetic
// per output is quant.h's definition on every path.
#include <cstring>

#include "../isa.h"
#include "../quant_tile.h"
#include "tile_groups.h"
#include "vec.h"

namespace ssd::kernels::SSD_ISA {

namespace {

constexpr int64_t kI8Lanes = 8;
constexpr int64_t kAheadBytes = 8192;  // software prefetch distance
// Activation rows per group: their accumulators (4 tile rows x 8 lanes each)
// stay in registers (16 ymm on AVX2, 32 with AVX-512).
constexpr int64_t kMaxGroupI8 = SSD_ISA_LEVEL == 2 ? 4 : 2;

// The integer offset taken off each quant (q - offset; 0: none, or an m).
template <QuantType Type>
constexpr int kOffset = Type == QuantType::q4_0 ? 8 : Type == QuantType::q5_0 ? 16 : Type == QuantType::q6_k ? 32 : 0;
// Whether the tile's m multiplies sx (q4_1, q5_1 tiles).
template <QuantType Type>
constexpr bool kHasMin = quant_tile_has_m(Type);

template <QuantType Type>
inline const uint8_t* row_quants(const uint8_t* block, int64_t j) {
  return block + quant_tile_quants(Type) + j * quant_row_quant_bytes(Type);
}
template <QuantType Type>
inline const uint8_t* row_high(const uint8_t* block, int64_t j) {
  return block + quant_tile_high(Type) + j * quant_row_high_bytes(Type);
}

#if SSD_ISA_LEVEL >= 1
using Acc = __m256;
using Scale = __m256;  // d_w(l) dx per lane
inline Acc acc_zero() { return _mm256_setzero_ps(); }
inline Scale block_scale(float first, float second) {
  return _mm256_set_m128(_mm_set1_ps(second), _mm_set1_ps(first));
}
// vec.h's vsum tree from its 8-lane stage: l + 4, then l + 2, then l + 1.
inline float acc_sum(Acc a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// One block's 32 weights of one tile row as maddubs takes them: unsigned
// magnitudes, and (q8_0) the signs to move onto the activations.
struct BlockWeights {
  __m256i magnitude, sign;
};

template <QuantType Type>
inline BlockWeights block_weights(const uint8_t* block, int64_t j) {
  const uint8_t* quants = row_quants<Type>(block, j);
  if constexpr (Type == QuantType::q8_0) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants));
    return {_mm256_sign_epi8(w, w), w};
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
    const __m128i low = _mm_set1_epi8(0x0f);
    // Weights 0..15 (low nibbles) then 16..31 (high nibbles): natural order,
    // unsigned (offsets come off the sums, offset_sums).
    __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
    if constexpr (Type == QuantType::q5_0 || Type == QuantType::q5_1) {
      // byte t gets bit t of the uint32: byte t / 8 of it, masked by bit t % 8
      int32_t bits;
      std::memcpy(&bits, row_high<Type>(block, j), 4);
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                     0x0101010101010101, 0x0000000000000000));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    } else if constexpr (Type == QuantType::q6_k) {
      // 64-bit lane p holds weights 8p .. 8p + 7: byte i's bit pair p, moved to bits 4-5
      int64_t pairs;
      std::memcpy(&pairs, row_high<Type>(block, j), 8);
      const __m256i spread = _mm256_srlv_epi64(_mm256_set1_epi64x(pairs), _mm256_set_epi64x(6, 4, 2, 0));
      w = _mm256_or_si256(w, _mm256_and_si256(_mm256_slli_epi64(spread, 4), _mm256_set1_epi8(0x30)));
    }
    return {w, w};
  }
}

// offset * (the sum of lanes 4l .. 4l + 3 of the activations), per int32
// lane: sum (q - o) x = sum q x - o sum x, exact in integers. Once per row
// and block, shared by the tile's 4 rows.
template <int Offset>
inline __m256i offset_sums(const int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(Offset), xv), _mm256_set1_epi16(1));
}

// acc_l = fma(float(s_l), scale_l, acc_l), s_l the int32 sum of lanes 4l .. 4l + 3's products.
template <QuantType Type>
inline Acc block_fma(const BlockWeights& w, const int8_t* x, __m256i offset, Scale scale, Acc acc) {
  __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  if constexpr (Type == QuantType::q8_0) xv = _mm256_sign_epi8(xv, w.sign);
  __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(w.magnitude, xv), _mm256_set1_epi16(1));
  if constexpr (kOffset<Type> != 0) sums = _mm256_sub_epi32(sums, offset);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
}
#else
struct Acc {
  float v[kI8Lanes];
};
struct Scale {
  float first, second;  // lanes 0..3, 4..7
};
inline Acc acc_zero() { return Acc{}; }
inline Scale block_scale(float first, float second) { return {first, second}; }
inline float acc_sum(Acc a) {
  for (int64_t w = kI8Lanes / 2; w > 0; w /= 2)
    for (int64_t i = 0; i < w; ++i) a.v[i] = a.v[i] + a.v[i + w];
  return a.v[0];
}

struct BlockWeights {
  int32_t w[kQuantBlock];
};

template <QuantType Type>
inline BlockWeights block_weights(const uint8_t* block, int64_t j) {
  QuantSub sub;
  quant_tile_read(Type, block, j, sub);
  BlockWeights b;
  for (int64_t t = 0; t < kQuantBlock; ++t) b.w[t] = sub.q[t] - kOffset<Type>;
  return b;
}

template <int Offset>
inline int offset_sums(const int8_t*) { return 0; }  // the weights carry the offset here

template <QuantType Type>
inline Acc block_fma(const BlockWeights& w, const int8_t* x, int, Scale scale, Acc acc) {
  for (int64_t l = 0; l < kI8Lanes; ++l) {
    int32_t s = 0;
    for (int64_t j = 4 * l; j < 4 * l + 4; ++j) s += w.w[j] * x[j];
    acc.v[l] = __builtin_fmaf(static_cast<float>(s), l < kI8Lanes / 2 ? scale.first : scale.second, acc.v[l]);
  }
  return acc;
}
#endif

// Up to kMaxGroupI8 quantized activation rows against the 4 rows of one tile.
template <QuantType Type, int64_t MR>
void tile_block_i8(const QuantizedRows& x, int64_t i0, const uint8_t* tile, float* out, int64_t ldo, int64_t cols) {
  constexpr int64_t kBlockBytes = quant_tile_block_bytes(Type);
  const int64_t blocks = x.k / kQuantBlock;
  Acc acc[MR][kTileRows];
  float ms[MR][kTileRows] = {};
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < kTileRows; ++j) acc[i][j] = acc_zero();
  const uint8_t* block = tile;
  for (int64_t b = 0; b < blocks; ++b, block += kBlockBytes) {
    for (int64_t l = 0; l < kBlockBytes; l += 64) __builtin_prefetch(block + kAheadBytes + l, 0, MR == 1 ? 3 : 2);
    decltype(offset_sums<kOffset<Type>>(nullptr)) offset[MR] = {};
    if constexpr (kOffset<Type> != 0)
      for (int64_t i = 0; i < MR; ++i) offset[i] = offset_sums<kOffset<Type>>(x.q + (i0 + i) * x.k + b * kQuantBlock);
    for (int64_t j = 0; j < kTileRows; ++j) {
      const BlockWeights w = block_weights<Type>(block, j);
      const bool halves = Type == QuantType::q6_k;
      const float d0 = quant_f32_at(block + (halves ? 8 : 4) * j);
      const float d1 = halves ? quant_f32_at(block + 8 * j + 4) : d0;
      for (int64_t i = 0; i < MR; ++i) {
        const int64_t row = i0 + i;
        const float dx = x.dx[row * blocks + b];
        acc[i][j] = block_fma<Type>(w, x.q + row * x.k + b * kQuantBlock, offset[i], block_scale(d0 * dx, d1 * dx),
                                    acc[i][j]);
        if constexpr (kHasMin<Type>)
          ms[i][j] = __builtin_fmaf(quant_f32_at(block + 16 + 4 * j), x.sx[row * blocks + b], ms[i][j]);
      }
    }
  }
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float y = acc_sum(acc[i][j]);
      if constexpr (kHasMin<Type>) y = y + ms[i][j];
      out[i * ldo + j] = y;
    }
}

template <QuantType Type>
void product_i8(const QuantizedRows& x, const uint8_t* wp, const float* bias, float* y, int64_t ldy, int64_t m,
                int64_t n, ThreadPool& pool) {
  const int64_t tile_bytes = x.k / kQuantBlock * quant_tile_block_bytes(Type);
  for_each_group(m, n, kMaxGroupI8, bias, y, ldy, pool, [&](int64_t i, int64_t rows, int64_t t, int64_t cols) {
    const uint8_t* tile = wp + t * tile_bytes;
    float* out = y + i * ldy + t * kTileRows;
    switch (rows) {
      case 1: return tile_block_i8<Type, 1>(x, i, tile, out, ldy, cols);
      case 2: return tile_block_i8<Type, std::min<int64_t>(2, kMaxGroupI8)>(x, i, tile, out, ldy, cols);
      case 3: return tile_block_i8<Type, std::min<int64_t>(3, kMaxGroupI8)>(x, i, tile, out, ldy, cols);
      default: return tile_block_i8<Type, kMaxGroupI8>(x, i, tile, out, ldy, cols);
    }
  });
}

}  // namespace

void linear_quant_i8(QuantType type, const QuantizedRows& x, const uint8_t* wp, const float* bias, float* y,
                     int64_t ldy, int64_t m, int64_t n, ThreadPool& pool) {
  on_tile_type(type, [&](auto t) { product_i8<decltype(t)::value>(x, wp, bias, y, ldy, m, n, pool); });
}

}  // namespace ssd::kernels::SSD_ISA
