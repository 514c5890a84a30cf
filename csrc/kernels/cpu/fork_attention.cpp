#include "fork_attention.h"

#include <stdexcept>

#include "isa.h"

namespace ssd::kernels {

AttentionPlan fork_attention_plan(const ForkAttentionParams& p) {
  if (p.kv.bf16()) throw std::invalid_argument("fork_attention reads fp32 KV caches only");
  std::vector<int64_t> first(static_cast<size_t>(p.num_branches), 0), end(first);
  for (int64_t n = 0; n < p.num_branches; ++n) end[n] = int64_t{p.prefix_len[n]} + p.path_len[n];
  return attention_plan(same_sequence_runs(p.branch_seq, p.num_branches, kMaxSharedBranches), first, end,
                        p.num_heads, p.kv.head_dim);
}

void fork_attention_units(const ForkAttentionParams& p, AttentionPlan& plan, int64_t begin, int64_t end) {
  SSD_ON_ACTIVE_ISA(fork_attention_units(p, plan, begin, end))
}

void fork_attention(const ForkAttentionParams& params, ThreadPool& pool) {
  AttentionPlan plan = fork_attention_plan(params);
  run_attention(
      plan, params.kv.num_kv_heads, params.num_branches, params.out, params.ldo, params.num_heads,
      params.kv.head_dim, [&](int64_t count, const auto& fn) { pool.parallel_for(count, 1, fn); },
      [&](AttentionPlan& pl, int64_t begin, int64_t end) { fork_attention_units(params, pl, begin, end); });
}

}  // namespace ssd::kernels
