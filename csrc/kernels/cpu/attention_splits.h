// Attention over fixed splits of the key range, shared by paged and fork
// attention: a query's keys 0, 1, ... are cut at multiples of kSplitKeys, the
// splits of every query are computed as independent work units, and a query
// spanning several splits gets their partial results combined in split
// order. A query's result therefore depends on its own keys only, never on
// the batch, on the queries it shares a pass with, or on the threads; one
// whose keys lie in a single split is computed exactly as without splits.
#pragma once

#include <cstdint>
#include <vector>

#include "../key_splits.h"
#include "row_runs.h"

namespace ssd::kernels {

/// The work of one attention call. Work unit u is piece u / num_kv_heads (a
/// run of query rows and one split of keys) with all query heads of kv head
/// u % num_kv_heads.
struct AttentionPlan {
  struct Piece {
    int64_t run;    ///< index into runs
    int64_t split;  ///< absolute split index
  };
  std::vector<RowRun> runs;
  std::vector<Piece> pieces;
  /// Per query row: its first split, its number of splits (0: padding,
  /// attends to nothing) and, with more than one, its first partial row.
  std::vector<int64_t> first_split, num_splits, partial_row;
  /// Partial row partial_row[t] + (split - first_split[t]) * num_heads +
  /// head: the split's unnormalised output [head_dim], its score max and its
  /// sum of exponentials.
  std::vector<float> partial, partial_max, partial_denom;
  /// Whether any row is padding or spans several splits (else
  /// attention_combine has nothing to do).
  bool needs_combine = false;

  int64_t num_units(int64_t num_kv_heads) const { return static_cast<int64_t>(pieces.size()) * num_kv_heads; }
  /// The partial row of query row t's split `split`, head `head`; -1 when t
  /// has no partial rows (it writes its output directly).
  int64_t partial_row_of(int64_t t, int64_t split, int64_t head, int64_t num_heads) const {
    return num_splits[t] > 1 ? partial_row[t] + (split - first_split[t]) * num_heads + head : -1;
  }
};

/// Query row t attends to keys [first[t], end[t]) (end 0: padding).
AttentionPlan attention_plan(std::vector<RowRun> runs, const std::vector<int64_t>& first,
                             const std::vector<int64_t>& end, int64_t num_heads, int64_t head_dim);

/// After every unit: rows [begin, end) spanning several splits get their
/// combined output (their splits merged in order), padding rows zeros; the
/// others were written by their unit. out: [rows, ldo], num_heads * head_dim used.
void attention_combine(const AttentionPlan& plan, float* out, int64_t ldo, int64_t num_heads, int64_t head_dim,
                       int64_t begin, int64_t end);

/// One attention call over its plan: units(begin, end) for every work unit,
/// then attention_combine over the `rows` query rows where needed, each
/// phase through parallel_for(count, fn) (the caller's thread pool).
template <typename ParallelFor, typename Units>
void run_attention(AttentionPlan& plan, int64_t num_kv_heads, int64_t rows, float* out, int64_t ldo,
                   int64_t num_heads, int64_t head_dim, ParallelFor parallel_for, Units units) {
  parallel_for(plan.num_units(num_kv_heads), [&](int64_t begin, int64_t end) { units(plan, begin, end); });
  if (plan.needs_combine)
    parallel_for(rows, [&](int64_t begin, int64_t end) {
      attention_combine(plan, out, ldo, num_heads, head_dim, begin, end);
    });
}

}  // namespace ssd::kernels
