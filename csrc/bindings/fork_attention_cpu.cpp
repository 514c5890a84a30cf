// torch.ops.ssd.fork_attention on CPU: checks, then kernels/cpu/fork_attention.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/fork_attention.h"
#include "attention_glue.h"

namespace ssd {
namespace {

// Checks the index arguments; returns the number of attended keys summed
// over branches.
int64_t check_fork_indices(const at::Tensor& k_cache, const at::Tensor& block_tables, const at::Tensor& branch_seq,
                        const at::Tensor& prefix_len, const at::Tensor& path_len, int64_t max_path) {
  const int32_t* prefix = prefix_len.data_ptr<int32_t>();
  const int32_t* path = path_len.data_ptr<int32_t>();
  std::vector<int64_t> last(static_cast<size_t>(prefix_len.size(0)));
  int64_t keys = 0;
  for (int64_t n = 0; n < prefix_len.size(0); ++n) {
    TORCH_CHECK(prefix[n] >= 0, "prefix_len[", n, "] = ", prefix[n], " is negative");
    TORCH_CHECK(path[n] >= 1 && path[n] <= max_path, "path_len[", n, "] = ", path[n], " is not in 1..", max_path);
    last[n] = int64_t{prefix[n]} - 1;
    keys += int64_t{prefix[n]} + path[n];
  }
  const auto max_position = attention::max_position_per_seq(branch_seq, "branch_seq", last, block_tables.size(0));
  attention::check_paged_indices(block_tables, max_position, k_cache.size(0), k_cache.size(1));
  return keys;
}

void fork_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& branch_seq, const at::Tensor& prefix_len,
                        const at::Tensor& path_k, const at::Tensor& path_v, const at::Tensor& path_len, double scale,
                        const at::Tensor& out) {
  attention::check_fork_args(q, k_cache, v_cache, block_tables, branch_seq, prefix_len, path_k, path_v, path_len, out);
  const int64_t keys = check_fork_indices(k_cache, block_tables, branch_seq, prefix_len, path_len, path_k.size(1));
  const kernels::ForkAttentionParams params{
      {k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), k_cache.size(1), k_cache.size(2), k_cache.size(3)},
      q.data_ptr<float>(),
      q.stride(0),
      out.data_ptr<float>(),
      out.stride(0),
      q.size(0),
      q.size(1),
      block_tables.data_ptr<int32_t>(),
      block_tables.size(1),
      branch_seq.data_ptr<int32_t>(),
      prefix_len.data_ptr<int32_t>(),
      path_k.data_ptr<float>(),
      path_v.data_ptr<float>(),
      path_k.size(1),
      path_len.data_ptr<int32_t>(),
      static_cast<float>(scale)};
  kernels::AttentionPlan plan = kernels::fork_attention_plan(params);
  kernels::run_attention(
      plan, k_cache.size(2), q.size(0), params.out, params.ldo, params.num_heads, params.kv.head_dim,
      [&](int64_t count, const auto& fn) { attention::run_units(count, keys * q.size(1) * q.size(2), fn); },
      [&](kernels::AttentionPlan& pl, int64_t begin, int64_t end) {
        kernels::fork_attention_units(params, pl, begin, end);
      });
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("fork_attention", &ssd::fork_attention_cpu); }
