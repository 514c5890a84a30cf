// torch.ops.ssd.paged_attention on CUDA: the same checks as on CPU except the
// index values (that would need a device sync), then the kernel of
// kernels/cuda/paged_attention.cu on the current stream.
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "../kernels/cuda/paged_attention.h"
#include "../kernels/key_splits.h"
#include "attention_glue.h"

namespace ssd {
namespace {

void paged_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const at::Tensor& seq_of_token,
                          const at::Tensor& positions, double scale, const at::Tensor& out, int64_t window) {
  attention::check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, out);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: no sliding window), got ", window);
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "paged_attention on CUDA supports head_dim 64 and 128, got ",
              q.size(2));
  const c10::cuda::CUDAGuard guard(q.device());
  kernels::cuda::PagedAttentionParams p;
  attention::fill_cache_params(p, q, k_cache, v_cache, block_tables, scale, out);
  p.kv_bf16 = k_cache.scalar_type() == at::kBFloat16;
  p.num_tokens = q.size(0);
  p.seq_of_token = seq_of_token.data_ptr<int32_t>();
  p.positions = positions.data_ptr<int32_t>();
  p.window = window;
  // The most splits of the key range any query spans (a sync: this op is
  // for tests; the model backend knows the positions on the host).
  const at::Tensor last = positions.to(at::kCPU);
  const std::vector<at::Tensor> workspace = attention::split_workspace(
      p, p.num_tokens, kernels::max_key_splits(last.data_ptr<int32_t>(), last.size(0), window), q.options());
  const cudaError_t err = kernels::cuda::paged_attention(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "paged_attention CUDA kernel: ", cudaGetErrorString(err));
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("paged_attention", &ssd::paged_attention_cuda); }

#endif  // SSD_WITH_CUDA
