// 16-lane float helpers shared by the CPU kernels. Every reduction in the
// kernels goes through these so that one output element always sees the same
// sequence of operations: lane-wise fused multiply-adds in index order, then
// the same horizontal sum. That is what makes results batch invariant, and
// what makes the three implementations below (AVX-512, AVX2 as two 8-lane
// halves, portable C++) give the same bits: the kernels are compiled once per
// instruction set (isa.h) and any of them can serve a forward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../bf16.h"
#include "../fp16.h"
#include "isa_namespace.h"

#if SSD_ISA_LEVEL >= 1
#include <immintrin.h>
#endif
#if SSD_ISA_LEVEL == 2
#define SSD_AVX512 1
#elif SSD_ISA_LEVEL == 1
#define SSD_AVX2 1
#endif

namespace ssd::kernels::SSD_ISA {

constexpr int64_t kLanes = 16;

// e^x on every path (the same operations lane by lane, so every path gives
// the same bits): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts so
// n ln2 is exact), e^r by its degree-7 Taylor polynomial (truncation 5e-9
// relative), times 2^n. Within a few ulp of expf; +inf above 88.7, 0 far
// below -87; NaN stays NaN (max/min return their second operand on NaN).
constexpr float kExpHi = 89.0f, kExpLo = -104.0f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                               1.0f / 6.0f,    0.5f,           1.0f,           1.0f};

#if SSD_AVX512
using Vec = __m512;

inline Vec vzero() { return _mm512_setzero_ps(); }
inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec vload(const Fp16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline Vec vload_tail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
inline Vec vload_tail(const uint16_t* p, int64_t n) {
  __m256i h = _mm256_maskz_loadu_epi16(tail_mask(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec vload_tail(const Fp16* p, int64_t n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p)); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec a) { return _mm512_reduce_add_ps(a); }
// 16 int8 -> float; the low (High = false) or high nibbles of 16 bytes -> float.
inline Vec vload_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline Vec vload_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
template <bool High>
inline Vec vload_nibbles(const uint8_t* p) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtepi32_ps(High ? _mm512_srli_epi32(b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(0x0f)));
}
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
inline Vec vexp(Vec x) {
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), _mm512_max_ps(_mm512_set1_ps(kExpLo), x));
  const Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  Vec p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_scalef_ps(p, n);
}
// Registers one Vec occupies, and how many accumulators a register block of
// the linear kernel may keep (of 32 zmm).
constexpr int64_t kVecRegs = 1;
constexpr int64_t kAccRegs = 24;
#elif SSD_AVX2
// Two 8-lane halves; lane l of the 16 is lane l % 8 of half l / 8, so every
// lane sees the operations the 16-lane paths give it.
struct Vec {
  __m256 lo, hi;
};

