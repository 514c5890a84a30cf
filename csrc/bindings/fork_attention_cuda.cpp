// torch.ops.ssd.fork_attention on CUDA: the same checks as on CPU except the
// index values (that would need a device sync), then the kernel of
// kernels/cuda/fork_attention.cu on the current stream.
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../kernels/cuda/fork_attention.h"
#include "../kernels/key_splits.h"
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
  attention::fill_cache_params(p, q, k_cache, v_cache, block_tables, scale, out);
  p.num_branches = q.size(0);
  p.branch_seq = branch_seq.data_ptr<int32_t>();
  p.prefix_len = prefix_len.data_ptr<int32_t>();
  p.path_k = path_k.data_ptr<float>();
  p.path_v = path_v.data_ptr<float>();
  p.max_path = path_k.size(1);
  p.path_len = path_len.data_ptr<int32_t>();
  // The most splits any branch's keys span (a sync: this op is for tests).
  const at::Tensor keys = (prefix_len.to(at::kLong) + path_len.to(at::kLong)).to(at::kCPU);
  const int64_t max_keys = keys.numel() > 0 ? keys.max().item<int64_t>() : 0;
  const std::vector<at::Tensor> workspace =
      attention::split_workspace(p, p.num_branches, std::max<int64_t>(1, kernels::key_splits(0, max_keys)), q.options());
  const cudaError_t err = kernels::cuda::fork_attention(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fork_attention CUDA kernel: ", cudaGetErrorString(err));
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("fork_attention", &ssd::fork_attention_cuda); }

#endif  // SSD_WITH_CUDA
