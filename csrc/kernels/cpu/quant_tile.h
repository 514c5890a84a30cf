// One 32-weight sub-block of a packed quantized tile (quant.h's layout), read
// and written as plain integers and scales: the packing, the row lookup and
// the portable product use these; the vector paths read the same bytes with
// their own instructions.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant.h"

namespace ssd::kernels {

/// fn(std::integral_constant<QuantType, T>{}) for the tile format T == tile
/// (one of the six; any other: nothing): the products' one dispatch from a
/// run-time format to their per-format code.
template <typename Fn>
inline void on_tile_type(QuantType tile, Fn&& fn) {
  using T = QuantType;
  switch (tile) {
    case T::q8_0: return fn(std::integral_constant<T, T::q8_0>{});
    case T::q4_0: return fn(std::integral_constant<T, T::q4_0>{});
    case T::q4_1: return fn(std::integral_constant<T, T::q4_1>{});
    case T::q5_0: return fn(std::integral_constant<T, T::q5_0>{});
    case T::q5_1: return fn(std::integral_constant<T, T::q5_1>{});
    case T::q6_k: return fn(std::integral_constant<T, T::q6_k>{});
    default: return;
  }
}

/// A sub-block: q (unsigned but for q8_0), and d, m per half of 16 weights.
struct QuantSub {
  int32_t q[kQuantBlock];
  float d[2];
  float m[2];
};

inline float quant_f32_at(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

/// 16 nibble bytes (q_t low, q_{t+16} high; GGUF's and the tiles' order) -> q.
inline void quant_read_nibbles(const uint8_t* qs, QuantSub& s) {
  for (int64_t t = 0; t < 16; ++t) {
    s.q[t] = qs[t] & 0x0f;
    s.q[t + 16] = qs[t] >> 4;
  }
}

/// The 5th bits, bit t of a little-endian uint32 for q_t (GGUF's q5_0 / q5_1
/// and the q5 tiles), added to q.
inline void quant_read_high_bits(const uint8_t* qh, QuantSub& s) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  for (int64_t t = 0; t < kQuantBlock; ++t) s.q[t] |= static_cast<int32_t>((bits >> t) & 1u) << 4;
}

/// Weight t of a sub-block as the products use it: d q (q8_0) or fma(q, d, m).
inline float quant_value(QuantType tile, const QuantSub& s, int64_t t) {
  const int64_t h = t / 16;
  if (tile == QuantType::q8_0) return s.d[h] * static_cast<float>(s.q[t]);
  return __builtin_fmaf(static_cast<float>(s.q[t]), s.d[h], s.m[h]);
}

/// Row j (0..3) of one packed tile block of format `tile` -> its sub-block.
inline void quant_tile_read(QuantType tile, const uint8_t* block, int64_t j, QuantSub& s) {
  const uint8_t* q = block + quant_tile_quants(tile) + j * quant_row_quant_bytes(tile);
  const uint8_t* high = block + quant_tile_high(tile) + j * quant_row_high_bytes(tile);
  if (tile == QuantType::q8_0) {
    for (int64_t t = 0; t < kQuantBlock; ++t) s.q[t] = static_cast<int8_t>(q[t]);
  } else {
    quant_read_nibbles(q, s);
  }
  if (tile == QuantType::q5_0 || tile == QuantType::q5_1) {
    quant_read_high_bits(high, s);
  } else if (tile == QuantType::q6_k) {
    for (int64_t t = 0; t < kQuantBlock; ++t) s.q[t] |= ((high[t % 8] >> (2 * (t / 8))) & 3) << 4;
  }
  if (tile == QuantType::q6_k) {
    for (int64_t h = 0; h < 2; ++h) {
      s.d[h] = quant_f32_at(block + 8 * j + 4 * h);
      s.m[h] = -32.0f * s.d[h];
    }
  } else {
    s.d[0] = s.d[1] = quant_f32_at(block + 4 * j);
    s.m[0] = s.m[1] = quant_tile_has_m(tile)            ? quant_f32_at(block + 16 + 4 * j)
                      : tile == QuantType::q4_0 ? -8.0f * s.d[0]
                      : tile == QuantType::q5_0 ? -16.0f * s.d[0]
                                                : 0.0f;
  }
}

/// A sub-block -> row j of one packed tile block of format `tile` (the
/// inverse of quant_tile_read; the m of q4_0, q5_0 and q6_k is not stored).
inline void quant_tile_write(QuantType tile, const QuantSub& s, uint8_t* block, int64_t j) {
  uint8_t* q = block + quant_tile_quants(tile) + j * quant_row_quant_bytes(tile);
  uint8_t* high = block + quant_tile_high(tile) + j * quant_row_high_bytes(tile);
  if (tile == QuantType::q6_k) {
    std::memcpy(block + 8 * j, &s.d[0], 4);
    std::memcpy(block + 8 * j + 4, &s.d[1], 4);
  } else {
    std::memcpy(block + 4 * j, &s.d[0], 4);
    if (quant_tile_has_m(tile)) std::memcpy(block + 16 + 4 * j, &s.m[0], 4);
  }
  if (tile == QuantType::q8_0) {
    for (int64_t t = 0; t < kQuantBlock; ++t) q[t] = static_cast<uint8_t>(static_cast<int8_t>(s.q[t]));
    return;
  }
  for (int64_t t = 0; t < 16; ++t) q[t] = static_cast<uint8_t>((s.q[t] & 0x0f) | ((s.q[t + 16] & 0x0f) << 4));
  if (tile == QuantType::q5_0 || tile == QuantType::q5_1) {
    uint32_t bits = 0;
    for (int64_t t = 0; t < kQuantBlock; ++t) bits |= static_cast<uint32_t>((s.q[t] >> 4) & 1) << t;
    std::memcpy(high, &bits, 4);
  } else if (tile == QuantType::q6_k) {
    for (int64_t i = 0; i < 8; ++i) {
      uint8_t byte = 0;
      for (int64_t p = 0; p < 4; ++p) byte = static_cast<uint8_t>(byte | (((s.q[i + 8 * p] >> 4) & 3) << (2 * p)));
      high[i] = byte;
    }
  }
}

}  // namespace ssd::kernels
