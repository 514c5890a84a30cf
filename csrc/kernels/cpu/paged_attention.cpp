#include "paged_attention.h"

#include <algorithm>
#include <cstring>

namespace ssd::kernels {

void kv_write(const PagedKv& kv, const float* k, const float* v, int64_t ld, int64_t tokens,
              const int32_t* seq_of_token, const int32_t* positions, const int32_t* block_tables,
              int64_t max_blocks) {
  const int64_t row = kv.num_kv_heads * kv.head_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* table = block_tables + seq_of_token[t] * max_blocks;
    if (table[positions[t] / kv.block_size] < 0) continue;  // padding: no block
    const int64_t slot = slot_of(table, positions[t], kv.block_size);
    std::memcpy(kv.k + slot * row, k + t * ld, sizeof(float) * row);
    std::memcpy(kv.v + slot * row, v + t * ld, sizeof(float) * row);
  }
}

std::vector<RowRun> paged_attention_runs(const PagedAttentionParams& p) {
  return same_sequence_runs(p.seq_of_token, p.tokens, kMaxSharedRows);
}

void paged_attention_units(const PagedAttentionParams& p, const std::vector<RowRun>& runs, int64_t begin,
                           int64_t end) {
  const PagedKv& kv = p.kv;
  const int64_t group = p.num_heads / kv.num_kv_heads;
  const int64_t d = kv.head_dim;
  const int64_t row = kv.num_kv_heads * d;
  AttentionScratch scratch;
  for (int64_t unit = begin; unit < end; ++unit) {
    const RowRun& run = runs[unit / kv.num_kv_heads];
    const int64_t kv_head = unit % kv.num_kv_heads;
    const int64_t first_head = kv_head * group * d;
    scratch.rows.clear();
    const int32_t* table = p.block_tables + p.seq_of_token[run.first] * p.max_blocks;
    for (int64_t t = run.first; t < run.first + run.count; ++t) {
      if (table[p.positions[t] / kv.block_size] < 0) {  // padding: attends to nothing
        std::fill_n(p.out + t * p.ldo + first_head, group * d, 0.0f);
        continue;
      }
      const int64_t n = p.positions[t] + 1;
      const int64_t first_key = p.window > 0 ? std::max<int64_t>(0, n - p.window) : 0;
      scratch.rows.push_back({p.q + t * p.ldq + first_head, p.out + t * p.ldo + first_head, n, first_key});
    }
    if (scratch.rows.empty()) continue;
    const float* k = kv.k + kv_head * d;
    const float* v = kv.v + kv_head * d;
    const auto key_at = [&](int64_t, int64_t pos) { return k + slot_of(table, pos, kv.block_size) * row; };
    const auto value_at = [&](int64_t, int64_t pos) { return v + slot_of(table, pos, kv.block_size) * row; };
    attend_rows(scratch, group, d, p.scale, key_at, value_at);
  }
}

void paged_attention(const PagedKv& kv, const float* q, int64_t ldq, float* out, int64_t ldo,
                     int64_t tokens, int64_t num_heads, const int32_t* seq_of_token,
                     const int32_t* positions, const int32_t* block_tables, int64_t max_blocks,
                     float scale, int64_t window, ThreadPool& pool) {
  const PagedAttentionParams params{kv, q, ldq, out, ldo, tokens, num_heads, seq_of_token, positions,
                                    block_tables, max_blocks, scale, window};
  const std::vector<RowRun> runs = paged_attention_runs(params);
  pool.parallel_for(static_cast<int64_t>(runs.size()) * kv.num_kv_heads, 1,
                    [&](int64_t begin, int64_t end) { paged_attention_units(params, runs, begin, end); });
}

}  // namespace ssd::kernels