inline Vec vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
// All-ones in lanes below n (n may be <= 0 or >= 8).
inline __m256i half_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::max<int64_t>(std::min<int64_t>(n, 8), 0))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 half_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Vec vload(const uint16_t* p) { return {half_bf16(p), half_bf16(p + 8)}; }
// F16C's conversion is exact (every half is a float).
inline __m256 half_fp16(const Fp16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline Vec vload(const Fp16* p) { return {half_fp16(p), half_fp16(p + 8)}; }
inline Vec vload_tail(const float* p, int64_t n) {
  return {_mm256_maskload_ps(p, half_mask(n)), _mm256_maskload_ps(p + 8, half_mask(n - 8))};
}
inline Vec vload_tail(const uint16_t* p, int64_t n) {
  uint16_t lanes[kLanes] = {};
  std::memcpy(lanes, p, static_cast<size_t>(n) * sizeof(uint16_t));
  return vload(lanes);
}
inline Vec vload_tail(const Fp16* p, int64_t n) {
  Fp16 lanes[kLanes] = {};
  std::memcpy(lanes, p, static_cast<size_t>(n) * sizeof(Fp16));
  return vload(lanes);
}
inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline __m256i half_bytes(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 half_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
template <bool High>
inline __m256 half_nibbles(const uint8_t* p) {
  const __m256i b = half_bytes(p);
  return _mm256_cvtepi32_ps(High ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(0x0f)));
}
inline Vec vload_i8(const uint8_t* p) { return {half_i8(p), half_i8(p + 8)}; }
inline Vec vload_u8(const uint8_t* p) { return {_mm256_cvtepi32_ps(half_bytes(p)), _mm256_cvtepi32_ps(half_bytes(p + 8))}; }
template <bool High>
inline Vec vload_nibbles(const uint8_t* p) { return {half_nibbles<High>(p), half_nibbles<High>(p + 8)}; }
// The pairwise tree of the other paths: lanes l + 8, then l + 4, l + 2, l + 1.
inline float vsum(Vec a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline void vpin(Vec& v) {
#if defined(__GNUC__)
  __asm__("" : "+x"(v.lo), "+x"(v.hi));
#endif
}
inline Vec vbroadcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline void vstore(float* p, Vec v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline void vstore_tail(float* p, Vec v, int64_t n) {
  _mm256_maskstore_ps(p, half_mask(n), v.lo);
  _mm256_maskstore_ps(p + 8, half_mask(n - 8), v.hi);
}
template <typename F>
inline Vec halves(Vec a, Vec b, F f) { return {f(a.lo, b.lo), f(a.hi, b.hi)}; }
inline Vec vsub(Vec a, Vec b) { return halves(a, b, [](__m256 x, __m256 y) { return _mm256_sub_ps(x, y); }); }
inline Vec vneg(Vec a) { return vsub(vzero(), a); }
inline Vec vdiv(Vec a, Vec b) { return halves(a, b, [](__m256 x, __m256 y) { return _mm256_div_ps(x, y); }); }
inline Vec vmul(Vec a, Vec b) { return halves(a, b, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, y); }); }
inline Vec vadd(Vec a, Vec b) { return halves(a, b, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); }); }
// 2^k for integer lanes k in [-126, 127].
inline __m256 pow2(__m256i k) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)); }
inline __m256 half_exp(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  // p * 2^n rounded once, as scalef does: n in [-150, 128] splits into two
  // halves whose powers are normal; the first product is exact.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(_mm256_sub_epi32(ni, n1)));
}
inline Vec vexp(Vec x) { return {half_exp(x.lo), half_exp(x.hi)}; }
constexpr int64_t kVecRegs = 2;
constexpr int64_t kAccRegs = 12;  // of 16 ymm
#else
struct Vec {
  float v[kLanes];
};
inline Vec vzero() { return Vec{}; }
template <typename T>
inline float lane_value(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, Fp16>) return fp16_to_float(p[i].bits);
  else if constexpr (sizeof(T) == 2) return bf16_to_float(p[i]);
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
inline Vec vload_i8(const uint8_t* p) {
  Vec r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>(static_cast<int8_t>(p[i]));
  return r;
}
inline Vec vload_u8(const uint8_t* p) {
  Vec r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
template <bool High>
inline Vec vload_nibbles(const uint8_t* p) {
  Vec r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>(High ? p[i] >> 4 : p[i] & 0x0f);
  return r;
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
inline Vec vneg(Vec a) { return vsub(vzero(), a); }
inline Vec vdiv(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x / y; }); }
inline Vec vmul(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x * y; }); }
inline Vec vadd(Vec a, Vec b) { return lanewise(a, b, [](float x, float y) { return x + y; }); }
inline float scalar_exp(float x) {
  if (std::isnan(x)) return x;
  x = std::fmin(kExpHi, std::fmax(kExpLo, x));
  const float n = std::nearbyint(x * kLog2e);
  float r = __builtin_fmaf(-n, kLn2Hi, x);
  r = __builtin_fmaf(-n, kLn2Lo, r);
  float p = kExpPoly[0];
  for (int i = 1; i < 8; ++i) p = __builtin_fmaf(p, r, kExpPoly[i]);
  const int ni = static_cast<int>(n), n1 = ni >> 1, n2 = ni - n1;
  const auto pow2 = [](int k) {
    const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  };
  return p * pow2(n1) * pow2(n2);
}
inline Vec vexp(Vec a) { return lanewise(a, a, [](float x, float) { return scalar_exp(x); }); }
constexpr int64_t kVecRegs = 1;
constexpr int64_t kAccRegs = 24;
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

}  // namespace ssd::kernels::SSD_ISA
