// CUDA glue of torch.ops.ssd.saguaro_sample (schema in ops.cpp).
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/saguaro_sample.h"
#include "saguaro_sample_args.h"

namespace ssd::bindings {

namespace {

at::Tensor saguaro_sample_cuda(const at::Tensor& logits, const at::Tensor& temperature,
                               const at::Tensor& top_k, const at::Tensor& top_p,
                               const at::Tensor& fanout, const at::Tensor& downweight,
                               const at::Tensor& uniforms, at::Tensor& probs) {
  check_saguaro_sample_layout(logits, temperature, top_k, top_p, fanout, downweight, uniforms, probs);
  const c10::cuda::CUDAGuard guard(logits.device());
  check_saguaro_sample_values(temperature, top_k, top_p, fanout, downweight, uniforms);
  const at::Tensor l = logits.contiguous(), t = temperature.contiguous(), k = top_k.contiguous(),
                   p = top_p.contiguous(), f = fanout.contiguous(), c = downweight.contiguous(),
                   u = uniforms.contiguous();
  at::Tensor tokens = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  const cudaError_t err = kernels::cuda::saguaro_sample(
      saguaro_sample_params(l, t, k, p, f, c, u, probs, tokens), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "saguaro_sample: CUDA launch failed: ", cudaGetErrorString(err));
  return tokens;
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("saguaro_sample", &saguaro_sample_cuda); }

}  // namespace ssd::bindings

#endif  // SSD_WITH_CUDA
