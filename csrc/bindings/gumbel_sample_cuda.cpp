// CUDA glue of torch.ops.ssd.gumbel_sample (schema in ops.cpp).
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/gumbel_sample.h"
#include "gumbel_sample_args.h"

namespace ssd::bindings {

namespace {

at::Tensor gumbel_sample_cuda(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& positions) {
  check_gumbel_sample_layout(probs, seeds, positions);
  const c10::cuda::CUDAGuard guard(probs.device());
  check_gumbel_sample_values(probs, positions);
  const at::Tensor p = probs.contiguous(), s = seeds.contiguous(), q = positions.contiguous();
  at::Tensor tokens = at::empty({probs.size(0)}, probs.options().dtype(at::kLong));
  const cudaError_t err =
      kernels::cuda::gumbel_sample(gumbel_sample_params(p, s, q, tokens), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "gumbel_sample: CUDA launch failed: ", cudaGetErrorString(err));
  return tokens;
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("gumbel_sample", &gumbel_sample_cuda); }

}  // namespace ssd::bindings

#endif  // SSD_WITH_CUDA
