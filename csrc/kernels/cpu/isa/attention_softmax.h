// The softmax-attention loop shared by paged and fork attention. Each query
// head sees its keys in the order key first, ..., n - 1 (first > 0 only under
// a sliding window): scores and their max, then exp and the denominator in
// key order, then the value sum in key order, then one multiply by
// 1 / denominator. A row's result depends only on that
// order, never on batching, on which rows share a pass, or on threads; the
// model's batch invariance relies on it bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../bf16.h"
#include "../row_runs.h"
#include "vec.h"

namespace ssd::kernels::SSD_ISA {

// Cache lines of a key or value row are requested this many keys ahead:
// rows of a paged cache are scattered, so the hardware prefetcher cannot
// follow them and each row would otherwise cost a full memory round trip.
constexpr int64_t kPrefetchAhead = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t d) {
  for (int64_t i = 0; i < d; i += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(row + i);
}

// One cache value as fp32 (the cache holds fp32, or bf16 bits as uint16_t).
inline float value_of(float x) { return x; }
inline float value_of(uint16_t x) { return bf16_to_float(x); }

// Keys per register-blocked step of the value sum.
constexpr int64_t kValueTile = 16;

// o[i] = fma(w[p * w_stride], vals[p][i], o[i]) for p = 0..count-1 in order,
// for NV 16-lane slices of o held in registers across the p loop (NV
// independent chains, so the FMA latency overlaps).
template <int NV, typename T>
inline void accumulate_slices(float* o, const float* w, int64_t w_stride, const T* const* vals, int64_t count,
                              int64_t offset) {
  Vec acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = vload(o + j * kLanes);
  for (int64_t p = 0; p < count; ++p) {
    const Vec wp = vbroadcast(w[p * w_stride]);
    const T* v = vals[p] + offset;
    for (int j = 0; j < NV; ++j) acc[j] = vfma(wp, vload(v + j * kLanes), acc[j]);
  }
  for (int j = 0; j < NV; ++j) vstore(o + j * kLanes, acc[j]);
}

template <typename T>
inline void accumulate_values(float* o, int64_t d, const float* w, int64_t w_stride, const T* const* vals,
                              int64_t count) {
  int64_t i = 0;
  if constexpr (kVecRegs == 1)  // 8 slices are 16 registers where a Vec takes two
    for (; i + 8 * kLanes <= d; i += 8 * kLanes) accumulate_slices<8>(o + i, w, w_stride, vals, count, i);
  for (; i + 4 * kLanes <= d; i += 4 * kLanes) accumulate_slices<4>(o + i, w, w_stride, vals, count, i);
  for (; i + 2 * kLanes <= d; i += 2 * kLanes) accumulate_slices<2>(o + i, w, w_stride, vals, count, i);
  for (; i + kLanes <= d; i += kLanes) accumulate_slices<1>(o + i, w, w_stride, vals, count, i);
  for (; i < d; ++i) {
    float acc = o[i];
    for (int64_t p = 0; p < count; ++p) acc = std::fma(w[p * w_stride], value_of(vals[p][i]), acc);
    o[i] = acc;
  }
}

// Scores of `heads` query heads (head h at q + h * C * 16) against one key,
// each in dot()'s operation order; the key's C chunks are loaded once for all
// heads.
template <int C, typename T>
inline void head_scores(const float* q, int64_t heads, const T* key, float scale, float* scores,
                        float* max_score) {
  Vec k[C];
  for (int c = 0; c < C; ++c) k[c] = vload(key + c * kLanes);
  for (int64_t h = 0; h < heads; ++h) {
    Vec acc = vzero();
    for (int c = 0; c < C; ++c) acc = vfma(vload(q + (h * C + c) * kLanes), k[c], acc);
    scores[h] = vsum(acc) * scale;
    max_score[h] = std::max(max_score[h], scores[h]);
  }
}

/// One query row: `heads` query heads of one GQA group (head h at q + h * d,
/// out + h * d) attending to keys first..n - 1 (0 <= first < n).
struct QueryRow {
  const float* q;
  float* out;
  int64_t n;
  int64_t first = 0;
  /// Non-null: a partial row (one split of the keys). out gets the
  /// unnormalised value sum, max_out[h] / denom_out[h] head h's score max and
  /// sum of exponentials, for the caller to combine with other splits.
  float* max_out = nullptr;
  float* denom_out = nullptr;
};

/// Scratch space of attend_rows, reused between calls.
struct AttentionScratch {
  std::vector<QueryRow> rows;
  std::vector<int64_t> tokens;  // the caller's index of each row (attend_rows does not read it)
  std::vector<float> scores;  // [max n, rows * heads], key-major
  std::vector<float> max_score;
  std::vector<float> denom;
};

/// Attention of several query rows whose keys are mostly the same rows of
/// memory (queries of one sequence, branches of one prefix), so each key row
/// is read once per pass for all of them. key_at(r, p) / value_at(r, p):
/// the d-value K / V rows of key p of query row r (float, or bf16 bits as
/// uint16_t: each value widened to fp32 exactly, then the same arithmetic).
template <typename KeyAt, typename ValueAt>
void attend_rows(AttentionScratch& s, int64_t heads, int64_t d, float scale, KeyAt key_at, ValueAt value_at) {
  const int64_t num_rows = static_cast<int64_t>(s.rows.size());
  const int64_t cols = num_rows * heads;
  int64_t widest = 0;
  for (int64_t r = 1; r < num_rows; ++r)
    if (s.rows[r].n > s.rows[widest].n) widest = r;
  const int64_t n_max = s.rows[widest].n;
  int64_t p_min = n_max;  // the first key any row attends to
  for (const QueryRow& row : s.rows) p_min = std::min(p_min, row.first);
  const auto attends = [&](int64_t r, int64_t p) { return p >= s.rows[r].first && p < s.rows[r].n; };
  // Key p's scores at scores + (p - p_min) * cols.
  s.scores.resize(static_cast<size_t>((n_max - p_min) * cols));
  s.max_score.assign(static_cast<size_t>(cols), -std::numeric_limits<float>::infinity());
  s.denom.assign(static_cast<size_t>(cols), 0.0f);
  for (int64_t p = p_min; p < n_max; ++p) {
    if (p + kPrefetchAhead < n_max) prefetch_row(key_at(widest, p + kPrefetchAhead), d);
    float* scores = s.scores.data() + (p - p_min) * cols;
    for (int64_t r = 0; r < num_rows; ++r) {
      if (!attends(r, p)) continue;
      const auto* key = key_at(r, p);
      float* row_scores = scores + r * heads;
      float* row_max = s.max_score.data() + r * heads;
      if (d == 4 * kLanes) {
        head_scores<4>(s.rows[r].q, heads, key, scale, row_scores, row_max);
      } else if (d == 8 * kLanes) {
        head_scores<8>(s.rows[r].q, heads, key, scale, row_scores, row_max);
      } else {
        for (int64_t h = 0; h < heads; ++h) {
          row_scores[h] = dot(s.rows[r].q + h * d, key, d) * scale;
          row_max[h] = std::max(row_max[h], row_scores[h]);
        }
      }
    }
  }
  for (int64_t p = p_min; p < n_max; ++p) {
    float* scores = s.scores.data() + (p - p_min) * cols;
    // exp over the whole key row, 16 columns at a time (entries of rows that
    // do not attend to key p are computed and never read).
    for (int64_t c = 0; c < cols; c += kLanes) {
      const int64_t len = std::min(kLanes, cols - c);
      vstore_tail(scores + c, vexp(vsub(vload_tail(scores + c, len), vload_tail(s.max_score.data() + c, len))), len);
    }
    for (int64_t r = 0; r < num_rows; ++r) {
      if (!attends(r, p)) continue;
      for (int64_t c = r * heads; c < (r + 1) * heads; ++c) s.denom[c] += scores[c];
    }
  }
  for (const QueryRow& row : s.rows) std::fill(row.out, row.out + heads * d, 0.0f);
  std::remove_cv_t<std::remove_pointer_t<decltype(value_at(0, 0))>> const* vals[kValueTile];
  for (int64_t p0 = p_min; p0 < n_max; p0 += kValueTile) {
    const int64_t p1 = std::min(n_max, p0 + kValueTile);
    for (int64_t p = p1; p < std::min(n_max, p1 + kValueTile); ++p) prefetch_row(value_at(widest, p), d);
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t begin = std::max(p0, s.rows[r].first), end = std::min(p1, s.rows[r].n);
      if (begin >= end) continue;
      for (int64_t p = begin; p < end; ++p) vals[p - begin] = value_at(r, p);
      for (int64_t h = 0; h < heads; ++h)
        accumulate_values(s.rows[r].out + h * d, d, s.scores.data() + (begin - p_min) * cols + r * heads + h, cols, vals,
                          end - begin);
    }
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    if (s.rows[r].max_out != nullptr) {  // a partial row: the caller normalises
      std::copy_n(s.max_score.data() + r * heads, heads, s.rows[r].max_out);
      std::copy_n(s.denom.data() + r * heads, heads, s.rows[r].denom_out);
      continue;
    }
    for (int64_t h = 0; h < heads; ++h) {
      const float inv = 1.0f / s.denom[r * heads + h];
      float* o = s.rows[r].out + h * d;
      for (int64_t i = 0; i < d; ++i) o[i] *= inv;
    }
  }
}

}  // namespace ssd::kernels::SSD_ISA
