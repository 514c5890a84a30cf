// CUDA glue of torch.ops.ssd.fork_select (schema in ops.cpp).
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../kernels/cuda/fork_select.h"
#include "fork_select_args.h"

namespace ssd::bindings {

namespace {

std::tuple<at::Tensor, at::Tensor> fork_select_cuda(const at::Tensor& probs, const at::Tensor& drafted,
                                                    const at::Tensor& fanout, int64_t max_fanout) {
  check_fork_select_layout(probs, drafted, fanout, max_fanout);
  const c10::cuda::CUDAGuard guard(probs.device());
  check_fork_select_values(probs, drafted, fanout, max_fanout);
  const at::Tensor p = probs.contiguous(), d = drafted.contiguous(), f = fanout.contiguous();
  auto [candidates, counts] = fork_select_outputs(probs, max_fanout);
  const cudaError_t err = kernels::cuda::fork_select(
      fork_select_params(p, d, f, max_fanout, candidates, counts), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fork_select: CUDA launch failed: ", cudaGetErrorString(err));
  return {candidates, counts};
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("fork_select", &fork_select_cuda); }

}  // namespace ssd::bindings

#endif  // SSD_WITH_CUDA
