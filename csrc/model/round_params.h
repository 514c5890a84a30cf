#pragma once
// The round's kernel parameters filled from tensors, one place for every backend,
// through the bindings' own fillers (bindings/*_args.h, verify_checks.h):
// backend.cpp passes host tensors to the CPU kernels, backend_cuda.cpp device
// tensors to the CUDA twins. Shapes as in VerifyBatch (backend.h); every tensor
// given here is contiguous and lives on the device the kernel runs on.

#include <ATen/ATen.h>

#include "../bindings/gumbel_sample_args.h"
#include "../bindings/saguaro_sample_args.h"
#include "../bindings/verify_checks.h"
#include "backend.h"

namespace ssd::model {

/// accepted, bonus: [B] i64, written by the kernel. The bindings' own filler
/// (bindings/verify_checks.h) over the batch's tensors.
inline kernels::VerifyParams verify_params(const VerifyBatch& v, const at::Tensor& accepted, const at::Tensor& bonus) {
  const VerifyDims d{v.target_logits.size(0), v.proposals.size(1), v.target_logits.size(2)};
  const VerifyInputs in{v.target_logits, v.proposals,     v.num_proposals, v.q_probs,         v.one_hot,
                        v.temperature,   v.top_k,         v.top_p,         v.accept_uniforms, v.bonus_uniforms};
  return ssd::verify_params(d, in, accepted, bonus);
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
