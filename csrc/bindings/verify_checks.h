// Shape, dtype and device checks of ssd::verify, shared by its CPU, Meta and
// CUDA implementations so every backend rejects the same calls, and the one
// place the kernel params are filled from tensors.
#pragma once

#include <ATen/ATen.h>

#include "../kernels/cpu/verify.h"

namespace ssd {

struct VerifyDims {
  int64_t batch;
  int64_t k;
  int64_t vocab;
};

inline void check_verify_arg(const at::Tensor& t, const char* name, at::ScalarType dtype,
                             at::IntArrayRef sizes, const at::Device& device) {
  TORCH_CHECK(t.scalar_type() == dtype, "verify: ", name, " must be ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK(t.sizes() == sizes, "verify: ", name, " must have shape ", sizes, ", got ",
              t.sizes());
  TORCH_CHECK(t.device() == device, "verify: ", name, " must be on ", device,
              " like target_logits, got ", t.device());
}

inline VerifyDims check_verify_args(const at::Tensor& target_logits, const at::Tensor& proposals,
                                    const at::Tensor& num_proposals, const at::Tensor& q_probs,
                                    const at::Tensor& one_hot, const at::Tensor& temperature,
                                    const at::Tensor& top_k, const at::Tensor& top_p,
                                    const at::Tensor& accept_uniforms,
                                    const at::Tensor& bonus_uniforms) {
  TORCH_CHECK(target_logits.dim() == 3 && target_logits.size(1) >= 1 && target_logits.size(2) >= 1,
              "verify: target_logits must be [B, K+1, V] with K >= 0 and V >= 1, got ",
              target_logits.sizes());
  const VerifyDims d{target_logits.size(0), target_logits.size(1) - 1, target_logits.size(2)};
  const at::Device dev = target_logits.device();
  check_verify_arg(target_logits, "target_logits", at::kFloat, target_logits.sizes(), dev);
  check_verify_arg(proposals, "proposals", at::kLong, {d.batch, d.k}, dev);
  check_verify_arg(num_proposals, "num_proposals", at::kLong, {d.batch}, dev);
  check_verify_arg(q_probs, "q_probs", at::kFloat, {d.batch, d.k, d.vocab}, dev);
  check_verify_arg(one_hot, "one_hot", at::kBool, {d.batch}, dev);
  check_verify_arg(temperature, "temperature", at::kDouble, {d.batch}, dev);
  check_verify_arg(top_k, "top_k", at::kLong, {d.batch}, dev);
  check_verify_arg(top_p, "top_p", at::kDouble, {d.batch}, dev);
  check_verify_arg(accept_uniforms, "accept_uniforms", at::kDouble, {d.batch, d.k}, dev);
  check_verify_arg(bonus_uniforms, "bonus_uniforms", at::kDouble, {d.batch}, dev);
  return d;
}

/// Contiguous inputs of one verify call; they own the memory the params point to.
struct VerifyInputs {
  at::Tensor logits, proposals, num_proposals, q_probs, one_hot, temperature, top_k, top_p,
      accept_uniforms, bonus_uniforms;
};

inline VerifyInputs contiguous_verify_inputs(
    const at::Tensor& target_logits, const at::Tensor& proposals, const at::Tensor& num_proposals,
    const at::Tensor& q_probs, const at::Tensor& one_hot, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& accept_uniforms,
    const at::Tensor& bonus_uniforms) {
  return {target_logits.contiguous(), proposals.contiguous(), num_proposals.contiguous(),
          q_probs.contiguous(),       one_hot.contiguous(),   temperature.contiguous(),
          top_k.contiguous(),         top_p.contiguous(),     accept_uniforms.contiguous(),
          bonus_uniforms.contiguous()};
}

/// Params over `in` (host or device pointers alike), writing accepted / bonus [B].
/// An undefined q_probs (no row reads it: the engine's round) gives a null pointer.
inline kernels::VerifyParams verify_params(const VerifyDims& d, const VerifyInputs& in,
                                           const at::Tensor& accepted, const at::Tensor& bonus) {
  kernels::VerifyParams p;
  p.target_logits = in.logits.data_ptr<float>();
  p.proposals = in.proposals.data_ptr<int64_t>();
  p.num_proposals = in.num_proposals.data_ptr<int64_t>();
  p.q_probs = in.q_probs.defined() ? in.q_probs.data_ptr<float>() : nullptr;
  p.one_hot = in.one_hot.data_ptr<bool>();
  p.temperature = in.temperature.data_ptr<double>();
  p.top_k = in.top_k.data_ptr<int64_t>();
  p.top_p = in.top_p.data_ptr<double>();
  p.accept_uniforms = in.accept_uniforms.data_ptr<double>();
  p.bonus_uniforms = in.bonus_uniforms.data_ptr<double>();
  p.accepted = accepted.data_ptr<int64_t>();
  p.bonus = bonus.data_ptr<int64_t>();
  p.batch = d.batch;
  p.k = d.k;
  p.vocab = d.vocab;
  return p;
}

}  // namespace ssd
