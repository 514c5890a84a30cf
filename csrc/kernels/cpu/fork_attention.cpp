#include "fork_attention.h"

#include "isa.h"

namespace ssd::kernels {

AttentionPlan fork_attention_plan(const ForkAttentionParams& p) {
  return attention_plan_over(p.paged, same_sequence_runs(p.prefix_seq, p.paged.tokens, kMaxSharedBranches));
}

void fork_attention_units(const ForkAttentionParams& p, AttentionPlan& plan, int64_t begin, int64_t end) {
  SSD_ON_ACTIVE_ISA(fork_attention_units(p, plan, begin, end))
}

void fork_attention(const ForkAttentionParams& params, ThreadPool& pool) {
  const PagedAttentionParams& g = params.paged;
  AttentionPlan plan = fork_attention_plan(params);
  run_attention(
      plan, g.kv.num_kv_heads, g.tokens, g.out, g.ldo, g.num_heads, g.kv.head_dim,
      [&](int64_t count, const auto& fn) { pool.parallel_for(count, 1, fn); },
      [&](AttentionPlan& pl, int64_t b, int64_t e) { fork_attention_units(params, pl, b, e); });
}

}  // namespace ssd::kernels
