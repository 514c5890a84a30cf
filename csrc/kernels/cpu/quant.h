// Quantized weight matrices: GGUF's block formats kept in their blocks and
// multiplied without dequantising the matrix.
//
// Every format here is read as sub-blocks of 32 weights, each 32 small
// unsigned integers q (signed for q8_0) and a scale d and offset m per half
// of 16 (the same for both halves but in q6_k), so that each weight is
//   w = d * q  (q8_0),   w = fma(q, d, m)  (every other format),
// which is bitwise the value gguf's own dequantisation gives (d * q is exact
// in fp32 for these q and d, so the one rounding of fma is gguf's one
// rounding). The GGUF formats (ggml's layouts):
//   q8_0  blocks of 32: d, int8 q[32]                        w = d q
//   q4_0  blocks of 32: d, 4-bit q                           w = d (q - 8)
//   q4_1  blocks of 32: d, m, 4-bit q                        w = d q + m
//   q5_0  blocks of 32: d, 5-bit q (a high-bit plane)        w = d (q - 16)
//   q5_1  blocks of 32: d, m, 5-bit q                        w = d q + m
//   q4_k  blocks of 256: d, dmin, 6-bit scale and min per 32, 4-bit q
//                        w = (d sc) q - (dmin mn)
//   q5_k  as q4_k with 5-bit q
//   q6_k  blocks of 256: d, int8 scale per 16, 6-bit q      w = (d sc) (q - 32)
// So d = d sc and m = -(dmin mn) for the k-quants, m = -8 d, -16 d and -32 d
// for q4_0, q5_0 and q6_k (all exact).
//
// Packed layout (quant_packed_bytes): the matrix is cut as linear.h's exact
// layout, into tiles of kTileRows rows, and a tile into 32-column blocks; one
// block of one tile holds its 4 rows' scales as fp32, then their quants in
// one of five tile formats (quant_tile_type):
//   q8_0        d[4], int8 q[4][32]                                 144 bytes (9 bits / weight)
//   q4_0        d[4], nibbles[4][16]                                 80 bytes (5)
//   q4_1        d[4], m[4], nibbles[4][16]                           96 bytes (6)
//   q5_0        d[4], nibbles[4][16], high bits[4][4]                96 bytes (6)
//   q5_1        d[4], m[4], nibbles[4][16], high bits[4][4]         112 bytes (7)
//   q6_k        d[4][2], nibbles[4][16], high bit pairs[4][8]        128 bytes (8)
// Nibble byte t holds q_t in its low and q_{t+16} in its high 4 bits; q5's
// high bits are one little-endian uint32, bit t for q_t; q6's byte t holds
// bits 4-5 of q_t, q_{t+8}, q_{t+16}, q_{t+24} at bits 0-1, 2-3, 4-5, 6-7.
// q4_k and q5_k are held as q4_1 and q5_1; the m of q4_0, q5_0 and q6_k
// (-8 d, -16 d, -32 d) is not stored. Rows past n are zero.
//
// Two products: linear_quant, the exact product (linear.h) over the
// dequantised matrix, each 16-lane chunk dequantised in registers, so a
// quantized model computes bitwise what the fp32 model of its dequantised
// weights computes, on every instruction set; and linear_quant_i8, with int8
// activations (below). Rows are batch invariant in both.
#pragma once

#include <cstdint>
#include <string>

#include "thread_pool.h"

