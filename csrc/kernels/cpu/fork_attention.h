// Fork attention: the queries of a speculation tree's branches. A branch
// forks from its sequence at position prefix_len: its query row t reads the
// keys below prefix_len[t] through the block table of the sequence it forks
// from (prefix_seq[t]) and the keys from prefix_len[t] to its position
// through its own table (seq_of_token[t]), which holds its path. So a branch
// shares the sequence's pages, the partial block at the fork included, and
// never copies them. Key i is position i in either case: the key order and
// the splits are paged attention's, and the result is bitwise paged
// attention's over a table whose slots below prefix_len hold the sequence's
// values. Rows forking from one sequence share the pass over its prefix.
#pragma once

#include <cstdint>

#include "attention_splits.h"
#include "paged_attention.h"
#include "thread_pool.h"

namespace ssd::kernels {

struct ForkAttentionParams {
  /// The rows, their own tables and positions, the window: as paged
  /// attention's (a row whose own entry at its position is -1 is padding).
  PagedAttentionParams paged;
  const int32_t* prefix_seq = nullptr;  ///< [tokens] block table row each row forks from
  const int32_t* prefix_len = nullptr;  ///< [tokens] in 0..positions[t]; 0: the row does not fork
};

/// Branches that share a pass over their prefix: runs of consecutive rows
/// forking from one sequence, at most this many.
constexpr int64_t kMaxSharedBranches = 16;

/// The runs (of at most kMaxSharedBranches rows), pieces and partial rows of
/// a call (attention_splits.h; host work, no attention).
AttentionPlan fork_attention_plan(const ForkAttentionParams& params);

/// Computes units [begin, end) of plan.num_units(num_kv_heads) (as
/// paged_attention_units); then attention_combine where plan.needs_combine.
void fork_attention_units(const ForkAttentionParams& params, AttentionPlan& plan, int64_t begin, int64_t end);

/// Every row, split over the pool.
void fork_attention(const ForkAttentionParams& params, ThreadPool& pool);

}  // namespace ssd::kernels
