// The row kernels of ops.h that use vec.h, compiled once per instruction set.
#include <algorithm>
#include <cmath>

#include "../isa.h"
#include "vec.h"

namespace ssd::kernels::SSD_ISA {

void rms_norm(const float* x, int64_t ldx, const float* weight, float* out, int64_t ldo,
              int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    const float mean_sq = dot(xr, xr, n) / static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(mean_sq + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

void silu_mul(const float* gu, float* out, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * n;
    const float* u = g + n;
    float* o = out + r * n;
    // 16 lanes at a time, the tail masked, so every element sees one arithmetic.
    for (int64_t i = 0; i < n; i += kLanes) {
      const int64_t len = std::min(kLanes, n - i);
      const Vec gv = vload_tail(g + i, len);
      const Vec act = vdiv(gv, vadd(vbroadcast(1.0f), vexp(vneg(gv))));
      vstore_tail(o + i, vmul(act, vload_tail(u + i, len)), len);
    }
  }
}

double sum_exp(const float* x, int64_t n, float shift) {
  // Lane partial sums in float, folded into a double every 1024 values so
  // long rows (a vocabulary) keep their precision.
  double total = 0.0;
  const Vec s = vbroadcast(shift);
  for (int64_t b = 0; b < n; b += 1024) {
    const int64_t end = std::min(n, b + 1024);
    Vec acc = vzero();
    int64_t i = b;
    for (; i + kLanes <= end; i += kLanes) acc = vadd(acc, vexp(vsub(vload(x + i), s)));
    total += vsum(acc);
    if (i < end) {  // the masked tail: only its own lanes count
      float lanes[kLanes];
      vstore(lanes, vexp(vsub(vload_tail(x + i, end - i), s)));
      for (int64_t l = 0; l < end - i; ++l) total += lanes[l];
    }
  }
  return total;
}

}  // namespace ssd::kernels::SSD_ISA
