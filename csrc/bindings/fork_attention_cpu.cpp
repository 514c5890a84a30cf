// torch.ops.ssd.fork_attention on CPU: paged attention's checks and those of
// the fork, then kernels/cpu/fork_attention.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/fork_attention.h"
#include "attention_glue.h"

namespace ssd {
namespace {

// Every row forks at 0..positions[t] from a row of block_tables whose blocks
// cover its prefix.
void check_fork_indices(const at::Tensor& k_cache, const at::Tensor& block_tables, const at::Tensor& positions,
                        const at::Tensor& prefix_seq, const at::Tensor& prefix_len) {
  const int32_t* pos = positions.data_ptr<int32_t>();
  const int32_t* prefix = prefix_len.data_ptr<int32_t>();
  std::vector<int64_t> last(static_cast<size_t>(prefix_len.size(0)));
  for (int64_t t = 0; t < prefix_len.size(0); ++t) {
    TORCH_CHECK(prefix[t] >= 0 && prefix[t] <= pos[t], "prefix_len[", t, "] = ", prefix[t],
                " is not in 0..positions[", t, "] = ", pos[t]);
    last[t] = int64_t{prefix[t]} - 1;
  }
  const auto max_position = attention::max_position_per_seq(prefix_seq, "prefix_seq", last, block_tables.size(0));
  attention::check_paged_indices(block_tables, max_position, k_cache.size(0), k_cache.size(1));
}

void fork_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& seq_of_token, const at::Tensor& positions,
                        const at::Tensor& prefix_seq, const at::Tensor& prefix_len, double scale,
                        const at::Tensor& out, int64_t window) {
  attention::check_fork_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, prefix_seq, prefix_len, out,
                             window);
  const int64_t keys = attention::check_paged_attention_indices(k_cache, block_tables, seq_of_token, positions, window);
  check_fork_indices(k_cache, block_tables, positions, prefix_seq, prefix_len);
  const kernels::ForkAttentionParams params{attention::paged_params(q, k_cache, v_cache, block_tables, seq_of_token,
                                                                    positions, scale, out, window),
                                            prefix_seq.data_ptr<int32_t>(), prefix_len.data_ptr<int32_t>()};
  kernels::AttentionPlan plan = kernels::fork_attention_plan(params);
  attention::run_op_units(plan, params.paged, keys, [&](kernels::AttentionPlan& pl, int64_t begin, int64_t end) {
    kernels::fork_attention_units(params, pl, begin, end);
  });
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("fork_attention", &ssd::fork_attention_cpu); }
