// Fork attention: one query per branch of a speculation tree. A branch sees
// the first prefix_len positions of its sequence in the paged cache, then its
// own path slots in order: the key order paged attention would use if the
// path sat in the cache right after the prefix, so both give the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_splits.h"
#include "ops.h"
#include "row_runs.h"
#include "thread_pool.h"

namespace ssd::kernels {

struct ForkAttentionParams {
  PagedKv kv;                ///< the shared prefix pages (read only; fp32)
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

/// The runs (of at most kMaxSharedBranches branches), pieces and partial
/// rows of a call (attention_splits.h); a branch's keys are its prefix
/// positions then its path slots, split at the same key indices as paged
/// attention's. std::invalid_argument for a bf16 cache.
AttentionPlan fork_attention_plan(const ForkAttentionParams& params);

/// Computes units [begin, end) of plan.num_units(num_kv_heads) (as
/// paged_attention_units); then attention_combine where plan.needs_combine.
void fork_attention_units(const ForkAttentionParams& params, AttentionPlan& plan, int64_t begin, int64_t end);

/// All branches, split over the pool. Kept for the GPU tree; the runtime
/// does not call it yet (its draft tree decodes branches as paged paths).
void fork_attention(const ForkAttentionParams& params, ThreadPool& pool);

}  // namespace ssd::kernels
