// Paged and fork attention's work units, compiled once per instruction set.
#include <algorithm>

#include "../isa.h"
#include "attention_softmax.h"

namespace ssd::kernels::SSD_ISA {

namespace {

/// One work unit: a run of query rows with the query heads of one kv head.
struct Unit {
  const RowRun& run;
  int64_t kv_head;
  int64_t group;       ///< query heads per kv head
  int64_t d;           ///< head_dim
  int64_t row;         ///< floats per cache slot (all kv heads)
  int64_t first_head;  ///< offset of the unit's first query head in a q / out row
  const float* k;      ///< the kv head's K / V columns in the cache
  const float* v;
};

/// body(unit, scratch) for units [begin, end) of runs.size() * num_kv_heads;
/// the scratch comes with no rows.
template <typename Body>
void for_each_unit(const PagedKv& kv, int64_t num_heads, const std::vector<RowRun>& runs, int64_t begin, int64_t end,
                   Body body) {
  const int64_t group = num_heads / kv.num_kv_heads, d = kv.head_dim;
  AttentionScratch scratch;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t kv_head = u % kv.num_kv_heads;
    scratch.rows.clear();
    body(Unit{runs[u / kv.num_kv_heads], kv_head, group, d, kv.num_kv_heads * d, kv_head * group * d,
              kv.k + kv_head * d, kv.v + kv_head * d},
         scratch);
  }
}

}  // namespace

void paged_attention_units(const PagedAttentionParams& p, const std::vector<RowRun>& runs, int64_t begin,
                           int64_t end) {
  const PagedKv& kv = p.kv;
  for_each_unit(kv, p.num_heads, runs, begin, end, [&](const Unit& u, AttentionScratch& scratch) {
    const RowRun& run = u.run;
    const int32_t* table = p.block_tables + p.seq_of_token[run.first] * p.max_blocks;
    for (int64_t t = run.first; t < run.first + run.count; ++t) {
      if (table[p.positions[t] / kv.block_size] < 0) {  // padding: attends to nothing
        std::fill_n(p.out + t * p.ldo + u.first_head, u.group * u.d, 0.0f);
        continue;
      }
      const int64_t n = p.positions[t] + 1;
      const int64_t first_key = p.window > 0 ? std::max<int64_t>(0, n - p.window) : 0;
      scratch.rows.push_back({p.q + t * p.ldq + u.first_head, p.out + t * p.ldo + u.first_head, n, first_key});
    }
    if (scratch.rows.empty()) return;
    const auto key_at = [&](int64_t, int64_t pos) { return u.k + slot_of(table, pos, kv.block_size) * u.row; };
    const auto value_at = [&](int64_t, int64_t pos) { return u.v + slot_of(table, pos, kv.block_size) * u.row; };
    attend_rows(scratch, u.group, u.d, p.scale, key_at, value_at);
  });
}

void fork_attention_units(const ForkAttentionParams& p, const std::vector<RowRun>& runs, int64_t begin,
                          int64_t end) {
  const PagedKv& kv = p.kv;
  for_each_unit(kv, p.num_heads, runs, begin, end, [&](const Unit& u, AttentionScratch& scratch) {
    const RowRun& run = u.run;
    for (int64_t n = run.first; n < run.first + run.count; ++n)
      scratch.rows.push_back({p.q + n * p.ldq + u.first_head, p.out + n * p.ldo + u.first_head,
                              int64_t{p.prefix_len[n]} + p.path_len[n]});
    const int32_t* table = p.block_tables + p.branch_seq[run.first] * p.max_blocks;
    // Key i of branch run.first + r: prefix position i, then path slot i - prefix.
    const auto offset = [&](int64_t r, int64_t i) {
      const int64_t n = run.first + r;
      const int64_t prefix = p.prefix_len[n];
      if (i < prefix) return slot_of(table, i, kv.block_size) * u.row;
      return (n * p.max_path + i - prefix) * u.row;
    };
    const auto in_prefix = [&](int64_t r, int64_t i) { return i < p.prefix_len[run.first + r]; };
    const float* path_k = p.path_k + u.kv_head * u.d;
    const float* path_v = p.path_v + u.kv_head * u.d;
    const auto key_at = [&](int64_t r, int64_t i) { return (in_prefix(r, i) ? u.k : path_k) + offset(r, i); };
    const auto value_at = [&](int64_t r, int64_t i) { return (in_prefix(r, i) ? u.v : path_v) + offset(r, i); };
    attend_rows(scratch, u.group, u.d, p.scale, key_at, value_at);
  });
}

}  // namespace ssd::kernels::SSD_ISA
