// Quantized weight matrices: GGUF's block formats kept in their blocks and
// multiplied without dequantising the matrix.
//
// A GGUF row of k weights is k / 32 blocks; each block holds 32 small
// integers and one or two fp16 numbers (ggml's layout):
//   q8_0  d, q[32] int8                 w = d * q
//   q4_0  d, qs[16] (two 4-bit q each)  w = d * (q - 8)
//   q4_1  d, m, qs[16]                  w = d * q + m
// where byte j of qs holds q of weight j in its low nibble and of weight
// j + 16 in its high nibble.
//
// The product is the exact one of linear.h over the DEQUANTISED fp32 matrix:
// each 16-lane chunk of weights is dequantised in registers (w = d * q, or
// fma(q, d, m) for the 4-bit formats, both exact or rounded once as gguf's
// own dequantisation rounds them) and enters dot()'s order of fused
// multiply-adds. So a quantized model computes bitwise what the fp32 model
// built from its dequantised weights computes, on every instruction set, and
// rows stay batch invariant; only the bytes read per product shrink.
//
// Packed layout (quant_packed_bytes): the matrix is cut as linear.h's exact
// layout, into tiles of kTileRows rows, and a tile into 32-column blocks;
// one block of one tile holds the scales of its 4 rows as fp32, then their
// quants:
//   q8_0  float d[4], int8 q[4][32]                 144 bytes (9 bits / weight)
//   q4_*  float d[4], float m[4], uint8 qs[4][16]    96 bytes (6 bits / weight)
// q4_0 is held as q4_1 with m = -8 d (d * q - 8 d is exact, so the one
// rounding of fma(q, d, m) gives exactly d * (q - 8)). Rows past n are zero.
#pragma once

#include <cstdint>
#include <string>

#include "thread_pool.h"

namespace ssd::kernels {

enum class QuantType : int { none = 0, q8_0 = 1, q4_0 = 2, q4_1 = 3 };

/// Weights per GGUF block (every format here).
constexpr int64_t kQuantBlock = 32;

/// Bytes of one block of one tile in the packed layout, and where its parts
/// start: the fp32 d of its 4 rows at 0, the 4-bit formats' fp32 m at 16,
/// then row r's quants (32 int8, or 16 bytes of nibbles) at
/// quant_tile_quants(type) + r * quant_row_quant_bytes(type).
constexpr int64_t quant_tile_block_bytes(QuantType type) { return type == QuantType::q8_0 ? 144 : 96; }
constexpr int64_t quant_tile_quants(QuantType type) { return type == QuantType::q8_0 ? 16 : 32; }
constexpr int64_t quant_row_quant_bytes(QuantType type) { return type == QuantType::q8_0 ? 32 : 16; }

/// "q8_0", "q4_0", "q4_1" ("none" for none).
const char* quant_name(QuantType type);
/// The format named `name`; throws std::invalid_argument naming the choices.
QuantType quant_type(const std::string& name);
/// Bytes of one GGUF block of `type` (34, 18, 20).
int64_t gguf_block_bytes(QuantType type);
/// Bytes of a GGUF row of k weights; throws std::invalid_argument when k is
/// not a positive multiple of 32.
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

/// y = x @ w^T (+ bias) with w packed: bitwise linear<float> over the
/// dequantised matrix (x, y row strides ldx / ldy elements).
void linear_quant(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool);

// ---- int8 activations (llama.cpp's way): the faster product.
//
// Each activation row is quantized per 32-value block as q8_0 is:
//   a = max |x_j|, dx = a / 127, q_j = round_half_even(x_j * (1 / dx))
// (dx = 0: q = 0; a not finite: dx = NaN, so the row's outputs are NaN),
// and sx = dx * sum_j q_j (what q4_1's offset m multiplies).
// Each output is then, over the blocks b in order, with 8 fp32 lanes:
//   s_l  = sum_{j = 4l .. 4l + 3} wq_j * q_j      (int32, exact)
//   acc_l = fma(float(s_l), d_w * dx, acc_l)        (l = 0 .. 7)
//   ms    = fma(m_w, sx, ms)                        (q4_1 only)
// where wq is q (q8_0), q - 8 (q4_0) or q (q4_1), and finally
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
