// torch.ops.ssd.paged_attention on CPU: checks, then the batch-invariant
// kernel of kernels/cpu/paged_attention.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/paged_attention.h"
#include "attention_glue.h"

namespace ssd {
namespace {

// Checks the index arguments; returns the number of attended keys summed
// over tokens.
int64_t check_paged_attention_indices(const at::Tensor& k_cache, const at::Tensor& block_tables,
                                      const at::Tensor& seq_of_token, const at::Tensor& positions,
                                      int64_t window) {
  const int32_t* pos = positions.data_ptr<int32_t>();
  std::vector<int64_t> last(static_cast<size_t>(positions.size(0)));
  int64_t keys = 0;
  for (int64_t t = 0; t < positions.size(0); ++t) {
    TORCH_CHECK(pos[t] >= 0, "positions[", t, "] = ", pos[t], " is negative");
    last[t] = pos[t];
    keys += window > 0 ? std::min<int64_t>(int64_t{pos[t]} + 1, window) : int64_t{pos[t]} + 1;
  }
  const auto max_position =
      attention::max_position_per_seq(seq_of_token, "seq_of_token", last, block_tables.size(0));
  attention::check_paged_indices(block_tables, max_position, k_cache.size(0), k_cache.size(1));
  return keys;
}

void paged_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_of_token,
                         const at::Tensor& positions, double scale, const at::Tensor& out, int64_t window) {
  attention::check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, out);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: no sliding window), got ", window);
  const int64_t keys = check_paged_attention_indices(k_cache, block_tables, seq_of_token, positions, window);
  const kernels::PagedAttentionParams params{
      attention::paged_kv(k_cache, v_cache),
      q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(), out.stride(0), q.size(0), q.size(1),
      seq_of_token.data_ptr<int32_t>(), positions.data_ptr<int32_t>(), block_tables.data_ptr<int32_t>(),
      block_tables.size(1), static_cast<float>(scale), window};
  kernels::AttentionPlan plan = kernels::paged_attention_plan(params);
  kernels::run_attention(
      plan, k_cache.size(2), q.size(0), params.out, params.ldo, params.num_heads, params.kv.head_dim,
      [&](int64_t count, const auto& fn) { attention::run_units(count, keys * q.size(1) * q.size(2), fn); },
      [&](kernels::AttentionPlan& pl, int64_t begin, int64_t end) {
        kernels::paged_attention_units(params, pl, begin, end);
      });
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("paged_attention", &ssd::paged_attention_cpu); }
