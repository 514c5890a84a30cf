// ops.h's vector row kernels: each runs the copy of the active instruction
// set (isa/row_ops.cpp).
#include "isa.h"

namespace ssd::kernels {

void rms_norm(const float* x, int64_t ldx, const float* weight, float* out, int64_t ldo, int64_t rows, int64_t n,
              float eps) {
  SSD_ON_ACTIVE_ISA(rms_norm(x, ldx, weight, out, ldo, rows, n, eps))
}

void silu_mul(const float* gu, float* out, int64_t rows, int64_t n) {
  SSD_ON_ACTIVE_ISA(silu_mul(gu, out, rows, n))
}

double sum_exp(const float* x, int64_t n, float shift) { SSD_ON_ACTIVE_ISA(sum_exp(x, n, shift)) }

}  // namespace ssd::kernels
