#pragma once
// The round's kernel parameters filled from tensors, one place for every backend
// (gumbel_sample's are the bindings' own, bindings/gumbel_sample_args.h):
// backend.cpp passes host tensors to the CPU kernels, backend_cuda.cpp device
// tensors to the CUDA twins. Shapes as in VerifyBatch (backend.h); every tensor
// given here is contiguous and lives on the device the kernel runs on.

#include <ATen/ATen.h>

#include "../bindings/gumbel_sample_args.h"
#include "../bindings/saguaro_sample_args.h"
#include "../kernels/cpu/verify.h"
#include "backend.h"

namespace ssd::model {

/// accepted, bonus: [B] i64, written by the kernel.
inline kernels::VerifyParams verify_params(const VerifyBatch& v, const at::Tensor& accepted, const at::Tensor& bonus) {
  kernels::VerifyParams p;
  p.target_logits = v.target_logits.data_ptr<float>();
  p.proposals = v.proposals.data_ptr<int64_t>();
  p.num_proposals = v.num_proposals.data_ptr<int64_t>();
  p.q_probs = v.q_probs.defined() ? v.q_probs.data_ptr<float>() : nullptr;
  p.one_hot = v.one_hot.data_ptr<bool>();
  p.temperature = v.temperature.data_ptr<double>();
  p.top_k = v.top_k.data_ptr<int64_t>();
  p.top_p = v.top_p.data_ptr<double>();
  p.accept_uniforms = v.accept_uniforms.data_ptr<double>();
  p.bonus_uniforms = v.bonus_uniforms.data_ptr<double>();
  p.accepted = accepted.data_ptr<int64_t>();
  p.bonus = bonus.data_ptr<int64_t>();
  p.batch = v.target_logits.size(0);
  p.k = v.proposals.size(1);
  p.vocab = v.target_logits.size(2);
  return p;
}

/// The tensors of one saguaro_sample call (Backend::saguaro_sample): logits,
/// probs [rows, V] f32; temperature, top_p, downweight, uniforms [rows] f64;
/// top_k, fanout, tokens [rows] i64. probs and tokens are allocated here.
struct SaguaroSampleCall {
  at::Tensor logits, temperature, top_k, top_p, fanout, downweight, uniforms;
  at::Tensor probs, tokens;

  SaguaroSampleCall(const at::Tensor& x, const at::Tensor& t, const at::Tensor& k, const at::Tensor& p,
                    const at::Tensor& f, const at::Tensor& c, const at::Tensor& u)
      : logits(x), temperature(t), top_k(k), top_p(p), fanout(f), downweight(c), uniforms(u) {
    probs = at::empty_like(x);
    tokens = at::empty({x.size(0)}, k.options());
  }

  kernels::SaguaroSampleParams params() {
    return bindings::saguaro_sample_params(logits, temperature, top_k, top_p, fanout, downweight, uniforms, probs,
                                           tokens);
  }
};

}  // namespace ssd::model
