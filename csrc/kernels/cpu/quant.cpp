#include "quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "fp16.h"
#include "isa.h"
#include "quant_tile.h"

namespace ssd::kernels {

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr QuantType kTypes[] = {QuantType::q8_0, QuantType::q4_0, QuantType::q4_1, QuantType::q5_0,
                                QuantType::q5_1, QuantType::q4_k, QuantType::q5_k, QuantType::q6_k};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return fp16_to_float(h);
}

void check_type(QuantType type) {
  if (type == QuantType::none || static_cast<int>(type) > static_cast<int>(QuantType::q6_k))
    throw std::invalid_argument("quantized matrix: no block format given");
}

// q4_k / q5_k: the 6-bit scale and min of sub-block s (0..7) from the 12
// packed bytes (ggml's get_scale_min_k4).
void k_scale_min(const uint8_t* scales, int64_t s, int& sc, int& mn) {
  if (s < 4) {
    sc = scales[s] & 63;
    mn = scales[s + 4] & 63;
  } else {
    sc = (scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4);
    mn = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

void same_halves(float d, float m, QuantSub& out) {
  out.d[0] = out.d[1] = d;
  out.m[0] = out.m[1] = m;
}

// Sub-block b (weights 32 b .. 32 b + 31) of a GGUF row of `type`, as
// quant.h's (q, d, m): gguf's dequantisation is quant_value of it.
void gguf_sub(QuantType type, const uint8_t* row, int64_t b, QuantSub& out) {
  const uint8_t* block = row + (b * kQuantBlock / gguf_block_weights(type)) * gguf_block_bytes(type);
  const int64_t s = b % 8;  // sub-block within a k-quant block of 256
  switch (type) {
    case QuantType::q8_0:
      for (int64_t t = 0; t < kQuantBlock; ++t) out.q[t] = static_cast<int8_t>(block[2 + t]);
      return same_halves(half_at(block), 0.0f, out);
    case QuantType::q4_0: quant_read_nibbles(block + 2, out); return same_halves(half_at(block), -8.0f * half_at(block), out);
    case QuantType::q4_1: quant_read_nibbles(block + 4, out); return same_halves(half_at(block), half_at(block + 2), out);
    case QuantType::q5_0:
      quant_read_nibbles(block + 6, out);
      quant_read_high_bits(block + 2, out);
      return same_halves(half_at(block), -16.0f * half_at(block), out);
    case QuantType::q5_1:
      quant_read_nibbles(block + 8, out);
      quant_read_high_bits(block + 4, out);
      return same_halves(half_at(block), half_at(block + 2), out);
    case QuantType::q4_k:
    case QuantType::q5_k: {
      // d, dmin, scales[12], (q5_k: qh[32]), qs[128]: sub-blocks 2c and 2c + 1
      // are the low and high nibbles of qs[32 c .. 32 c + 31]; q5_k's 5th bit
      // of weight t of sub-block s is bit s of qh[t].
      const uint8_t* qs = block + (type == QuantType::q4_k ? 16 : 48) + 32 * (s / 2);
      for (int64_t t = 0; t < kQuantBlock; ++t) out.q[t] = (s % 2 ? qs[t] >> 4 : qs[t] & 0x0f);
      if (type == QuantType::q5_k)
        for (int64_t t = 0; t < kQuantBlock; ++t) out.q[t] |= ((block[16 + t] >> s) & 1) << 4;
      int sc, mn;
      k_scale_min(block + 4, s, sc, mn);
      return same_halves(half_at(block) * static_cast<float>(sc), -(half_at(block + 2) * static_cast<float>(mn)), out);
    }
    case QuantType::q6_k: {
      // ql[128], qh[64], int8 scales[16], d: in each half of 128 weights, the
      // 4 sub-blocks of 32 are ql's low nibbles at 0 and 32, then its high
      // nibbles there; their bits 4-5 are qh's bit pairs 0, 1, 2, 3.
      const int64_t half = s / 4, c = s % 4;
      const uint8_t* ql = block + 64 * half + 32 * (c % 2);
      const uint8_t* qh = block + 128 + 32 * half;
      for (int64_t t = 0; t < kQuantBlock; ++t)
        out.q[t] = ((ql[t] >> (4 * (c / 2))) & 0x0f) | (((qh[t] >> (2 * c)) & 3) << 4);
      const float d = half_at(block + 208);
      for (int64_t h = 0; h < 2; ++h) {
        out.d[h] = d * static_cast<float>(static_cast<int8_t>(block[192 + 2 * s + h]));
        out.m[h] = -32.0f * out.d[h];
      }
      return;
    }
    default: throw std::invalid_argument("quantized matrix: no block format given");
  }
}

// v (|v| < 2^22) rounded to the nearest integer, ties to even: adding and
// subtracting 1.5 * 2^23 leaves no fraction bits, and fp32 addition rounds to
// nearest even (no libm call, unlike nearbyint).
inline float round_half_even(float v) {
  constexpr float kShift = 12582912.0f;
  const float shifted = v + kShift;
  return shifted - kShift;
}

}  // namespace

const char* quant_name(QuantType type) {
  switch (type) {
    case QuantType::q8_0: return "q8_0";
    case QuantType::q4_0: return "q4_0";
    case QuantType::q4_1: return "q4_1";
    case QuantType::q5_0: return "q5_0";
    case QuantType::q5_1: return "q5_1";
    case QuantType::q4_k: return "q4_k";
    case QuantType::q5_k: return "q5_k";
    case QuantType::q6_k: return "q6_k";
    default: return "none";
  }
}

QuantType quant_type(const std::string& name) {
  std::string choices;
  for (QuantType t : kTypes) {
    if (name == quant_name(t)) return t;
    choices += (choices.empty() ? "" : ", ") + std::string(quant_name(t));
  }
  throw std::invalid_argument("unknown quantized block format '" + name + "'; choose from " + choices);
}

int64_t gguf_block_weights(QuantType type) {
  check_type(type);
  return type == QuantType::q4_k || type == QuantType::q5_k || type == QuantType::q6_k ? 256 : kQuantBlock;
}

int64_t gguf_block_bytes(QuantType type) {
  check_type(type);
  switch (type) {
    case QuantType::q8_0: return 34;
    case QuantType::q4_0: return 18;
    case QuantType::q4_1: return 20;
    case QuantType::q5_0: return 22;
    case QuantType::q5_1: return 24;
    case QuantType::q4_k: return 144;
    case QuantType::q5_k: return 176;
    default: return 210;  // q6_k
  }
}

int64_t gguf_row_bytes(QuantType type, int64_t k) {
  const int64_t block = gguf_block_weights(type);
  if (k <= 0 || k % block != 0)
    throw std::invalid_argument(std::string(quant_name(type)) + " rows must hold a positive multiple of " +
                                std::to_string(block) + " weights, not " + std::to_string(k));
  return k / block * gguf_block_bytes(type);
}

int64_t quant_packed_bytes(QuantType type, int64_t n, int64_t k) {
  gguf_row_bytes(type, k);  // checks k
  return ceil_div(n, kTileRows) * (k / kQuantBlock) * quant_tile_block_bytes(type);
}

void quant_pack(QuantType type, const uint8_t* gguf_rows, int64_t rows, int64_t k, int64_t first_row, uint8_t* out) {
  const int64_t row_bytes = gguf_row_bytes(type, k), blocks = k / kQuantBlock, tb = quant_tile_block_bytes(type);
  QuantSub sub;
  for (int64_t r = first_row; r < first_row + rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      gguf_sub(type, gguf_rows + (r - first_row) * row_bytes, b, sub);
      quant_tile_write(quant_tile_type(type), sub, out + ((r / kTileRows) * blocks + b) * tb, r % kTileRows);
    }
}

void quant_row(QuantType type, const uint8_t* packed, int64_t n, int64_t k, int64_t r, float* out) {
  check_type(type);
  if (r < 0 || r >= n) throw std::out_of_range("quant_row: row " + std::to_string(r) + " of " + std::to_string(n));
  const QuantType tile = quant_tile_type(type);
  const int64_t blocks = k / kQuantBlock, tb = quant_tile_block_bytes(type);
  QuantSub sub;
  for (int64_t b = 0; b < blocks; ++b) {
    quant_tile_read(tile, packed + ((r / kTileRows) * blocks + b) * tb, r % kTileRows, sub);
    for (int64_t t = 0; t < kQuantBlock; ++t) out[b * kQuantBlock + t] = quant_value(tile, sub, t);
  }
}

void quant_dequantize(QuantType type, const uint8_t* gguf_rows, int64_t n, int64_t k, float* out) {
  const int64_t row_bytes = gguf_row_bytes(type, k), blocks = k / kQuantBlock;
  QuantSub sub;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      gguf_sub(type, gguf_rows + r * row_bytes, b, sub);
      // the tile format's rule is the GGUF format's (q8_0: d q; else fma)
      for (int64_t t = 0; t < kQuantBlock; ++t) out[r * k + b * kQuantBlock + t] = quant_value(type, sub, t);
    }
}

