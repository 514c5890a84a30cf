// Paged and fork attention's work units, compiled once per instruction set.
#include <algorithm>
#include <utility>
#include <vector>

#include "../isa.h"
#include "attention_softmax.h"

namespace ssd::kernels::SSD_ISA {

namespace {

/// One work unit: a run of query rows with the query heads of one kv head,
/// over a cache of T (float, or uint16_t for bf16).
template <typename T>
struct Unit {
  const RowRun& run;
  int64_t kv_head;
  int64_t group;       ///< query heads per kv head
  int64_t d;           ///< head_dim
  int64_t row;         ///< values per cache slot (all kv heads)
  int64_t first_head;  ///< offset of the unit's first query head in a q / out row
  const T* k;          ///< the kv head's K / V columns in the cache
  const T* v;
};

/// body(unit, scratch, i) for units [begin, end) of (number of pieces) *
/// num_kv_heads, unit u serving piece i = u / num_kv_heads whose run is
/// run_of(i), over the cache k / v; the scratch comes with no rows.
template <typename T, typename RunOf, typename Body>
void for_each_unit(const PagedKv& kv, const T* k, const T* v, int64_t num_heads, RunOf run_of, int64_t begin,
                   int64_t end, Body body) {
  const int64_t group = num_heads / kv.num_kv_heads, d = kv.head_dim;
  AttentionScratch scratch;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t kv_head = u % kv.num_kv_heads, piece = u / kv.num_kv_heads;
    scratch.rows.clear();
    scratch.tokens.clear();
    body(Unit<T>{run_of(piece), kv_head, group, d, kv.num_kv_heads * d, kv_head * group * d, k + kv_head * d,
                 v + kv_head * d},
         scratch, piece);
  }
}

/// The query rows of unit u (piece `piece`) for attend_rows: each row t of
/// the piece's run attending to keys of the piece's split, over those keys
/// (range(t) -> {first key, end}); a row whose keys lie in this one split
/// writes its output, the others a partial row for attention_combine.
/// scratch.tokens[r] is the query row (token, branch) of scratch row r.
template <typename T, typename Range>
void add_split_rows(AttentionPlan& plan, const Unit<T>& u, int64_t piece, int64_t num_heads, const float* q,
                    int64_t ldq, float* out, int64_t ldo, Range range, AttentionScratch& scratch) {
  const int64_t split = plan.pieces[piece].split;
  const int64_t split_begin = split * kSplitKeys, split_end = split_begin + kSplitKeys;
  for (int64_t t = u.run.first; t < u.run.first + u.run.count; ++t) {
    const int64_t splits = plan.num_splits[t];
    if (splits == 0 || split < plan.first_split[t] || split >= plan.first_split[t] + splits) continue;
    const auto [first_key, end] = range(t);
    const float* q_row = q + t * ldq + u.first_head;
    scratch.tokens.push_back(t);
    const int64_t row = plan.partial_row_of(t, split, u.first_head / u.d, num_heads);
    if (row < 0) {
      scratch.rows.push_back({q_row, out + t * ldo + u.first_head, end, first_key});
      continue;
    }
    scratch.rows.push_back({q_row, plan.partial.data() + row * u.d, std::min(end, split_end),
                            std::max(first_key, split_begin), plan.partial_max.data() + row,
                            plan.partial_denom.data() + row});
  }
}

/// Units [begin, end) of paged attention over the cache of T; slot_of_key(t,
/// table, pos) is the cache slot of query row t's key at position pos, `table`
/// being the row's run's block table (the same for every row of a run).
template <typename T, typename SlotOfKey>
void paged_units(const PagedAttentionParams& p, const T* k, const T* v, AttentionPlan& plan, int64_t begin,
                 int64_t end, const int32_t* run_seq, SlotOfKey slot_of_key) {
  const PagedKv& kv = p.kv;
  const auto run_of = [&](int64_t piece) -> const RowRun& { return plan.runs[plan.pieces[piece].run]; };
  for_each_unit(kv, k, v, p.num_heads, run_of, begin, end,
                [&](const Unit<T>& u, AttentionScratch& scratch, int64_t piece) {
    const auto range = [&](int64_t t) {
      const int64_t n = p.positions[t] + 1;
      return std::pair<int64_t, int64_t>{window_first_key(n, p.window), n};
    };
    add_split_rows(plan, u, piece, p.num_heads, p.q, p.ldq, p.out, p.ldo, range, scratch);
    if (scratch.rows.empty()) return;
    const std::vector<int64_t>& token_of = scratch.tokens;  // scratch row r serves query row token_of[r]
    const int32_t* table = p.block_tables + run_seq[u.run.first] * p.max_blocks;
    const auto key_at = [&](int64_t r, int64_t pos) { return u.k + slot_of_key(token_of[r], table, pos) * u.row; };
    const auto value_at = [&](int64_t r, int64_t pos) { return u.v + slot_of_key(token_of[r], table, pos) * u.row; };
    attend_rows(scratch, u.group, u.d, p.scale, key_at, value_at);
  });
}

/// Both kernels over the cache's type.
template <typename SlotOfKey>
void units_over_cache(const PagedAttentionParams& p, AttentionPlan& plan, int64_t begin, int64_t end,
                      const int32_t* run_seq, SlotOfKey slot_of_key) {
  if (p.kv.bf16())
    paged_units<uint16_t>(p, p.kv.k_bf16, p.kv.v_bf16, plan, begin, end, run_seq, slot_of_key);
  else
    paged_units<float>(p, p.kv.k, p.kv.v, plan, begin, end, run_seq, slot_of_key);
}

}  // namespace

void paged_attention_units(const PagedAttentionParams& p, AttentionPlan& plan, int64_t begin, int64_t end) {
  // A run is one sequence's rows: every key through the run's table.
  const int64_t bs = p.kv.block_size;
  units_over_cache(p, plan, begin, end, p.seq_of_token,
                   [bs](int64_t, const int32_t* table, int64_t pos) { return slot_of(table, pos, bs); });
}

void fork_attention_units(const ForkAttentionParams& p, AttentionPlan& plan, int64_t begin, int64_t end) {
  // A run is rows forking from one sequence (its table): keys below the
  // row's fork through it, the rest through the row's own table.
  const PagedAttentionParams& g = p.paged;
  const int64_t bs = g.kv.block_size;
  units_over_cache(g, plan, begin, end, p.prefix_seq, [&g, &p, bs](int64_t t, const int32_t* prefix, int64_t pos) {
    if (pos < p.prefix_len[t]) return slot_of(prefix, pos, bs);
    return slot_of(g.block_tables + g.seq_of_token[t] * g.max_blocks, pos, bs);
  });
}

}  // namespace ssd::kernels::SSD_ISA
