// Fork attention: one query per branch of a speculation tree. A branch sees
// the first prefix_len positions of its sequence in the paged cache, then its
// own path slots in order: the key order paged attention would use if the
// path sat in the cache right after the prefix, so both give the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "ops.h"
#include "row_runs.h"
#include "thread_pool.h"

namespace ssd::kernels {

struct ForkAttentionParams {
  PagedKv kv;                ///< the shared prefix pages (read only)
  const float* q = nullptr;  ///< [num_branches, ldq], num_heads * head_dim used
  int64_t ldq = 0;
  float* out = nullptr;  ///< [num_branches, ldo]
  int64_t ldo = 0;
  int64_t num_branches = 0;
  int64_t num_heads = 0;
  const int32_t* block_tables = nullptr;  ///< [num_seqs, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* branch_seq = nullptr;  ///< [num_branches] sequence (block table row) of each branch
  const int32_t* prefix_len = nullptr;  ///< [num_branches] >= 0
  const float* path_k = nullptr;        ///< [num_branches, max_path, num_kv_heads, head_dim]
  const float* path_v = nullptr;        ///< same shape as path_k
  int64_t max_path = 0;
  const int32_t* path_len = nullptr;  ///< [num_branches] in 1..max_path
  float scale = 1.0f;
};

/// Branches that share a pass over their prefix: runs of consecutive
/// branches of one sequence, at most this many.
constexpr int64_t kMaxSharedBranches = 16;

/// The runs of params.branch_seq that fork_attention_units works on.
std::vector<RowRun> fork_attention_runs(const ForkAttentionParams& params);

/// Computes units [begin, end) of runs.size() * num_kv_heads units; unit u is
/// run u / num_kv_heads with all query heads of kv head u % num_kv_heads.
/// Units are independent, and a branch's result does not depend on its run:
/// any split or grouping gives bitwise the same output.
void fork_attention_units(const ForkAttentionParams& params, const std::vector<RowRun>& runs, int64_t begin,
                          int64_t end);

/// All branches, split over the pool. Kept for the GPU tree; the runtime
/// does not call it yet (its draft tree decodes branches as paged paths).
void fork_attention(const ForkAttentionParams& params, ThreadPool& pool);

}  // namespace ssd::kernels
