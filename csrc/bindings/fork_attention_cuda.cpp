// torch.ops.ssd.fork_attention on CUDA: the same checks as on CPU except the
// index values (that would need a device sync), then the kernel of
// kernels/cuda/fork_attention.cu on the current stream.
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "../kernels/cuda/fork_attention.h"
#include "attention_glue.h"

namespace ssd {
namespace {

void fork_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_of_token, const at::Tensor& positions,
                         const at::Tensor& prefix_seq, const at::Tensor& prefix_len, double scale,
                         const at::Tensor& out, int64_t window) {
  attention::check_fork_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, prefix_seq, prefix_len, out,
                             window);
  const c10::cuda::CUDAGuard guard(q.device());
  kernels::cuda::ForkAttentionParams p;
  const std::vector<at::Tensor> workspace = attention::fill_paged_params(p.paged, q, k_cache, v_cache, block_tables,
                                                                         seq_of_token, positions, scale, out, window);
  p.prefix_seq = prefix_seq.data_ptr<int32_t>();
  p.prefix_len = prefix_len.data_ptr<int32_t>();
  const cudaError_t err = kernels::cuda::fork_attention(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fork_attention CUDA kernel: ", cudaGetErrorString(err));
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("fork_attention", &ssd::fork_attention_cuda); }

#endif  // SSD_WITH_CUDA
