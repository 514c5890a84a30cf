// Paged attention over a range of work units, for callers that bring their
// own parallel loop (the torch glue uses ATen's). ops.h's paged_attention runs
// the same units on a ThreadPool.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_splits.h"
#include "ops.h"
#include "row_runs.h"

namespace ssd::kernels {

struct PagedAttentionParams {
  PagedKv kv;
  const float* q = nullptr;  ///< [tokens, ldq], num_heads * head_dim used
  int64_t ldq = 0;
  float* out = nullptr;  ///< [tokens, ldo]
  int64_t ldo = 0;
  int64_t tokens = 0;
  int64_t num_heads = 0;
  const int32_t* seq_of_token = nullptr;  ///< [tokens]
  const int32_t* positions = nullptr;     ///< [tokens]
  const int32_t* block_tables = nullptr;  ///< [num_seqs, max_blocks]
  int64_t max_blocks = 0;
  float scale = 1.0f;
  int64_t window = 0;  ///< > 0: query at position p attends keys p - window + 1..p only
};

/// Tokens that share a pass over their sequence's keys: runs of consecutive
/// tokens of one sequence (a prefill or verify chunk), at most this many.
constexpr int64_t kMaxSharedRows = 16;

/// The runs (of at most kMaxSharedRows tokens), pieces and partial rows of a
/// call (attention_splits.h; host work, no attention).
AttentionPlan paged_attention_plan(const PagedAttentionParams& params);
/// The same with the rows grouped into `runs` (fork attention groups them by
/// the sequence they fork from): query t attends to its positions' keys,
/// none when its own entry is -1.
AttentionPlan attention_plan_over(const PagedAttentionParams& params, std::vector<RowRun> runs);

/// Computes units [begin, end) of plan.num_units(num_kv_heads). Units are
/// independent, and a query's result does not depend on its run: any split
/// or grouping of units gives bitwise the same output.
/// Then attention_combine over the tokens where plan.needs_combine.
void paged_attention_units(const PagedAttentionParams& params, AttentionPlan& plan, int64_t begin, int64_t end);

}  // namespace ssd::kernels
