#include "paged_attention.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "bf16.h"
#include "isa.h"

namespace ssd::kernels {

void kv_write(const PagedKv& kv, const float* k, const float* v, int64_t ld, int64_t tokens,
              const int32_t* seq_of_token, const int32_t* positions, const int32_t* block_tables,
              int64_t max_blocks) {
  const int64_t row = kv.num_kv_heads * kv.head_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* table = block_tables + seq_of_token[t] * max_blocks;
    if (table[positions[t] / kv.block_size] < 0) continue;  // padding: no block
    const int64_t slot = slot_of(table, positions[t], kv.block_size);
    if (kv.bf16()) {
      for (int64_t i = 0; i < row; ++i) {
        kv.k_bf16[slot * row + i] = float_to_bf16(k[t * ld + i]);
        kv.v_bf16[slot * row + i] = float_to_bf16(v[t * ld + i]);
      }
      continue;
    }
    std::memcpy(kv.k + slot * row, k + t * ld, sizeof(float) * row);
    std::memcpy(kv.v + slot * row, v + t * ld, sizeof(float) * row);
  }
}

AttentionPlan attention_plan_over(const PagedAttentionParams& p, std::vector<RowRun> runs) {
  std::vector<int64_t> first(static_cast<size_t>(p.tokens), 0), end(first);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int32_t* table = p.block_tables + p.seq_of_token[t] * p.max_blocks;
    if (table[p.positions[t] / p.kv.block_size] < 0) continue;  // padding: no keys
    end[t] = p.positions[t] + 1;
    first[t] = window_first_key(end[t], p.window);
  }
  return attention_plan(std::move(runs), first, end, p.num_heads, p.kv.head_dim);
}

AttentionPlan paged_attention_plan(const PagedAttentionParams& p) {
  return attention_plan_over(p, same_sequence_runs(p.seq_of_token, p.tokens, kMaxSharedRows));
}

void paged_attention_units(const PagedAttentionParams& p, AttentionPlan& plan, int64_t begin, int64_t end) {
  SSD_ON_ACTIVE_ISA(paged_attention_units(p, plan, begin, end))
}

void paged_attention(const PagedKv& kv, const float* q, int64_t ldq, float* out, int64_t ldo,
                     int64_t tokens, int64_t num_heads, const int32_t* seq_of_token,
                     const int32_t* positions, const int32_t* block_tables, int64_t max_blocks,
                     float scale, int64_t window, ThreadPool& pool) {
  const PagedAttentionParams params{kv, q, ldq, out, ldo, tokens, num_heads, seq_of_token, positions,
                                    block_tables, max_blocks, scale, window};
  AttentionPlan plan = paged_attention_plan(params);
  run_attention(
      plan, kv.num_kv_heads, tokens, out, ldo, num_heads, kv.head_dim,
      [&](int64_t count, const auto& fn) { pool.parallel_for(count, 1, fn); },
      [&](AttentionPlan& pl, int64_t begin, int64_t end) { paged_attention_units(params, pl, begin, end); });
}

}  // namespace ssd::kernels
