// torch.ops.ssd.fork_attention on CUDA: the same checks as on CPU except the
// index values (that would need a device sync), then the kernel of
// kernels/cuda/fork_attention.cu on the current stream.
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/fork_attention.h"
#include "attention_glue.h"

namespace ssd {
namespace {

void fork_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& branch_seq, const at::Tensor& prefix_len,
                         const at::Tensor& path_k, const at::Tensor& path_v, const at::Tensor& path_len,
                         double scale, const at::Tensor& out) {
  attention::check_fork_args(q, k_cache, v_cache, block_tables, branch_seq, prefix_len, path_k, path_v, path_len, out);
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "fork_attention on CUDA supports head_dim 64 and 128, got ",
              q.size(2));
  const c10::cuda::CUDAGuard guard(q.device());
  kernels::cuda::ForkAttentionParams p;
  p.q = q.data_ptr<float>();
  p.ldq = q.stride(0);
  p.out = out.data_ptr<float>();
  p.ldo = out.stride(0);
  p.k_cache = k_cache.data_ptr<float>();
  p.v_cache = v_cache.data_ptr<float>();
  p.num_branches = q.size(0);
  p.num_heads = q.size(1);
  p.num_kv_heads = k_cache.size(2);
  p.head_dim = q.size(2);
  p.block_size = k_cache.size(1);
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.max_blocks = block_tables.size(1);
  p.branch_seq = branch_seq.data_ptr<int32_t>();
  p.prefix_len = prefix_len.data_ptr<int32_t>();
  p.path_k = path_k.data_ptr<float>();
  p.path_v = path_v.data_ptr<float>();
  p.max_path = path_k.size(1);
  p.path_len = path_len.data_ptr<int32_t>();
  p.scale = static_cast<float>(scale);
  const cudaError_t err = kernels::cuda::fork_attention(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fork_attention CUDA kernel: ", cudaGetErrorString(err));
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("fork_attention", &ssd::fork_attention_cuda); }

#endif  // SSD_WITH_CUDA
