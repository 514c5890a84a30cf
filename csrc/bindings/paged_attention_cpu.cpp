// torch.ops.ssd.paged_attention on CPU: checks, then the batch-invariant
// kernel of kernels/cpu/paged_attention.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/paged_attention.h"
#include "attention_glue.h"

namespace ssd {
namespace {

void paged_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_of_token,
                         const at::Tensor& positions, double scale, const at::Tensor& out, int64_t window) {
  attention::check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, out, window);
  const int64_t keys = attention::check_paged_attention_indices(k_cache, block_tables, seq_of_token, positions, window);
  const kernels::PagedAttentionParams params =
      attention::paged_params(q, k_cache, v_cache, block_tables, seq_of_token, positions, scale, out, window);
  kernels::AttentionPlan plan = kernels::paged_attention_plan(params);
  attention::run_op_units(plan, params, keys, [&](kernels::AttentionPlan& pl, int64_t begin, int64_t end) {
    kernels::paged_attention_units(params, pl, begin, end);
  });
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("paged_attention", &ssd::paged_attention_cpu); }
