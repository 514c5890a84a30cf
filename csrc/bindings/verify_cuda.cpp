// CUDA implementation of ssd::verify (schema in ops.cpp).
#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "../kernels/cuda/verify.h"
#include "verify_checks.h"

namespace ssd {
namespace {

// Values (proposal ids, num_proposals, sampling settings) are not checked here:
// reading them would synchronise the stream. The kernel clamps num_proposals
// and rejects out-of-vocabulary proposals.
std::tuple<at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits, const at::Tensor& proposals, const at::Tensor& num_proposals,
    const at::Tensor& q_probs, const at::Tensor& one_hot, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& accept_uniforms,
    const at::Tensor& bonus_uniforms) {
  const VerifyDims d = check_verify_args(target_logits, proposals, num_proposals, q_probs, one_hot,
                                         temperature, top_k, top_p, accept_uniforms,
                                         bonus_uniforms);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const VerifyInputs in = contiguous_verify_inputs(target_logits, proposals, num_proposals, q_probs,
                                                   one_hot, temperature, top_k, top_p,
                                                   accept_uniforms, bonus_uniforms);
  at::Tensor accepted = at::empty({d.batch}, proposals.options());
  at::Tensor bonus = at::empty({d.batch}, proposals.options());
  at::Tensor workspace = at::empty(
      {static_cast<int64_t>(kernels::cuda::verify_workspace_bytes(d.batch, d.k))},
      target_logits.options().dtype(at::kByte));
  const kernels::VerifyParams p = verify_params(d, in, accepted, bonus);
  const cudaError_t err = kernels::cuda::verify(p, workspace.data_ptr(), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "verify: CUDA launch failed: ", cudaGetErrorString(err));
  return {accepted, bonus};
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CUDA, m) { m.impl("verify", &ssd::verify_cuda); }

#endif  // SSD_WITH_CUDA
