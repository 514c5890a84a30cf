#include "quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "fp16.h"
#include "isa.h"

namespace ssd::kernels {

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return fp16_to_float(h);
}

// One GGUF block's scales: d, and m (q4_1; -8 d for q4_0; 0 for q8_0).
struct BlockScales {
  float d, m;
};

BlockScales gguf_scales(QuantType type, const uint8_t* block) {
  const float d = half_at(block);
  switch (type) {
    case QuantType::q4_0: return {d, -8.0f * d};
    case QuantType::q4_1: return {d, half_at(block + 2)};
    default: return {d, 0.0f};
  }
}

// The GGUF block's quants: int8 q[32] (q8_0) or the 16 nibble bytes.
const uint8_t* gguf_quants(QuantType type, const uint8_t* block) {
  return block + (type == QuantType::q4_1 ? 4 : 2);
}

void check_type(QuantType type) {
  if (type != QuantType::q8_0 && type != QuantType::q4_0 && type != QuantType::q4_1)
    throw std::invalid_argument("quantized matrix: no block format given");
}

// The value of quant j (0..31) of a block whose quants are `q`, as the
// product uses it: d * q, or fma(q, d, m) for the 4-bit formats.
inline float dequant(QuantType type, const uint8_t* q, int64_t j, float d, float m) {
  if (type == QuantType::q8_0) return d * static_cast<float>(static_cast<int8_t>(q[j]));
  const int nibble = j < 16 ? (q[j] & 0x0f) : (q[j - 16] >> 4);
  return __builtin_fmaf(static_cast<float>(nibble), d, m);
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
    default: return "none";
  }
}

QuantType quant_type(const std::string& name) {
  for (QuantType t : {QuantType::q8_0, QuantType::q4_0, QuantType::q4_1})
    if (name == quant_name(t)) return t;
  throw std::invalid_argument("unknown quantized block format '" + name + "'; choose from q8_0, q4_0, q4_1");
}

int64_t gguf_block_bytes(QuantType type) {
  check_type(type);
  return type == QuantType::q8_0 ? 34 : type == QuantType::q4_0 ? 18 : 20;
}

int64_t gguf_row_bytes(QuantType type, int64_t k) {
  if (k <= 0 || k % kQuantBlock != 0)
    throw std::invalid_argument(std::string(quant_name(type)) + " rows must hold a positive multiple of " +
                                std::to_string(kQuantBlock) + " weights, not " + std::to_string(k));
  return k / kQuantBlock * gguf_block_bytes(type);
}

int64_t quant_packed_bytes(QuantType type, int64_t n, int64_t k) {
  gguf_row_bytes(type, k);  // checks k
  return ceil_div(n, kTileRows) * (k / kQuantBlock) * quant_tile_block_bytes(type);
}

void quant_pack(QuantType type, const uint8_t* gguf_rows, int64_t rows, int64_t k, int64_t first_row, uint8_t* out) {
  const int64_t row_bytes = gguf_row_bytes(type, k), blocks = k / kQuantBlock, tb = quant_tile_block_bytes(type);
  for (int64_t r = first_row; r < first_row + rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* src = gguf_rows + (r - first_row) * row_bytes + b * gguf_block_bytes(type);
      uint8_t* dst = out + ((r / kTileRows) * blocks + b) * tb;
      const BlockScales s = gguf_scales(type, src);
      const int64_t j = r % kTileRows;
      std::memcpy(dst + j * 4, &s.d, 4);
      if (type != QuantType::q8_0) std::memcpy(dst + 16 + j * 4, &s.m, 4);
      std::memcpy(dst + quant_tile_quants(type) + j * quant_row_quant_bytes(type), gguf_quants(type, src),
                  static_cast<size_t>(quant_row_quant_bytes(type)));
    }
}

void quant_row(QuantType type, const uint8_t* packed, int64_t n, int64_t k, int64_t r, float* out) {
  check_type(type);
  if (r < 0 || r >= n) throw std::out_of_range("quant_row: row " + std::to_string(r) + " of " + std::to_string(n));
  const int64_t blocks = k / kQuantBlock, tb = quant_tile_block_bytes(type), j = r % kTileRows;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = packed + ((r / kTileRows) * blocks + b) * tb;
    float d, m = 0.0f;
    std::memcpy(&d, block + j * 4, 4);
    if (type != QuantType::q8_0) std::memcpy(&m, block + 16 + j * 4, 4);
    const uint8_t* q = block + quant_tile_quants(type) + j * quant_row_quant_bytes(type);
    for (int64_t i = 0; i < kQuantBlock; ++i) out[b * kQuantBlock + i] = dequant(type, q, i, d, m);
  }
}

void quant_dequantize(QuantType type, const uint8_t* gguf_rows, int64_t n, int64_t k, float* out) {
  const int64_t row_bytes = gguf_row_bytes(type, k), blocks = k / kQuantBlock;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* src = gguf_rows + r * row_bytes + b * gguf_block_bytes(type);
      const BlockScales s = gguf_scales(type, src);
      for (int64_t i = 0; i < kQuantBlock; ++i)
        out[r * k + b * kQuantBlock + i] = dequant(type, gguf_quants(type, src), i, s.d, s.m);
    }
}

void linear_quant(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  check_type(type);
  gguf_row_bytes(type, k);
  SSD_ON_ACTIVE_ISA(linear_quant(type, x, ldx, wp, bias, y, ldy, m, n, k, pool))
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
  SSD_ON_ACTIVE_ISA(linear_quant_i8(type, rows, wp, bias, y, ldy, m, n, pool))
}

}  // namespace ssd::kernels
