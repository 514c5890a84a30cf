// kv_truncate on NVIDIA GPUs. Reading the status back is one device sync per
// call: the op reports an invalid request as an error, like the CPU op.
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/kv_truncate.h"
#include "kv_truncate_args.h"

namespace ssd::bindings {
namespace {

void kv_truncate_cuda(at::Tensor& block_tables, at::Tensor& seq_lens, at::Tensor& block_refcount,
                      const at::Tensor& seq_ids, const at::Tensor& new_lens, int64_t block_size) {
  const c10::cuda::CUDAGuard guard(block_tables.device());
  const KvTruncateCall call =
      prepare_kv_truncate(block_tables, seq_lens, block_refcount, seq_ids, new_lens, block_size);
  at::Tensor status = at::empty({4}, block_tables.options().dtype(at::kLong));
  const kernels::cuda::KvTruncateParams params{call.params, status.data_ptr<int64_t>()};
  C10_CUDA_CHECK(kernels::cuda::kv_truncate(params, at::cuda::getCurrentCUDAStream()));
  const at::Tensor host = status.cpu();
  const int64_t* s = host.const_data_ptr<int64_t>();
  check_kv_truncate_status({static_cast<kernels::KvTruncateError>(s[0]), s[1], s[2], s[3]});
}

}  // namespace
}  // namespace ssd::bindings

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("kv_truncate", &ssd::bindings::kv_truncate_cuda); }

#endif  // SSD_WITH_CUDA
