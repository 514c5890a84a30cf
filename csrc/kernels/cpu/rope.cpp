#include <cmath>
#include <vector>

#include "ops.h"

namespace ssd::kernels {

void rope(float* x, int64_t ld, int64_t tokens, int64_t heads, int64_t head_dim,
          const float* inv_freq, const int32_t* positions) {
  const int64_t half = head_dim / 2;
  std::vector<float> cos_v(half), sin_v(half);
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * ld + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  }
}

}  // namespace ssd::kernels
