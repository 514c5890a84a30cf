#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace ssd::kernels {

namespace {

inline int64_t slot_of(const int32_t* table, int64_t pos, int64_t block_size) {
  return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
}

// One query head against keys 0..last of one sequence.
void attend_one(const PagedKv& kv, const float* q, float* out, int64_t kv_head,
                const int32_t* table, int64_t last, float scale, std::vector<float>& scores) {
  const int64_t d = kv.head_dim;
  const int64_t row = kv.num_kv_heads * d;
  scores.resize(static_cast<size_t>(last + 1));
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p <= last; ++p) {
    const float* key = kv.k + slot_of(table, p, kv.block_size) * row + kv_head * d;
    const float s = dot(q, key, d) * scale;
    scores[p] = s;
    max_score = std::max(max_score, s);
  }
  float denom = 0.0f;
  for (int64_t p = 0; p <= last; ++p) {
    scores[p] = std::exp(scores[p] - max_score);
    denom += scores[p];
  }
  std::fill(out, out + d, 0.0f);
  for (int64_t p = 0; p <= last; ++p) {
    const float* val = kv.v + slot_of(table, p, kv.block_size) * row + kv_head * d;
    const float w = scores[p];
    for (int64_t i = 0; i < d; ++i) out[i] = std::fma(w, val[i], out[i]);
  }
  const float inv = 1.0f / denom;
  for (int64_t i = 0; i < d; ++i) out[i] *= inv;
}

}  // namespace

void kv_write(const PagedKv& kv, const float* k, const float* v, int64_t ld, int64_t tokens,
              const int32_t* seq_of_token, const int32_t* positions, const int32_t* block_tables,
              int64_t max_blocks) {
  const int64_t row = kv.num_kv_heads * kv.head_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* table = block_tables + seq_of_token[t] * max_blocks;
    const int64_t slot = slot_of(table, positions[t], kv.block_size);
    std::memcpy(kv.k + slot * row, k + t * ld, sizeof(float) * row);
    std::memcpy(kv.v + slot * row, v + t * ld, sizeof(float) * row);
  }
}

void paged_attention(const PagedKv& kv, const float* q, int64_t ldq, float* out, int64_t ldo,
                     int64_t tokens, int64_t num_heads, const int32_t* seq_of_token,
                     const int32_t* positions, const int32_t* block_tables, int64_t max_blocks,
                     float scale, ThreadPool& pool) {
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t d = kv.head_dim;
  pool.parallel_for(tokens * num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t t = idx / num_heads;
      const int64_t h = idx % num_heads;
      const int32_t* table = block_tables + seq_of_token[t] * max_blocks;
      attend_one(kv, q + t * ldq + h * d, out + t * ldo + h * d, h / group, table, positions[t],
                 scale, scores);
    }
  });
}

}  // namespace ssd::kernels
