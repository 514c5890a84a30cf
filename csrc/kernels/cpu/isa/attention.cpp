// Paged and fork attention's work units, compiled once per instruction set.
#include <algorithm>

#include "../isa.h"
#include "attention_softmax.h"

namespace ssd::kernels::SSD_ISA {

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

void fork_attention_units(const ForkAttentionParams& p, const std::vector<RowRun>& runs, int64_t begin,
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
    for (int64_t n = run.first; n < run.first + run.count; ++n)
      scratch.rows.push_back({p.q + n * p.ldq + first_head, p.out + n * p.ldo + first_head,
                              int64_t{p.prefix_len[n]} + p.path_len[n]});
    const int32_t* table = p.block_tables + p.branch_seq[run.first] * p.max_blocks;
    const float* k = kv.k + kv_head * d;
    const float* v = kv.v + kv_head * d;
    // Key i of branch run.first + r: prefix position i, then path slot i - prefix.
    const auto offset = [&](int64_t r, int64_t i) {
      const int64_t n = run.first + r;
      const int64_t prefix = p.prefix_len[n];
      if (i < prefix) return slot_of(table, i, kv.block_size) * row;
      return (n * p.max_path + i - prefix) * row;
    };
    const auto in_prefix = [&](int64_t r, int64_t i) { return i < p.prefix_len[run.first + r]; };
    const float* path_k = p.path_k + kv_head * d;
    const float* path_v = p.path_v + kv_head * d;
    const auto key_at = [&](int64_t r, int64_t i) { return (in_prefix(r, i) ? k : path_k) + offset(r, i); };
    const auto value_at = [&](int64_t r, int64_t i) { return (in_prefix(r, i) ? v : path_v) + offset(r, i); };
    attend_rows(scratch, group, d, p.scale, key_at, value_at);
  }
}

}  // namespace ssd::kernels::SSD_ISA
