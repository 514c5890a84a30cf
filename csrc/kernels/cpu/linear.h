// Matrix products of the model: y[m, n] = x[m, k] @ w[n, k]^T (+ bias[n]).
//
// Weights live in packed layouts so that a product streams one contiguous run
// of memory per thread (the dense row-major layout read four rows at a time
// reached about half the core's bandwidth).
//
// * The EXACT layout serves every product whose numerics matter (the target,
//   and drafts on their exact path): fp32 activations, fp32 or bf16 weights,
//   each output computed in dot()'s order whatever m, the tiling or the thread
//   count, so rows are bitwise batch invariant.
// * The PAIR layout serves the draft's many-row products (its speculation
//   tree): activations rounded to bf16, products of bf16 pairs accumulated in
//   fp32 (AVX512-BF16 where the CPU has it, whatever isa.h's choice). Each
//   row is still computed the same way whatever m, but the numbers differ
//   from the exact path.
#pragma once

#include <cstdint>

#include "fp16.h"
#include "thread_pool.h"

namespace ssd::kernels {

/// Weight rows per tile of the exact layout, and elements per k-chunk of a row.
constexpr int64_t kTileRows = 4;
constexpr int64_t kTileLanes = 16;
/// Output columns per panel of the pair layout.
constexpr int64_t kPanelCols = 64;

/// Elements of the exact layout of an [n, k] matrix:
/// [ceil(n / 4)][ceil(k / 16)][4][16], zero padded.
int64_t packed_size(int64_t n, int64_t k);

/// Packs a dense row-major [n, k] matrix into the exact layout (`out` holds
/// packed_size(n, k) elements).
template <typename WT>
void pack(const WT* w, int64_t n, int64_t k, WT* out);

/// y = x @ w^T (+ bias) with w in the exact layout. x, y row strides are
/// ldx / ldy elements.
template <typename WT>
void linear(const float* x, int64_t ldx, const WT* wp, const float* bias, float* y, int64_t ldy,
            int64_t m, int64_t n, int64_t k, ThreadPool& pool);

/// bf16 elements of the pair layout of an [n, k] matrix:
/// [ceil(n / 64)][ceil(k / 2)][64][2], zero padded.
int64_t pair_packed_size(int64_t n, int64_t k);

/// Builds the pair layout (bf16, round to nearest even) of a matrix held in
/// the exact layout.
template <typename WT>
void pack_pairs(const WT* wp, int64_t n, int64_t k, uint16_t* out);

/// y = x @ w^T (+ bias) with w in the pair layout (see the file comment).
void linear_pairs(const float* x, int64_t ldx, const uint16_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool);

/// Whether linear_pairs runs on AVX512-BF16 instructions (else it emulates
/// them): whether the CPU has them.
bool pairs_native();

}  // namespace ssd::kernels