namespace ssd::kernels {

enum class QuantType : int { none = 0, q8_0 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 4, q5_1 = 5, q4_k = 6, q5_k = 7, q6_k = 8 };

/// Weights per sub-block (the packed layout's block; every format's scale unit
/// but q6_k's, which has two).
constexpr int64_t kQuantBlock = 32;

/// The tile format a GGUF format is packed in: q4_k -> q4_1, q5_k -> q5_1,
/// any other -> itself.
constexpr QuantType quant_tile_type(QuantType type) {
  return type == QuantType::q4_k ? QuantType::q4_1 : type == QuantType::q5_k ? QuantType::q5_1 : type;
}
/// Where the parts of one block of one tile start in the packed layout: the
/// fp32 d at 0 (4 bytes per row; q6_k 8, its two halves), m at 16 (q4_1,
/// q5_1), row r's quants at quant_tile_quants(type) + r *
/// quant_row_quant_bytes(type) (32 int8, or 16 bytes of nibbles), row r's
/// high bits at quant_tile_high(type) + r * quant_row_high_bytes(type); and
/// its size, quant_tile_block_bytes(type).
constexpr bool quant_tile_has_m(QuantType type) {
  return quant_tile_type(type) == QuantType::q4_1 || quant_tile_type(type) == QuantType::q5_1;
}
constexpr int64_t quant_tile_quants(QuantType type) {
  return quant_tile_has_m(type) || quant_tile_type(type) == QuantType::q6_k ? 32 : 16;
}
constexpr int64_t quant_row_quant_bytes(QuantType type) { return type == QuantType::q8_0 ? 32 : 16; }
constexpr int64_t quant_tile_high(QuantType type) { return quant_tile_quants(type) + 4 * quant_row_quant_bytes(type); }
constexpr int64_t quant_row_high_bytes(QuantType type) {
  switch (quant_tile_type(type)) {
    case QuantType::q5_0:
    case QuantType::q5_1: return 4;
    case QuantType::q6_k: return 8;
    default: return 0;
  }
}
constexpr int64_t quant_tile_block_bytes(QuantType type) {
  return quant_tile_high(type) + 4 * quant_row_high_bytes(type);
}

/// "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k" ("none" for none).
const char* quant_name(QuantType type);
/// The format named `name`; throws std::invalid_argument naming the choices.
QuantType quant_type(const std::string& name);
/// Weights per GGUF block of `type`: 32, or 256 for the k-quants.
int64_t gguf_block_weights(QuantType type);
/// Bytes of one GGUF block of `type` (34, 18, 20, 22, 24, 144, 176, 210).
int64_t gguf_block_bytes(QuantType type);
/// Bytes of a GGUF row of k weights; throws std::invalid_argument when k is
/// not a positive multiple of the format's block.
int64_t gguf_row_bytes(QuantType type, int64_t k);

/// Bytes of the packed layout of an [n, k] matrix (see the file comment).
int64_t quant_packed_bytes(QuantType type, int64_t n, int64_t k);
/// GGUF rows [rows][gguf_row_bytes(type, k)] -> rows first_row .. first_row
/// + rows - 1 of a packed [n, k] matrix (`out` holds quant_packed_bytes(type,
/// n, k) bytes, zeroed first: rows never written stay zero). Parts of a fused
/// matrix are packed one after another, with no copy of their concatenation.
void quant_pack(QuantType type, const uint8_t* gguf_rows, int64_t rows, int64_t k, int64_t first_row, uint8_t* out);
/// Row r of a packed matrix, dequantised: out[k] fp32 (the values the
/// product multiplies by; the embedding lookup of a quantized table).
void quant_row(QuantType type, const uint8_t* packed, int64_t n, int64_t k, int64_t r, float* out);
/// GGUF rows [n][gguf_row_bytes] -> dense fp32 [n, k] (gguf's dequantisation,
/// bit for bit): the reference, and the fallback where a matrix's parts differ
/// in format.
void quant_dequantize(QuantType type, const uint8_t* gguf_rows, int64_t n, int64_t k, float* out);

/// y = x @ w^T (+ bias) with w packed (type: the GGUF format or its tile
/// format): bitwise linear<float> over the dequantised matrix (x, y row
/// strides ldx / ldy elements).
void linear_quant(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool);

// ---- int8 activations (llama.cpp's way): the faster product.
//
// Each activation row is quantized per 32-value block as q8_0 is:
//   a = max |x_j|, dx = a / 127, q_j = round_half_even(x_j * (1 / dx))
// (dx = 0: q = 0; a not finite: dx = NaN, so the row's outputs are NaN),
// and sx = dx * sum_j q_j (what the offset m multiplies).
// Each output is then, over the blocks b in order, with 8 fp32 lanes:
//   s_l  = sum_{j = 4l .. 4l + 3} wq_j * q_j      (int32, exact)
//   acc_l = fma(float(s_l), d_w(l) * dx, acc_l)     (l = 0 .. 7)
//   ms    = fma(m_w, sx, ms)                        (q4_1, q5_1 tiles only)
// where wq is q (q8_0, q4_1, q5_1 tiles), q - 8 (q4_0), q - 16 (q5_0) or
// q - 32 (q6_k), and d_w(l) is the block's d, or for q6_k the d of the half
// holding lanes l (l < 4: the first), and finally
//   y = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)) + ms  (+ bias)
// (the tree of vec.h's vsum from 8 lanes). Integer sums are exact however
// they are computed, so every path (AVX2's maddubs, AVX-512, portable C++)
// gives these bits, and each row's outputs depend on that row alone.

/// Activation rows quantized for linear_quant_i8: q [m][k] int8, and per
/// row and 32-block dx [m][k / 32] and sx [m][k / 32].
struct QuantizedRows {
  const int8_t* q = nullptr;
  const float* dx = nullptr;
  const float* sx = nullptr;
  int64_t k = 0;
};

/// Quantizes rows of x [m, k] (row stride ldx) as described above into
/// q [m * k], dx and sx [m * k / 32] (k a multiple of 32).
void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* q, float* dx, float* sx,
                   ThreadPool& pool);

/// y = x @ w^T (+ bias) with int8 activations (see above): x is quantized
/// here, then the blocks are multiplied as integers.
void linear_quant_i8(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                     int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool);

}  // namespace ssd::kernels
