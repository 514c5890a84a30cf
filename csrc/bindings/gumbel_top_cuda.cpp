// CUDA glue of torch.ops.ssd.gumbel_top (schema in ops.cpp).
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/gumbel_top.h"
#include "gumbel_top_args.h"

namespace ssd::bindings {

namespace {

static_assert(kGumbelTopMaxDepth == kernels::cuda::kGumbelTopMaxDepth, "one depth limit");

std::tuple<at::Tensor, at::Tensor> gumbel_top_cuda(const at::Tensor& probs, const at::Tensor& seeds,
                                                   const at::Tensor& positions, int64_t depth) {
  check_gumbel_top_layout(probs, seeds, positions, depth);
  const c10::cuda::CUDAGuard guard(probs.device());
  check_gumbel_sample_values(probs, positions, "gumbel_top");
  const at::Tensor p = probs.contiguous(), s = seeds.contiguous(), q = positions.contiguous();
  auto [ids, scores] = gumbel_top_outputs(probs, depth);
  const cudaError_t err = kernels::cuda::gumbel_top(gumbel_top_params(p, s, q, depth, ids, scores),
                                                    at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "gumbel_top: CUDA launch failed: ", cudaGetErrorString(err));
  return {ids, scores};
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("gumbel_top", &gumbel_top_cuda); }

}  // namespace ssd::bindings

#endif  // SSD_WITH_CUDA
