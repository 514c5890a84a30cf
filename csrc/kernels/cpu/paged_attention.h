// Paged attention over a range of work units, for callers that bring their
// own parallel loop (the torch glue uses ATen's). ops.h's paged_attention runs
// the same units on a ThreadPool.
#pragma once

#include <cstdint>
#include <vector>

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

/// The runs of params.seq_of_token that paged_attention_units works on.
std::vector<RowRun> paged_attention_runs(const PagedAttentionParams& params);

/// Computes units [begin, end) of runs.size() * num_kv_heads units; unit u is
/// run u / num_kv_heads with all query heads of kv head u % num_kv_heads.
/// Units are independent, and a query's result does not depend on its run:
/// any split or grouping gives bitwise the same output.
void paged_attention_units(const PagedAttentionParams& params, const std::vector<RowRun>& runs, int64_t begin,
                           int64_t end);

}  // namespace ssd::kernels
