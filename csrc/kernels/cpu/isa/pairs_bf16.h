// The AVX512-BF16 pair kernel (pairs_bf16.cpp), present in x86 builds.
#pragma once

#include <cstdint>

namespace ssd::kernels::avx512_bf16 {

/// Rows of activations per call of pair_panel_rows.
constexpr int64_t kPairGroup = 6;

/// rows (<= kPairGroup) rows of bf16 activation pairs xp [rows, pairs] against
/// one 64-column panel of the pair layout: out[r][c] = acc + bias[c] for the
/// first `cols` columns.
void pair_panel_rows(int64_t rows, const uint32_t* xp, int64_t pairs, const uint16_t* panel, float* const* out,
                     const float* bias, int64_t cols);

}  // namespace ssd::kernels::avx512_bf16
