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
#include "attention_glue.h"

namespace ssd {
namespace {

void paged_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const at::Tensor& seq_of_token,
                          const at::Tensor& positions, double scale, const at::Tensor& out, int64_t window) {
  attention::check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, out, window);
  const c10::cuda::CUDAGuard guard(q.device());
  kernels::cuda::PagedAttentionParams p;
  const std::vector<at::Tensor> workspace =
      attention::fill_paged_params(p, q, k_cache, v_cache, block_tables, seq_of_token, positions, scale, out, window);
  const cudaError_t err = kernels::cuda::paged_attention(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "paged_attention CUDA kernel: ", cudaGetErrorString(err));
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("paged_attention", &ssd::paged_attention_cuda); }

#endif  // SSD_WITH_CUDA
