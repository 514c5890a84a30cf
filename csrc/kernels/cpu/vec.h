// 16-lane float helpers shared by the CPU kernels. Every reduction in the
// kernels goes through these so that one output element always sees the same
// sequence of operations: lane-wise fused multiply-adds in index order, then
// the same horizontal sum. That is what makes results batch invariant.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SSD_AVX512 1
#endif

namespace ssd::kernels {

constexpr int64_t kLanes = 16;

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

#if SSD_AVX512
using Vec = __m512;

inline Vec vzero() { return _mm512_setzero_ps(); }
inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec vload_tail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
inline Vec vload_tail(const uint16_t* p, int64_t n) {
  __m256i h = _mm256_maskz_loadu_epi16(tail_mask(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec a) { return _mm512_reduce_add_ps(a); }
// Keeps a loaded vector in a register: without it the compiler folds the load
// into every multiply-add that uses the vector, and a register block of
// products then issues one load per multiply-add (half the FMA rate on Zen 4).
// Changes no arithmetic.
inline void vpin(Vec& v) {
#if defined(__GNUC__)
  __asm__("" : "+v"(v));
#endif
}
inline Vec vbroadcast(float x) { return _mm512_set1_ps(x); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline void vstore_tail(float* p, Vec v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vneg(Vec a) { return _mm512_sub_ps(_mm512_setzero_ps(), a); }
inline Vec vdiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
// e^x per lane: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts so
// n ln2 is exact), e^r by its degree-7 Taylor polynomial (truncation 5e-9
// relative), times 2^n. Within a few ulp of expf; +inf above 88.7, 0 far
// below -87; NaN stays NaN (max/min return their second operand on NaN).
inline Vec vexp(Vec x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  Vec p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#else
struct Vec {
  float v[kLanes];
};
inline Vec vzero() { return Vec{}; }
template <typename T>
inline float lane_value(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 2) return bf16_to_float(p[i]);
  else return p[i];
}
template <typename T>
inline Vec vload(const T* p) {
  Vec r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = lane_value(p, i);
  return r;
}
template <typename T>
inline Vec vload_tail(const T* p, int64_t n) {
  Vec r{};
  for (int64_t i = 0; i < n; ++i) r.v[i] = lane_value(p, i);
  return r;
}
inline Vec vfma(Vec a, Vec b, Vec c) {
  for (int64_t i = 0; i < kLanes; ++i) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline float vsum(Vec a) {
  // Pairwise tree in a fixed order.
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t i = 0; i < w; ++i) a.v[i] = a.v[i] + a.v[i + w];
  return a.v[0];
}
inline void vpin(Vec&) {}
inline Vec vbroadcast(float x) {
  Vec r;
  for (int64_t l = 0; l < kLanes; ++l) r.v[l] = x;
  return r;
}
inline void vstore(float* p, Vec v) { std::memcpy(p, v.v, sizeof(v.v)); }
inline void vstore_tail(float* p, Vec v, int64_t n) { std::memcpy(p, v.v, static_cast<size_t>(n) * sizeof(float)); }
template <typename F>
inline Vec lanewise(Vec a, Vec b, F f) {
  for (int64_t i = 0; i < kLanes; ++i) a.v[i] = f(a.v[i], b.v[i]);
  return a;
}
inline Vec vsub(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x - y; }); }
inline Vec vneg(Vec a) { return lanewise(a, a, [](float x, float) { return -x; }); }
inline Vec vdiv(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x / y; }); }
inline Vec vmul(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x * y; }); }
inline Vec vadd(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x + y; }); }
inline Vec vexp(Vec a) { return lanewise(a, a, [](float x, float) { return std::exp(x); }); }
#endif

/// Dot product of two length-n vectors with the canonical reduction order.
template <typename A, typename B>
inline float dot(const A* a, const B* b, int64_t n) {
  Vec acc = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = vfma(vload(a + i), vload(b + i), acc);
  if (i < n) acc = vfma(vload_tail(a + i, n - i), vload_tail(b + i, n - i), acc);
  return vsum(acc);
}

}  // namespace ssd::kernels
