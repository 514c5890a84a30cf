#pragma once

#include <cstdint>

#include "thread_pool.h"

namespace ssd::kernels {

/// y[m, n] = x[m, k] @ w[n, k]^T (+ bias[n]), fp32 activations, fp32 or bf16
/// (uint16_t) weights. Each y element is computed by `dot` order regardless of
/// m, the tiling or the thread count: rows are bitwise batch invariant.
/// x, y row strides are ldx / ldy elements; w is dense [n, k].
template <typename WT>
void linear(const float* x, int64_t ldx, const WT* w, const float* bias, float* y, int64_t ldy,
            int64_t m, int64_t n, int64_t k, ThreadPool& pool);

}  // namespace ssd::kernels
