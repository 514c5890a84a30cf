#include "fork_attention.h"

#include "isa.h"

namespace ssd::kernels {

std::vector<RowRun> fork_attention_runs(const ForkAttentionParams& p) {
  return same_sequence_runs(p.branch_seq, p.num_branches, kMaxSharedBranches);
}

void fork_attention_units(const ForkAttentionParams& p, const std::vector<RowRun>& runs, int64_t begin,
                          int64_t end) {
  SSD_ON_ACTIVE_ISA(fork_attention_units(p, runs, begin, end))
}

void fork_attention(const ForkAttentionParams& params, ThreadPool& pool) {
  const std::vector<RowRun> runs = fork_attention_runs(params);
  pool.parallel_for(static_cast<int64_t>(runs.size()) * params.kv.num_kv_heads, 1,
                    [&](int64_t begin, int64_t end) { fork_attention_units(params, runs, begin, end); });
}

}  // namespace ssd::kernels
