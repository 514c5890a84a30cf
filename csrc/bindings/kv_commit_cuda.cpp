// kv_commit on NVIDIA GPUs. Reading the status back is one device sync per
// call: the op reports a bad index as an error, like the CPU op.
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/kv_commit.h"
#include "kv_commit_args.h"

namespace ssd::bindings {
namespace {

void kv_commit_cuda(at::Tensor& cache, const at::Tensor& tree, const at::Tensor& src_slots,
                    const at::Tensor& dst_slots) {
  const c10::cuda::CUDAGuard guard(cache.device());
  const KvCommitCall call = prepare_kv_commit(cache, tree, src_slots, dst_slots);
  const kernels::KvCommitParams& p = call.params;
  const at::Tensor staging = p.tree_in_cache
      ? at::empty({p.num_layers, 2, p.n, cache.size(3) * cache.size(4)}, cache.options())
      : at::Tensor();
  at::Tensor status = at::empty({4}, cache.options().dtype(at::kLong));
  const kernels::cuda::KvCommitParams params{p, staging.defined() ? staging.data_ptr() : nullptr,
                                             status.data_ptr<int64_t>()};
  C10_CUDA_CHECK(kernels::cuda::kv_commit(params, at::cuda::getCurrentCUDAStream()));
  const at::Tensor host = status.cpu();
  const int64_t* s = host.const_data_ptr<int64_t>();
  check_kv_commit_status({static_cast<kernels::KvCommitError>(s[0]), s[1], s[2], s[3]});
}

}  // namespace
}  // namespace ssd::bindings

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("kv_commit", &ssd::bindings::kv_commit_cuda); }

#endif  // SSD_WITH_CUDA