void linear_quant(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  check_type(type);
  gguf_row_bytes(type, k);
  SSD_ON_ACTIVE_ISA(linear_quant(quant_tile_type(type), x, ldx, wp, bias, y, ldy, m, n, k, pool))
}

void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* q, float* dx, float* sx,
                   ThreadPool& pool) {
  const int64_t blocks = k / kQuantBlock;
  pool.parallel_for(m, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = x + r * ldx + b * kQuantBlock;
        int8_t* qb = q + r * k + b * kQuantBlock;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t j = 0; j < kQuantBlock; ++j) {
          amax = std::max(amax, std::fabs(xb[j]));
          finite = finite && std::isfinite(xb[j]);
        }
        int32_t sum = 0;
        float d = amax / 127.0f;
        if (!finite) {
          d = std::numeric_limits<float>::quiet_NaN();
          std::fill(qb, qb + kQuantBlock, int8_t{0});
        } else {
          const float id = d != 0.0f ? 1.0f / d : 0.0f;
          for (int64_t j = 0; j < kQuantBlock; ++j) {
            qb[j] = static_cast<int8_t>(round_half_even(xb[j] * id));
            sum += qb[j];
          }
        }
        dx[r * blocks + b] = d;
        sx[r * blocks + b] = d * static_cast<float>(sum);
      }
  });
}

void linear_quant_i8(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                     int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  check_type(type);
  gguf_row_bytes(type, k);
  if (m <= 0 || n <= 0) return;
  // Scratch per calling thread, reused across products.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scales;
  const int64_t blocks = k / kQuantBlock;
  q.resize(static_cast<size_t>(m * k));
  scales.resize(static_cast<size_t>(2 * m * blocks));
  quantize_rows(x, ldx, m, k, q.data(), scales.data(), scales.data() + m * blocks, pool);
  const QuantizedRows rows{q.data(), scales.data(), scales.data() + m * blocks, k};
#if defined(SSD_X86_ISAS)
  if (active_isa() == Isa::avx512_vnni)
    return avx512_vnni::linear_quant_i8(quant_tile_type(type), rows, wp, bias, y, ldy, m, n, pool);
#endif
  SSD_ON_ACTIVE_ISA(linear_quant_i8(quant_tile_type(type), rows, wp, bias, y, ldy, m, n, pool))
}

}  // namespace ssd::kernels
