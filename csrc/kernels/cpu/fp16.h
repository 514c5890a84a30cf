// IEEE half -> fp32, exactly (subnormals, infinities and NaN included): the
// scales of GGUF's quantized blocks.
#pragma once

#include <cstdint>
#include <cstring>

namespace ssd::kernels {

/// An IEEE half as a weight matrix stores it: a type of its own, so the
/// products' templates tell it from bf16 (whose elements are uint16_t).
struct Fp16 {
  uint16_t bits;
};

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, NaN (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise (the value is mantissa * 2^-24)
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace ssd::kernels
